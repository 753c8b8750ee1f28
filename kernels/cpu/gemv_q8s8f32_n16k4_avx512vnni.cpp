// Decode GEMV on AVX-512 VNNI: block-32 int8 activations x n16k4 int8 weights, float out
// (linear_q8b32_s8_reference bit for bit). VPDPBUSD multiplies unsigned by signed bytes, so the
// weights are made unsigned on the fly, w ^ 0x80 = w + 128 (one packed copy still serves the
// exact weight-only path), and each block's sum loses 128 * s_b (s_b: the block's code sum),
// ending at sum q * w exactly. Compiled with the AVX-512 VNNI flags.
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {

namespace {

// One row: up to 4 column blocks. Several rows: one column block times up to 4 rows. Each tile
// prefetches the next tile's first codes (prefetch_ahead).
struct Kernel {
  using Args = GemvQ8S8Args;
  static constexpr int kMaxRows = 4;
  static constexpr int kMaxBlocks = 4;
  static constexpr bool kOneStreamWhenShort = true;  // tile_driver.h
  static constexpr bool kRowsShareBlock = true;

  template <int MR, int NR>
  static void tile(const GemvQ8S8Args& args, int64_t m0, int64_t nb0) {
    const S8N16K4View& w = args.w;
    const int64_t quads = w.kp / kS8BlockK;
    const int64_t stride = quads * kS8BlockBytes;
    const TileOperands<MR, NR, int8_t, int8_t> op(w.data, nb0, stride, args.q, m0, args.ldq);
    const int ahead_valid = blocks_ahead<NR>(nb0, (w.n + kS8BlockN - 1) / kS8BlockN, MR);
    __m512i offset[NR];
    #pragma GCC unroll 16
    for (int c = 0; c < NR; ++c) offset[c] = _mm512_set1_epi32(kWeightOffset);
    __m512 u[MR][NR];
    fill_tile(u, _mm512_setzero_ps());

    for (int64_t b = 0; b < args.kb; ++b) {
      __m512i acc[MR][NR];
      const int64_t q0 = b * kQuadsPerBlock;
      prefetch_ahead<NR>(op.w, ahead_valid, NR * stride, q0 * kS8BlockBytes, kQuadsPerBlock * kS8BlockBytes);
      q8_flipped_dot<MR, NR>(op.w, op.a, q0, chunk_end(b, kQuadsPerBlock, quads), acc);
      q8_fold_block<MR, NR>(args.s, args.d, args.kb, m0, b, acc, offset, u);
    }

    store_columns<MR, NR>(args.y, args.ldy, m0, nb0, w.n, args.w_scale, args.bias,
                          [&](int r, int c, __m512 ws, __m512 bias) {
                            return _mm512_add_ps(_mm512_mul_ps(u[r][c], ws), bias);
                          });
  }
};

}  // namespace

void gemv_q8s8f32_n16k4_avx512vnni(const GemvQ8S8Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
