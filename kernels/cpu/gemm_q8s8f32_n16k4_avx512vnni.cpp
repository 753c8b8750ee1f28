// Prefill GEMM on AVX-512 VNNI: block-32 int8 activations x n16k4 int8 per-channel weights, float
// out (linear_q8b32_s8_reference bit for bit; the numerics of gemv_q8s8f32_n16k4_avx512vnni, in
// larger tiles). A 4-row x 3-block register tile keeps one int32 accumulator per row, column
// block and 32-value block b: VPDPBUSD takes the weights made unsigned (w ^ 0x80 = w + 128) and
// the accumulator starts at -128 * s_b, so it ends at sum q * w exactly; then per block
//   u = fma(float(i_b), d_b, u),  and y = u * w_scale + bias at the end.
// Compiled with the AVX-512 VNNI flags.
#include <immintrin.h>

#include "kernels/cpu/gemm_q8_kernels.h"
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {

namespace {


struct Kernel {
  using Args = GemvQ8S8Args;
  static constexpr int kMaxRows = 4;
  static constexpr int kMaxBlocks = 3;

  template <int MR, int NR>
  static void tile(const GemvQ8S8Args& args, int64_t m0, int64_t nb0) {
    const S8N16K4View& w = args.w;
    const int64_t quads = w.kp / kS8BlockK;
    const TileOperands<MR, NR, int8_t, int8_t> op(w.data, nb0, quads * kS8BlockBytes, args.q, m0, args.ldq);
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512 u[MR][NR];
    fill_tile(u, _mm512_setzero_ps());
    for (int64_t b = 0; b < args.kb; ++b) {
      __m512i acc[MR][NR];
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m512i start = _mm512_set1_epi32(-kWeightOffset * args.s[(m0 + r) * args.kb + b]);
        #pragma GCC unroll 16
        for (int c = 0; c < NR; ++c) acc[r][c] = start;
      }
      const int64_t q_end = chunk_end(b, kQuadsPerBlock, quads);
      for (int64_t kq = b * kQuadsPerBlock; kq < q_end; ++kq) {
        #pragma GCC unroll 16
        for (int c = 0; c < NR; ++c) {
          const __m512i wv = _mm512_xor_si512(_mm512_loadu_si512(op.w[c] + kq * kS8BlockBytes), flip);
          #pragma GCC unroll 16
          for (int r = 0; r < MR; ++r)
            acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], wv, _mm512_set1_epi32(load_u32(op.a[r] + kq * kS8BlockK)));
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m512 d = _mm512_set1_ps(args.d[(m0 + r) * args.kb + b]);
        #pragma GCC unroll 16
        for (int c = 0; c < NR; ++c) u[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][c]), d, u[r][c]);
      }
    }
    store_columns<MR, NR>(args.y, args.ldy, m0, nb0, w.n, args.w_scale, args.bias,
                          [&](int r, int c, __m512 ws, __m512 bias) {
                            return _mm512_add_ps(_mm512_mul_ps(u[r][c], ws), bias);
                          });
  }
};

}  // namespace

void gemm_q8s8f32_n16k4_avx512vnni(const GemvQ8S8Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end, Kernel::kMaxBlocks, [](int64_t, int) {});
}

}  // namespace qforge::kernels::detail
