// Decode GEMV on AVX-512 VNNI: block-32 int8 activations x n16k8 int4 weights with per-group fp16
// scales, float out (linear_q8b32_s4_reference bit for bit). The 4-bit codes u = w - qmin are
// VPDPBUSD's unsigned operand and the activation codes its signed one; per 32-value block b,
//   i_b = sum u * q - z' * s_b      (z' = z - qmin per column and group, s_b the block's code sum)
// then u = fma(float(i_b), d_b, u) per block and t = fma(u, scale, t) per group, lanes = columns.
// Compiled with the AVX-512 VNNI flags.
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {

namespace {

constexpr int kNibbleMask = 0x0F;
constexpr int64_t kOctsPerBlock = 4;  // n16k8 blocks in one 32-value activation block

struct Kernel {
  using Args = GemvQ8S4Args;
  static constexpr int kMaxRows = 4;
  static constexpr int kMaxBlocks = 4;
  static constexpr bool tile_used(int mr, int nr) { return mr == 1 || nr == 1; }

  template <int MR, int NR>
  static void tile(const GemvQ8S4Args& args, int64_t m0, int64_t nb0) {
    const S4N16K8View& w = args.w;
    const int64_t octs = w.kp / kS4BlockK;
    const int64_t blocks_per_group = w.groups == 1 ? args.kb : w.group_size / (kOctsPerBlock * kS4BlockK);
    const uint8_t* wp[NR];
    block_pointers(w.data, nb0, octs * kS4BlockBytes, wp);
    const int8_t* qp[MR];
    row_pointers(args.q, m0, args.ldq, qp);
    const __m512i nibble = _mm512_set1_epi8(kNibbleMask);
    __m512 t[MR][NR];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) t[r][c] = _mm512_setzero_ps();

    for (int64_t g = 0; g < w.groups; ++g) {
      __m512i zc[NR];
      __m512 sc[NR];
      __m512 u[MR][NR];
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) {
        const int64_t meta = ((nb0 + c) * w.groups + g) * kS4BlockN;
        zc[c] = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.zeros + meta)));
        sc[c] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.scales + meta)));
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) u[r][c] = _mm512_setzero_ps();
      }
      const int64_t b_end = (g + 1) * blocks_per_group < args.kb ? (g + 1) * blocks_per_group : args.kb;
      for (int64_t b = g * blocks_per_group; b < b_end; ++b) {
        __m512i lo_acc[MR][NR], hi_acc[MR][NR];
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r)
          #pragma GCC unroll 16
          for (int c = 0; c < NR; ++c) lo_acc[r][c] = hi_acc[r][c] = _mm512_setzero_si512();
        const int64_t o_end = (b + 1) * kOctsPerBlock < octs ? (b + 1) * kOctsPerBlock : octs;
        for (int64_t o = b * kOctsPerBlock; o < o_end; ++o) {
          __m512i a_lo[MR], a_hi[MR];
          #pragma GCC unroll 16
          for (int r = 0; r < MR; ++r) {
            a_lo[r] = _mm512_set1_epi32(load_u32(qp[r] + o * kS4BlockK));
            a_hi[r] = _mm512_set1_epi32(load_u32(qp[r] + o * kS4BlockK + kS8BlockK));
          }
          #pragma GCC unroll 16
          for (int c = 0; c < NR; ++c) {
            const __m512i v = _mm512_loadu_si512(wp[c] + o * kS4BlockBytes);
            const __m512i lo = _mm512_and_si512(v, nibble);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, kS4NibbleBits), nibble);
            #pragma GCC unroll 16
            for (int r = 0; r < MR; ++r) {
              lo_acc[r][c] = _mm512_dpbusd_epi32(lo_acc[r][c], lo, a_lo[r]);
              hi_acc[r][c] = _mm512_dpbusd_epi32(hi_acc[r][c], hi, a_hi[r]);
            }
          }
        }
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          const __m512i s = _mm512_set1_epi32(args.s[(m0 + r) * args.kb + b]);
          const __m512 d = _mm512_set1_ps(args.d[(m0 + r) * args.kb + b]);
          #pragma GCC unroll 16
          for (int c = 0; c < NR; ++c) {
            const __m512i i = _mm512_sub_epi32(_mm512_add_epi32(lo_acc[r][c], hi_acc[r][c]), _mm512_mullo_epi32(zc[c], s));
            u[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), d, u[r][c]);
          }
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r)
        #pragma GCC unroll 16
        for (int c = 0; c < NR; ++c) t[r][c] = _mm512_fmadd_ps(u[r][c], sc[c], t[r][c]);
    }

    #pragma GCC unroll 16
    for (int c = 0; c < NR; ++c) {
      const int64_t n0 = (nb0 + c) * kS4BlockN;
      const __mmask16 mask = column_mask(n0, w.n);
      const __m512 bias = args.bias != nullptr ? _mm512_maskz_loadu_ps(mask, args.bias + n0) : _mm512_setzero_ps();
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(args.y + (m0 + r) * args.ldy + n0, mask, _mm512_add_ps(t[r][c], bias));
    }
  }
};

}  // namespace

void gemv_q8s4f32_n16k8_avx512vnni(const GemvQ8S4Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end, args.m == 1 ? Kernel::kMaxBlocks : 1, [](int64_t, int) {});
}

}  // namespace qforge::kernels::detail
