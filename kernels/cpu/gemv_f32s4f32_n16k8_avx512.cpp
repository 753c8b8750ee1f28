// Weight-only int4 linear on AVX-512: float activations times n16k8 (or n16b32) int4 codes, per-group
// scales.
// One output column per lane and k in order, so every lane performs exactly the operations of
// linear_f32_s4_reference: s = fmaf(x, float(u - z'), s) per k (u - z' = W - z exactly), then
// t = fmaf(s, scale, t) per group and y = t + bias. Compiled with -mavx512f -mavx512bw (and VL/DQ).
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {

namespace {

constexpr int kByteMask = 0xFF;

// Out of line so the k loop keeps its accumulators in registers (see gemv_u8s8s32 kernel).
template <int MR, int NR>
__attribute__((noinline)) void finish_tile(const GemvF32S4Args& args, int64_t m0, int64_t nb0,
                                           const float (*t)[NR][kS4BlockN]) {
  store_columns<MR, NR>(args.y, args.ldy, m0, nb0, args.w.n, nullptr, args.bias,
                        [&](int r, int c, __m512, __m512 b) { return _mm512_add_ps(_mm512_load_ps(t[r][c]), b); });
}

template <S4Layout L>
struct Kernel {
  using Args = GemvF32S4Args;
  static constexpr int kMaxRows = 4;
  static constexpr int kMaxBlocks = 2;  // MR x NR x 2 (s and t) <= 16 zmm accumulators
  static constexpr bool kOneStreamWhenShort = true;  // tile_driver.h

  template <int MR, int NR>
  static void tile(const GemvF32S4Args& args, int64_t m0, int64_t nb0) {
    const S4N16K8View& w = args.w;
    const int64_t kblocks = w.kp / kS4BlockK;
    // One group may be K long with K % 8 != 0 (n16b32 with K < 32): it spans every block.
    const int64_t blocks_per_group = w.groups == 1 ? kblocks : w.group_size / kS4BlockK;
    const int64_t stride = s4_column_block_offset(w, 1);
    const TileOperands<MR, NR, uint8_t, float> op(w.data, nb0, stride, args.x, m0, args.ldx);
    const int ahead_valid = blocks_ahead<NR>(nb0, (w.n + kS4BlockN - 1) / kS4BlockN, MR);
    const __m512i nibble = _mm512_set1_epi8(kS4NibbleMask);
    const __m512i byte = _mm512_set1_epi32(kByteMask);

    __m512 t[MR][NR];
    fill_tile(t, _mm512_setzero_ps());

    for (int64_t g = 0; g < w.groups; ++g) {
      __m512i zi[NR];
      __m512 z[NR], scale[NR];
      s4_group_meta(w, nb0, g, zi, scale);
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) z[c] = _mm512_cvtepi32_ps(zi[c]);
      __m512 s[MR][NR];
      fill_tile(s, _mm512_setzero_ps());
      const int64_t kb_end = chunk_end(g, blocks_per_group, kblocks);
      for (int64_t kb = g * blocks_per_group; kb < kb_end; ++kb) {
        // The next tile's codes (prefetch_ahead): n16b32 a pair (its scales too) every 8 octs.
        if constexpr (L == S4Layout::kN16B32) {
          if (kb % (2 * kS4B32Octs) == 0)
            prefetch_ahead<NR>(op.w, ahead_valid, NR * stride, kb / (2 * kS4B32Octs) * kS4B32PairBytes, kS4B32PairBytes);
        } else {
          prefetch_ahead<NR>(op.w, ahead_valid, NR * stride, kb * kS4BlockBytes, kS4BlockBytes);
        }
        __m512i half[NR][2];
        #pragma GCC unroll 16
        for (int c = 0; c < NR; ++c) {
          const __m512i v = _mm512_loadu_si512(op.w[c] + s4_oct_offset<L>(kb));
          half[c][0] = _mm512_and_si512(v, nibble);                                   // k 0..3
          half[c][1] = _mm512_and_si512(_mm512_srli_epi16(v, kS4NibbleBits), nibble);  // k 4..7
        }
        #pragma GCC unroll 16
        for (int h = 0; h < 2; ++h) {
          #pragma GCC unroll 16
          for (int i = 0; i < 4; ++i) {
            const int64_t k = kb * kS4BlockK + h * 4 + i;
            __m512 wf[NR];
            #pragma GCC unroll 16
            for (int c = 0; c < NR; ++c) {
              const __m512i u = _mm512_and_si512(_mm512_srli_epi32(half[c][h], 8 * i), byte);
              wf[c] = _mm512_sub_ps(_mm512_cvtepi32_ps(u), z[c]);  // exact: small integers
            }
            #pragma GCC unroll 16
            for (int r = 0; r < MR; ++r) {
              const __m512 xv = _mm512_set1_ps(op.a[r][k]);
              #pragma GCC unroll 16
              for (int c = 0; c < NR; ++c) s[r][c] = _mm512_fmadd_ps(xv, wf[c], s[r][c]);
            }
          }
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r)
        #pragma GCC unroll 16
        for (int c = 0; c < NR; ++c) t[r][c] = _mm512_fmadd_ps(s[r][c], scale[c], t[r][c]);
    }

    alignas(64) float out[MR][NR][kS4BlockN];
    spill_tile(t, out);
    finish_tile<MR, NR>(args, m0, nb0, out);
  }
};

}  // namespace

void gemv_f32s4f32_n16k8_avx512(const GemvF32S4Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel<S4Layout::kN16K8>>(args, nb_begin, nb_end);
}

void gemv_f32s4f32_n16b32_avx512(const GemvF32S4Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel<S4Layout::kN16B32>>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
