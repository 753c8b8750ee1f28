// Decode GEMV on AVX-512 VNNI: block-32 int8 activations x int4 weights with per-group fp16 scales,
// float out (linear_q8b32_s4_reference bit for bit), on n16k8 codes with separate group metadata
// or on n16b32 (scales in the code stream, groups of 32). The 4-bit codes u = w - qmin are
// VPDPBUSD's unsigned operand and the activation codes its signed one; per 32-value block b,
//   i_b = sum u * q - z' * s_b      (z' = z - qmin per column and group, s_b the block's code sum)
// then u = fma(float(i_b), d_b, u) per block and t = fma(u, scale, t) per group, lanes = columns.
// Compiled with the AVX-512 VNNI flags.
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/s4_tile_avx512.h"
#include "kernels/cpu/tile_driver.h"

namespace qforge::kernels::detail {

namespace {

// Block b's int32 sums of an n16b32 tile: its four octs. At each even block the tile prefetches
// the pair (9 lines) the next tile reads there (prefetch_ahead). Prefetching further along the
// tile's own streams, 8 and 24 blocks ahead, measured 4-16 % slower: the hardware prefetcher
// follows a stream once it runs.
template <int MR, int NR>
__attribute__((always_inline)) inline void n16b32_block_dot(const TileOperands<MR, NR, uint8_t, int8_t>& op,
                                                            int64_t b, int64_t octs, int ahead_valid, int64_t ahead,
                                                            __m512i (&acc)[MR][NR]) {
  if (b % 2 == 0) prefetch_ahead<NR>(op.w, ahead_valid, ahead, s4_b32_code_offset(b) - 2 * kS4B32ScaleBytes, kS4B32PairBytes);
  const uint8_t* wp[NR];
  const int8_t* ap[MR];
  #pragma GCC unroll 16
  for (int c = 0; c < NR; ++c) wp[c] = op.w[c] + s4_b32_code_offset(b);
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) ap[r] = op.a[r] + b * kQ8Block;
  const int64_t n = chunk_end(b, kS4B32Octs, octs) - b * kS4B32Octs;
  if (n == kS4B32Octs) {
    s4_dot_octs<MR, NR>(wp, ap, 0, kS4B32Octs, acc);  // constant trip count: fully unrolled
  } else {
    s4_dot_octs<MR, NR>(wp, ap, 0, n, acc);
  }
}

template <S4Layout L>
struct Kernel {
  using Args = GemvQ8S4Args;
  static constexpr int kMaxRows = 4;
  // One-row tiles of 4 column blocks (n16b32: 2 measured 13 % slower, 8 the same), or of one where
  // the blocks are short (tile_driver.h, kOneStreamBytes).
  static constexpr int kMaxBlocks = 4;
  static constexpr bool kOneStreamWhenShort = true;  // tile_driver.h
  static constexpr bool kRowsShareBlock = true;

  template <int MR, int NR>
  static void tile(const GemvQ8S4Args& args, int64_t m0, int64_t nb0) {
    const S4N16K8View& w = args.w;
    const int64_t octs = w.kp / kS4BlockK;
    const int64_t blocks_per_group = w.groups == 1 ? args.kb : w.group_size / (kOctsPerBlock * kS4BlockK);
    const int64_t stride = s4_column_block_offset(w, 1);
    const TileOperands<MR, NR, uint8_t, int8_t> op(w.data, nb0, stride, args.q, m0, args.ldq);
    const int ahead_valid = blocks_ahead<NR>(nb0, (w.n + kS4BlockN - 1) / kS4BlockN, MR);
    __m512 t[MR][NR];
    q8_group_tile<MR, NR>(
        args, m0, w.groups, blocks_per_group,
        [&](int64_t g, __m512i (&zc)[NR], __m512 (&sc)[NR]) __attribute__((always_inline)) {
          s4_group_meta(w, nb0, g, zc, sc);
        },
        [&](int64_t b, __m512i (&acc)[MR][NR]) __attribute__((always_inline)) {
          if constexpr (L == S4Layout::kN16B32) {
            n16b32_block_dot<MR, NR>(op, b, octs, ahead_valid, NR * stride, acc);
          } else {
            prefetch_ahead<NR>(op.w, ahead_valid, NR * stride, b * kOctsPerBlock * kS4BlockBytes,
                               kOctsPerBlock * kS4BlockBytes);
            s4_dot_octs<MR, NR>(op.w, op.a, b * kOctsPerBlock, chunk_end(b, kOctsPerBlock, octs), acc);
          }
        },
        t);
    store_columns<MR, NR>(args.y, args.ldy, m0, nb0, w.n, nullptr, args.bias,
                          [&](int r, int c, __m512, __m512 bias) { return _mm512_add_ps(t[r][c], bias); });
  }
};

}  // namespace

void gemv_q8s4f32_n16k8_avx512vnni(const GemvQ8S4Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel<S4Layout::kN16K8>>(args, nb_begin, nb_end);
}

void gemv_q8s4f32_n16b32_avx512vnni(const GemvQ8S4Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel<S4Layout::kN16B32>>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
