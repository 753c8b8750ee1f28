// Decode GEMV on AVX2: block-32 int8 activations x n16k8 int4 weights with per-group fp16
// scales, float out (linear_q8b32_s4_reference bit for bit). Each n16k8 block is two ymm halves
// (columns 0-7, 8-15). VPMADDUBSW(u, q) with codes u in [0, 15] and |q| <= 127: the low plus
// high nibble pair sums (4 products) are at most 7620, below the int16 saturation; VPMADDWD with
// ones widens to int32 exactly, then i_b = sum - z' * s_b. Compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/tile_driver.h"

namespace qforge::kernels::detail {

namespace {


struct Kernel {
  using Args = GemvQ8S4Args;
  static constexpr int kMaxRows = 2;
  static constexpr int kMaxBlocks = 1;

  template <int MR, int NR>
  static void tile(const GemvQ8S4Args& args, int64_t m0, int64_t nb) {
    static_assert(NR == 1, "one 16-column block per tile");
    const S4N16K8View& w = args.w;
    const int64_t octs = w.kp / kS4BlockK;
    const int64_t blocks_per_group = w.groups == 1 ? args.kb : w.group_size / (kOctsPerBlock * kS4BlockK);
    const TileOperands<MR, 1, uint8_t, int8_t> op(w.data, nb, octs * kS4BlockBytes, args.q, m0, args.ldq);
    __m256 t[MR][2];
    fill_tile(t, _mm256_setzero_ps());

    for (int64_t g = 0; g < w.groups; ++g) {
      __m256i zc[2];
      __m256 sc[2], u[MR][2];
      #pragma GCC unroll 16
      for (int h = 0; h < 2; ++h) {
        s4_group_meta(w, nb, g, h, zc[h], sc[h]);
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) u[r][h] = _mm256_setzero_ps();
      }
      const int64_t b_end = chunk_end(g, blocks_per_group, args.kb);
      for (int64_t b = g * blocks_per_group; b < b_end; ++b) {
        const int64_t o_end = chunk_end(b, kOctsPerBlock, octs);
        __m256i acc[MR][2];
        s4_dot_octs<MR>(op.w[0], op.a, b * kOctsPerBlock, o_end, acc);
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          const __m256i s = _mm256_set1_epi32(args.s[(m0 + r) * args.kb + b]);
          const __m256 d = _mm256_set1_ps(args.d[(m0 + r) * args.kb + b]);
          #pragma GCC unroll 16
          for (int h = 0; h < 2; ++h) {
            const __m256i i = _mm256_sub_epi32(acc[r][h], _mm256_mullo_epi32(zc[h], s));
            u[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), d, u[r][h]);
          }
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r)
        #pragma GCC unroll 16
        for (int h = 0; h < 2; ++h) t[r][h] = _mm256_fmadd_ps(u[r][h], sc[h], t[r][h]);
    }
    store_halves<MR, 1>(args.y, args.ldy, m0, nb, w.n, nullptr, args.bias,
                        [&](int r, int, int h, __m256, __m256 bias) { return _mm256_add_ps(t[r][h], bias); });
  }
};

}  // namespace

void gemv_q8s4f32_n16k8_avx2(const GemvQ8S4Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
