// Weight-only int8 linear on AVX-512: float activations times n16k4 int8 weights. One output
// column per lane and k in order, so each lane performs exactly linear_f32_s8_reference's
// operations: t = fmaf(x, float(w), t) per k, then y = t * w_scale + bias (two roundings).
// Compiled with -mavx512f -mavx512bw (and VL/DQ).
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {

namespace {

template <int MR, int NR>
__attribute__((noinline)) void finish_tile(const GemvF32S8Args& args, int64_t m0, int64_t nb0,
                                           const float (*t)[NR][kS8BlockN]) {
  store_columns<MR, NR>(args.y, args.ldy, m0, nb0, args.w.n, args.w_scale, args.bias,
                        [&](int r, int c, __m512 ws, __m512 b) {
                          return _mm512_add_ps(_mm512_mul_ps(_mm512_load_ps(t[r][c]), ws), b);
                        });
}

struct Kernel {
  using Args = GemvF32S8Args;
  static constexpr int kMaxRows = 4;
  static constexpr int kMaxBlocks = 2;
  static constexpr bool kOneStreamWhenShort = true;  // tile_driver.h

  template <int MR, int NR>
  static void tile(const GemvF32S8Args& args, int64_t m0, int64_t nb0) {
    const S8N16K4View& w = args.w;
    const int64_t kblocks = w.kp / kS8BlockK;
    const int64_t stride = kblocks * kS8BlockBytes;
    const TileOperands<MR, NR, int8_t, float> op(w.data, nb0, stride, args.x, m0, args.ldx);
    const int ahead_valid = blocks_ahead<NR>(nb0, (w.n + kS8BlockN - 1) / kS8BlockN, MR);

    __m512 t[MR][NR];
    fill_tile(t, _mm512_setzero_ps());

    for (int64_t kb = 0; kb < kblocks; ++kb) {
      prefetch_ahead<NR>(op.w, ahead_valid, NR * stride, kb * kS8BlockBytes, kS8BlockBytes);  // the next tile's
      __m512i v[NR];
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) v[c] = _mm512_loadu_si512(op.w[c] + kb * kS8BlockBytes);
      #pragma GCC unroll 16
      for (int i = 0; i < 4; ++i) {
        __m512 wf[NR];
        #pragma GCC unroll 16
        for (int c = 0; c < NR; ++c) {
          // Byte i of each lane, sign-extended: shift it to the top, then arithmetic shift down.
          const __m512i b = _mm512_srai_epi32(_mm512_slli_epi32(v[c], 24 - 8 * i), 24);
          wf[c] = _mm512_cvtepi32_ps(b);
        }
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          const __m512 xv = _mm512_set1_ps(op.a[r][kb * kS8BlockK + i]);
          #pragma GCC unroll 16
          for (int c = 0; c < NR; ++c) t[r][c] = _mm512_fmadd_ps(xv, wf[c], t[r][c]);
        }
      }
    }

    alignas(64) float out[MR][NR][kS8BlockN];
    spill_tile(t, out);
    finish_tile<MR, NR>(args, m0, nb0, out);
  }
};

}  // namespace

void gemv_f32s8f32_n16k4_avx512(const GemvF32S8Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
