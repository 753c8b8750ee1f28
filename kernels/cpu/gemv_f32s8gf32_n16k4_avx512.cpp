// Weight-only linear on AVX-512 for int8 weights with group scales (S8GroupView): float
// activations times n16k4 codes, one output column per lane and k in order, so each lane performs
// linear_f32_s4_reference's operations on the int8 codes: s = fmaf(x, float(w - z), s) per k,
// t = fmaf(s, scale, t) per group, y = t + bias. Needs w.group_size % 4 == 0 (groups end on a k
// quad) or one group. Compiled with -mavx512f -mavx512bw (and VL/DQ).
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {

namespace {

struct Kernel {
  using Args = GemvF32S8GArgs;
  static constexpr int kMaxRows = 4;
  static constexpr int kMaxBlocks = 2;
  static constexpr bool kOneStreamWhenShort = true;  // tile_driver.h

  template <int MR, int NR>
  static void tile(const GemvF32S8GArgs& args, int64_t m0, int64_t nb0) {
    const S8GroupView& w = args.w;
    const int64_t quads = w.kp / kS8BlockK;
    const int64_t quads_per_group = w.groups == 1 ? quads : w.group_size / kS8BlockK;
    const int64_t stride = quads * kS8BlockBytes;
    const TileOperands<MR, NR, int8_t, float> op(w.data, nb0, stride, args.x, m0, args.ldx);
    const int ahead_valid = blocks_ahead<NR>(nb0, (w.n + kS8BlockN - 1) / kS8BlockN, MR);
    __m512 t[MR][NR];
    fill_tile(t, _mm512_setzero_ps());
    for (int64_t g = 0; g < w.groups; ++g) {
      __m512i z[NR];
      __m512 sc[NR], s[MR][NR];
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) s8g_group_meta(w, nb0 + c, g, z[c], sc[c]);
      fill_tile(s, _mm512_setzero_ps());
      const int64_t q_end = chunk_end(g, quads_per_group, quads);
      for (int64_t kq = g * quads_per_group; kq < q_end; ++kq) {
        prefetch_ahead<NR>(op.w, ahead_valid, NR * stride, kq * kS8BlockBytes, kS8BlockBytes);  // the next tile's
        __m512i v[NR];
        #pragma GCC unroll 16
        for (int c = 0; c < NR; ++c) v[c] = _mm512_loadu_si512(op.w[c] + kq * kS8BlockBytes);
        #pragma GCC unroll 16
        for (int i = 0; i < 4; ++i) {
          __m512 wf[NR];
          #pragma GCC unroll 16
          for (int c = 0; c < NR; ++c) {
            // Byte i of each lane, sign-extended (shift it to the top, arithmetic shift down), minus z.
            const __m512i b = _mm512_srai_epi32(_mm512_slli_epi32(v[c], 24 - 8 * i), 24);
            wf[c] = _mm512_cvtepi32_ps(_mm512_sub_epi32(b, z[c]));
          }
          #pragma GCC unroll 16
          for (int r = 0; r < MR; ++r) {
            const __m512 xv = _mm512_set1_ps(op.a[r][kq * kS8BlockK + i]);
            #pragma GCC unroll 16
            for (int c = 0; c < NR; ++c) s[r][c] = _mm512_fmadd_ps(xv, wf[c], s[r][c]);
          }
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r)
        #pragma GCC unroll 16
        for (int c = 0; c < NR; ++c) t[r][c] = _mm512_fmadd_ps(s[r][c], sc[c], t[r][c]);
    }
    store_columns<MR, NR>(args.y, args.ldy, m0, nb0, w.n, nullptr, args.bias,
                          [&](int r, int c, __m512, __m512 bias) { return _mm512_add_ps(t[r][c], bias); });
  }
};

}  // namespace

void gemv_f32s8gf32_n16k4_avx512(const GemvF32S8GArgs& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
