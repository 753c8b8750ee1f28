// Decode GEMV on AVX2: block-32 int8 activations x int4 weights with per-group fp16 scales, float
// out (linear_q8b32_s4_reference bit for bit), on n16k8 codes with separate group metadata or on
// n16b32 (scales in the code stream, groups of 32). Each 16-column block is two ymm halves
// (columns 0-7, 8-15). VPMADDUBSW(u, q) with codes u in [0, 15] and |q| <= 127: the low plus high
// nibble pair sums (4 products) are at most 7620, below the int16 saturation; VPMADDWD with ones
// widens to int32 exactly, then i_b = sum - z' * s_b. Compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/tile_driver.h"

namespace qforge::kernels::detail {

namespace {

template <S4Layout L>
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
    const TileOperands<MR, 1, uint8_t, int8_t> op(w.data, nb, s4_column_block_offset(w, 1), args.q, m0, args.ldq);
    __m256 t[MR][2];
    q8_group_tile<MR>(
        args, m0, w.groups, blocks_per_group,
        [&](int64_t g, int h, __m256i& z, __m256& sc) __attribute__((always_inline)) {
          s4_group_meta(w, nb, g, h, z, sc);
        },
        [&](int64_t b, __m256i (&acc)[MR][2]) __attribute__((always_inline)) {
          if constexpr (L == S4Layout::kN16B32) {
            // Block b's four octs, after its pair's scales (packed_layout.h).
            const int8_t* ap[MR];
            #pragma GCC unroll 16
            for (int r = 0; r < MR; ++r) ap[r] = op.a[r] + b * kQ8Block;
            s4_dot_octs<MR>(op.w[0] + s4_b32_code_offset(b), ap, 0, chunk_end(b, kS4B32Octs, octs) - b * kS4B32Octs,
                            acc);
          } else {
            s4_dot_octs<MR>(op.w[0], op.a, b * kOctsPerBlock, chunk_end(b, kOctsPerBlock, octs), acc);
          }
        },
        t);
    store_halves<MR, 1>(args.y, args.ldy, m0, nb, w.n, nullptr, args.bias,
                        [&](int r, int, int h, __m256, __m256 bias) { return _mm256_add_ps(t[r][h], bias); });
  }
};

}  // namespace

void gemv_q8s4f32_n16k8_avx2(const GemvQ8S4Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel<S4Layout::kN16K8>>(args, nb_begin, nb_end);
}

void gemv_q8s4f32_n16b32_avx2(const GemvQ8S4Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel<S4Layout::kN16B32>>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
