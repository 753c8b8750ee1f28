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
  #pragma GCC unroll 16
  for (int c = 0; c < NR; ++c) {
    const int64_t n0 = (nb0 + c) * kS8BlockN;
    const __mmask16 mask = column_mask(n0, w.n);
    const __m512i comp = _mm512_mullo_epi32(zp, _mm512_loadu_si512(w.colsum + n0));
    if (args.c != nullptr) {
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        _mm512_mask_storeu_epi32(args.c + (m0 + r) * args.ldc + n0, mask,
                                 _mm512_sub_epi32(_mm512_load_si512(sums[r][c]), comp));
      }
      continue;
    }
    const __m512 ws = _mm512_maskz_loadu_ps(mask, args.w_scale + n0);
    const __m512 b =
        args.bias != nullptr ? _mm512_maskz_loadu_ps(mask, args.bias + n0) : _mm512_setzero_ps();
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(sums[r][c]), comp));
      const __m512 y =
          _mm512_fmadd_ps(_mm512_mul_ps(f, ws), _mm512_set1_ps(args.a_scale[m0 + r]), b);
      _mm512_mask_storeu_ps(args.y + (m0 + r) * args.ldy + n0, mask, y);
    }
  }
}

struct Kernel {
  using Args = GemvS8Args;
  static constexpr int kMaxRows = 4;    // rows of A per register tile
  static constexpr int kMaxBlocks = 4;  // 16-column blocks per tile (MR x NR <= 16 accumulators)

  template <int MR, int NR>
  static void tile(const GemvS8Args& args, int64_t m0, int64_t nb0) {
    const S8N16K4View& w = args.w;
    const int64_t kblocks = w.kp / kS8BlockK;
    const int8_t* wp[NR];
    block_pointers(w.data, nb0, kblocks * kS8BlockBytes, wp);
    const uint8_t* ap[MR];
    row_pointers(args.a_u8, m0, args.lda, ap);

    __m512i acc[MR][NR];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_si512();

    for (int64_t kb = 0; kb < kblocks; ++kb) {
      __m512i av[MR];
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) av[r] = _mm512_set1_epi32(load_u32(ap[r] + kb * kS8BlockK));
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) {
        const __m512i wv = _mm512_loadu_si512(wp[c] + kb * kS8BlockBytes);
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], av[r], wv);
      }
    }

    alignas(64) int32_t sums[MR][NR][kS8BlockN];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) _mm512_store_si512(sums[r][c], acc[r][c]);

    finish_tile<MR, NR>(args, m0, nb0, sums);
  }
};

}  // namespace

void gemv_u8s8s32_n16k4_avx512vnni(const GemvS8Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
