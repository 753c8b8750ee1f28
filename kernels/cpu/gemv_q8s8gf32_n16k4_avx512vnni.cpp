// Decode GEMV on AVX-512 VNNI: block-32 int8 activations x n16k4 int8 weights with a scale (and
// optional zero point) per column and group, float out (linear_q8b32_s4_reference's formula on
// int8 codes, bit for bit). As in gemv_q8s8f32_n16k4_avx512vnni the codes are made unsigned,
// c ^ 0x80 = c + 128, so per 32-value block b and column
//   i_b = sum (c + 128) * q - (128 + z) * s_b       (s_b: the block's activation code sum)
// then u = fma(float(i_b), d_b, u) per block and t = fma(u, scale, t) per group, lanes = columns.
// Compiled with the AVX-512 VNNI flags.
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {

namespace {


// One row: up to 4 column blocks. Several rows: one column block times up to 4 rows.
struct Kernel {
  using Args = GemvQ8S8GArgs;
  static constexpr int kMaxRows = 4;
  static constexpr int kMaxBlocks = 4;
  static constexpr bool kRowsShareBlock = true;

  template <int MR, int NR>
  static void tile(const GemvQ8S8GArgs& args, int64_t m0, int64_t nb0) {
    const S8GroupView& w = args.w;
    const int64_t quads = w.kp / kS8BlockK;
    const int64_t blocks_per_group = w.groups == 1 ? args.kb : w.group_size / kQ8Block;
    const TileOperands<MR, NR, int8_t, int8_t> op(w.data, nb0, quads * kS8BlockBytes, args.q, m0, args.ldq);
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
          q8_flipped_dot<MR, NR>(op.w, op.a, b * kQuadsPerBlock, chunk_end(b, kQuadsPerBlock, quads), acc);
        },
        t);
    store_columns<MR, NR>(args.y, args.ldy, m0, nb0, w.n, nullptr, args.bias,
                          [&](int r, int c, __m512, __m512 bias) { return _mm512_add_ps(t[r][c], bias); });
  }
};

}  // namespace

void gemv_q8s8gf32_n16k4_avx512vnni(const GemvQ8S8GArgs& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
