// Weight-only linear on AVX2 for int8 weights with group scales (S8GroupView): float activations
// times n16k4 codes, one output column per lane (two ymm halves per 16-column block) and k in
// order, so each lane performs linear_f32_s4_reference's operations on the int8 codes:
// s = fmaf(x, float(w - z), s) per k, t = fmaf(s, scale, t) per group, y = t + bias. Needs
// w.group_size % 4 == 0 (groups end on a k quad) or one group. Compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/tile_driver.h"

namespace qforge::kernels::detail {

namespace {

// One row: two column blocks (four fma chains). Several rows: one column block times two rows.
struct Kernel {
  using Args = GemvF32S8GArgs;
  static constexpr int kMaxRows = 2;
  static constexpr int kMaxBlocks = 2;
  static constexpr bool kRowsShareBlock = true;

  template <int MR, int NR>
  static void tile(const GemvF32S8GArgs& args, int64_t m0, int64_t nb0) {
    constexpr int H = 2 * NR;  // half h: column block nb0 + h / 2, columns (h % 2) * 8 ..
    const S8GroupView& w = args.w;
    const int64_t quads = w.kp / kS8BlockK;
    const int64_t quads_per_group = w.groups == 1 ? quads : w.group_size / kS8BlockK;
    const int64_t stride = quads * kS8BlockBytes;
    const TileOperands<MR, NR, int8_t, float> op(w.data, nb0, stride, args.x, m0, args.ldx);
    const int ahead_valid = blocks_ahead<NR>(nb0, (w.n + kS8BlockN - 1) / kS8BlockN, MR);  // prefetch_ahead
    __m256 t[MR][H];
    fill_tile(t, _mm256_setzero_ps());
    for (int64_t g = 0; g < w.groups; ++g) {
      __m256i z[H];
      __m256 sc[H], s[MR][H];
      #pragma GCC unroll 16
      for (int h = 0; h < H; ++h) s8g_group_meta(w, nb0 + h / 2, g, h % 2, z[h], sc[h]);
      fill_tile(s, _mm256_setzero_ps());
      const int64_t q_end = chunk_end(g, quads_per_group, quads);
      for (int64_t kq = g * quads_per_group; kq < q_end; ++kq) {
        prefetch_ahead<NR>(op.w, ahead_valid, NR * stride, kq * kS8BlockBytes, kS8BlockBytes);
        __m256i v[H];
        #pragma GCC unroll 16
        for (int h = 0; h < H; ++h)
          v[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(op.w[h / 2] + kq * kS8BlockBytes + h % 2 * 32));
        #pragma GCC unroll 16
        for (int i = 0; i < kS8BlockK; ++i) {
          __m256 wf[H];
          #pragma GCC unroll 16
          for (int h = 0; h < H; ++h) {
            // Byte i of each lane, sign-extended (shift it to the top, arithmetic shift down), minus z.
            const __m256i b = _mm256_srai_epi32(_mm256_slli_epi32(v[h], 24 - 8 * i), 24);
            wf[h] = _mm256_cvtepi32_ps(_mm256_sub_epi32(b, z[h]));
          }
          #pragma GCC unroll 16
          for (int r = 0; r < MR; ++r) {
            const __m256 xv = _mm256_set1_ps(op.a[r][kq * kS8BlockK + i]);
            #pragma GCC unroll 16
            for (int h = 0; h < H; ++h) s[r][h] = _mm256_fmadd_ps(xv, wf[h], s[r][h]);
          }
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r)
        #pragma GCC unroll 16
        for (int h = 0; h < H; ++h) t[r][h] = _mm256_fmadd_ps(s[r][h], sc[h], t[r][h]);
    }
    store_halves<MR, NR>(args.y, args.ldy, m0, nb0, w.n, nullptr, args.bias,
                         [&](int r, int c, int h, __m256, __m256 bias) { return _mm256_add_ps(t[r][2 * c + h], bias); });
  }
};

}  // namespace

void gemv_f32s8gf32_n16k4_avx2(const GemvF32S8GArgs& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
