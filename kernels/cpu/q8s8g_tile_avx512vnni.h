// The block-32 int8-group tile on AVX-512 VNNI, written once for the decode GEMV
// (gemv_q8s8gf32_n16k4_avx512vnni: tiles of 1 row x 4 column blocks, or 4 rows x 1 block) and
// the prefill GEMM (gemm_q8s8gf32_n16k4_avx512vnni: 4 rows x 2 blocks over a panel): block-32
// int8 activations x n16k4 int8 codes with a scale (and optional zero point) per column and
// group, float out (linear_q8b32_s4_reference's formula on int8 codes, bit for bit). The codes
// are made unsigned, c ^ 0x80 = c + 128, so per 32-value block b and column
//   i_b = sum (c + 128) * q - (128 + z) * s_b       (s_b: the block's activation code sum)
// then u = fma(float(i_b), d_b, u) per block and t = fma(u, scale, t) per group, lanes = columns.
// Include only from files compiled with the AVX-512 VNNI flags.
#pragma once

#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {
namespace {

// The tile driver's Kernel (tile_driver.h) with the tile shape as parameters: kRows x kBlocks
// register tiles, or (kRowsShareBlock) one-row tiles of kBlocks blocks and several-row tiles of one.
template <int kRows, int kBlocks, bool kShare>
struct Q8S8GTile {
  using Args = GemvQ8S8GArgs;
  static constexpr int kMaxRows = kRows;
  static constexpr int kMaxBlocks = kBlocks;
  static constexpr bool kOneStreamWhenShort = kShare;  // tile_driver.h
  static constexpr bool kRowsShareBlock = kShare;

  template <int MR, int NR>
  static void tile(const GemvQ8S8GArgs& args, int64_t m0, int64_t nb0) {
    const S8GroupView& w = args.w;
    const int64_t quads = w.kp / kS8BlockK;
    const int64_t blocks_per_group = w.groups == 1 ? args.kb : w.group_size / kQ8Block;
    const int64_t stride = quads * kS8BlockBytes;
    const TileOperands<MR, NR, int8_t, int8_t> op(w.data, nb0, stride, args.q, m0, args.ldq);
    // The GEMV's tiles prefetch the next tile's codes (prefetch_ahead); the GEMM's panels reuse theirs.
    const int ahead_valid = kShare ? blocks_ahead<NR>(nb0, (w.n + kS8BlockN - 1) / kS8BlockN, MR) : 0;
    __m512 t[MR][NR];
    q8_group_tile<MR, NR>(
        args, m0, w.groups, blocks_per_group,
        [&](int64_t g, __m512i (&offset)[NR], __m512 (&sc)[NR]) __attribute__((always_inline)) {
          #pragma GCC unroll 16
          for (int c = 0; c < NR; ++c) {  // 128 + z per column
            s8g_group_meta(w, nb0 + c, g, offset[c], sc[c]);
            offset[c] = _mm512_add_epi32(offset[c], _mm512_set1_epi32(kWeightOffset));
          }
        },
        [&](int64_t b, __m512i (&acc)[MR][NR]) __attribute__((always_inline)) {
          const int64_t q0 = b * kQuadsPerBlock;
          prefetch_ahead<NR>(op.w, ahead_valid, NR * stride, q0 * kS8BlockBytes, kQuadsPerBlock * kS8BlockBytes);
          q8_flipped_dot<MR, NR>(op.w, op.a, q0, chunk_end(b, kQuadsPerBlock, quads), acc);
        },
        t);
    store_columns<MR, NR>(args.y, args.ldy, m0, nb0, w.n, nullptr, args.bias,
                          [&](int r, int c, __m512, __m512 bias) { return _mm512_add_ps(t[r][c], bias); });
  }
};

}  // namespace
}  // namespace qforge::kernels::detail
