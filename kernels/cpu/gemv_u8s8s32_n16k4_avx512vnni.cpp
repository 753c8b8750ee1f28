// Small-M int8 GEMM on AVX-512 VNNI: VPDPBUSD of u8 activations (broadcast 4 k at a time)
// against n16k4 weight blocks, 16 output columns per zmm accumulator. Signed activations are
// offset by +128 by the caller and corrected with the packed column sums:
//   sum_k (a_u8 - zp) * w = dpbusd_sum - zp * colsum[n].
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni.
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {

namespace {

// Out of line on purpose: inlined, this branchy epilogue makes GCC 12 shuffle the accumulator
// array through extra moves inside the k loop (measured ~1.5x slower).
template <int MR, int NR>
__attribute__((noinline)) void finish_tile(const GemvS8Args& args, int64_t m0, int64_t nb0,
                                           const int32_t (*sums)[NR][kS8BlockN]) {
  const S8N16K4View& w = args.w;
  const __m512i zp = _mm512_set1_epi32(args.a_zero_point);
  // zp * colsum of each block, once per tile rather than once per row.
  __m512i comp[NR];
  #pragma GCC unroll 16
  for (int c = 0; c < NR; ++c) comp[c] = _mm512_mullo_epi32(zp, _mm512_loadu_si512(w.colsum + (nb0 + c) * kS8BlockN));
  // sum_k (a_u8 - zp) * w of row r, block c: the VPDPBUSD sum less zp * colsum.
  const auto acc = [&](int r, int c) { return _mm512_sub_epi32(_mm512_load_si512(sums[r][c]), comp[c]); };
  if (args.c != nullptr) {
    #pragma GCC unroll 16
    for (int c = 0; c < NR; ++c) {
      const int64_t n0 = (nb0 + c) * kS8BlockN;
      const __mmask16 mask = column_mask(n0, w.n);
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) _mm512_mask_storeu_epi32(args.c + (m0 + r) * args.ldc + n0, mask, acc(r, c));
    }
    return;
  }
  store_columns<MR, NR>(args.y, args.ldy, m0, nb0, w.n, args.w_scale, args.bias,
                        [&](int r, int c, __m512 ws, __m512 b) {
                          const __m512 f = _mm512_cvtepi32_ps(acc(r, c));
                          return _mm512_fmadd_ps(_mm512_mul_ps(f, ws), _mm512_set1_ps(args.a_scale[m0 + r]), b);
                        });
}

struct Kernel {
  using Args = GemvS8Args;
  static constexpr int kMaxRows = 4;    // rows of A per register tile
  static constexpr int kMaxBlocks = 4;  // 16-column blocks per tile (MR x NR <= 16 accumulators)

  template <int MR, int NR>
  static void tile(const GemvS8Args& args, int64_t m0, int64_t nb0) {
    const S8N16K4View& w = args.w;
    const int64_t kblocks = w.kp / kS8BlockK;
    const TileOperands<MR, NR, int8_t, uint8_t> op(w.data, nb0, kblocks * kS8BlockBytes, args.a_u8, m0, args.lda);

    __m512i acc[MR][NR];
    dpbusd_quads<false, MR, NR>(op.w, op.a, 0, kblocks, acc);
    alignas(64) int32_t sums[MR][NR][kS8BlockN];
    spill_tile(acc, sums);
    finish_tile<MR, NR>(args, m0, nb0, sums);
  }
};

}  // namespace

void gemv_u8s8s32_n16k4_avx512vnni(const GemvS8Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
