// Small-M int8 x int4 GEMM on AVX2 with per-group scales, float output (semantics of
// gemm_s8s4f32_reference). Each n16k8 block is two ymm halves (columns 0-7, 8-15).
// VPMADDUBSW(u, a) with codes u in [0, 15] and |a| <= 127: a pair is at most 2 * 15 * 127 =
// 3810, and the low-nibble plus high-nibble pair sums (4 products) at most 7620, far below the
// int16 saturation at 32767; VPMADDWD with ones then widens to int32 exactly.
// Group scales are fp16 (F16C's VCVTPH2PS widens them). Compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/tile_driver.h"

namespace qforge::kernels::detail {

namespace {

struct Kernel {
  using Args = GemvS4Args;
  static constexpr int kMaxRows = 2;
  static constexpr int kMaxBlocks = 1;

  template <int MR, int NR>
  static void tile(const GemvS4Args& args, int64_t m0, int64_t nb) {
    static_assert(NR == 1, "one 16-column block per tile");
    const S4N16K8View& w = args.w;
    const int64_t kblocks = w.kp / kS4BlockK;
    const int64_t blocks_per_group = w.group_size / kS4BlockK;
    const TileOperands<MR, 1, uint8_t, int8_t> op(w.data, nb, kblocks * kS4BlockBytes, args.a, m0, args.lda);

    __m256 t[MR][2];
    fill_tile(t, _mm256_setzero_ps());

    for (int64_t g = 0; g < w.groups; ++g) {
      const int64_t kb_end = chunk_end(g, blocks_per_group, kblocks);
      __m256i acc[MR][2];
      s4_dot_octs<MR>(op.w[0], op.a, g * blocks_per_group, kb_end, acc);
      #pragma GCC unroll 16
      for (int h = 0; h < 2; ++h) {
        __m256i z;
        __m256 s;
        s4_group_meta(w, nb, g, h, z, s);
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          const __m256i corr =
              _mm256_mullo_epi32(z, _mm256_set1_epi32(args.a_group_sum[(m0 + r) * w.groups + g]));
          const __m256i a = _mm256_sub_epi32(acc[r][h], corr);
          t[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), s, t[r][h]);
        }
      }
    }
    store_halves<MR, 1>(args.y, args.ldy, m0, nb, w.n, nullptr, args.bias,
                        [&](int r, int, int h, __m256, __m256 b) {
                          return _mm256_fmadd_ps(t[r][h], _mm256_set1_ps(args.a_scale[m0 + r]), b);
                        });
  }
};

}  // namespace

void gemv_s8s4f32_n16k8_avx2(const GemvS4Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
