// Decode GEMV on AVX2: block-32 int8 activations x n16k4 int8 weights with a scale (and optional
// zero point) per column and group, float out (linear_q8b32_s4_reference's formula on int8 codes,
// bit for bit). Each n16k4 block is two ymm halves (columns 0-7, 8-15); per 32-value block b and
// column, i_b = sum c * q - z * s_b (s8_dot_quads: VPMADDUBSW(|c|, sign(q, c)), exact), then
// u = fma(float(i_b), d_b, u) per block and t = fma(u, scale, t) per group (q8_group_tile).
// Compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/tile_driver.h"

namespace qforge::kernels::detail {

namespace {

struct Kernel {
  using Args = GemvQ8S8GArgs;
  static constexpr int kMaxRows = 2;
  static constexpr int kMaxBlocks = 1;

  template <int MR, int NR>
  static void tile(const GemvQ8S8GArgs& args, int64_t m0, int64_t nb) {
    static_assert(NR == 1, "one 16-column block per tile");
    const S8GroupView& w = args.w;
    const int64_t quads = w.kp / kS8BlockK;
    const int64_t blocks_per_group = w.groups == 1 ? args.kb : w.group_size / kQ8Block;
    const TileOperands<MR, 1, int8_t, int8_t> op(w.data, nb, quads * kS8BlockBytes, args.q, m0, args.ldq);
    __m256 t[MR][2];
    q8_group_tile<MR>(
        args, m0, w.groups, blocks_per_group,
        [&](int64_t g, int h, __m256i& z, __m256& sc) __attribute__((always_inline)) {
          s8g_group_meta(w, nb, g, h, z, sc);
        },
        [&](int64_t b, __m256i (&acc)[MR][2]) __attribute__((always_inline)) {
          __m256i sums[MR][1][2];
          s8_dot_quads<MR, 1>(op.w, op.a, b * kQuadsPerBlock, chunk_end(b, kQuadsPerBlock, quads), sums);
          #pragma GCC unroll 16
          for (int r = 0; r < MR; ++r) acc[r][0] = sums[r][0][0], acc[r][1] = sums[r][0][1];
        },
        t);
    store_halves<MR, 1>(args.y, args.ldy, m0, nb, w.n, nullptr, args.bias,
                        [&](int r, int, int h, __m256, __m256 bias) { return _mm256_add_ps(t[r][h], bias); });
  }
};

}  // namespace

void gemv_q8s8gf32_n16k4_avx2(const GemvQ8S8GArgs& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
