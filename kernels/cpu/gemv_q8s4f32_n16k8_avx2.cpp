// Decode GEMV on AVX2: block-32 int8 activations x n16k8 int4 weights with per-group fp16
// scales, float out (linear_q8b32_s4_reference bit for bit). Each n16k8 block is two ymm halves
// (columns 0-7, 8-15). VPMADDUBSW(u, q) with codes u in [0, 15] and |q| <= 127: the low plus
// high nibble pair sums (4 products) are at most 7620, below the int16 saturation; VPMADDWD with
// ones widens to int32 exactly, then i_b = sum - z' * s_b. Compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {

namespace {

constexpr int kHalf = kAvx2Lanes;
constexpr int kNibbleMask = 0x0F;
constexpr int64_t kOctsPerBlock = 4;  // n16k8 blocks in one 32-value activation block

struct Kernel {
  using Args = GemvQ8S4Args;
  static constexpr int kMaxRows = 2;
  static constexpr int kMaxBlocks = 1;

  template <int MR, int NR>
  static void tile(const GemvQ8S4Args& args, int64_t m0, int64_t nb) {
    static_assert(NR == 1, "one 16-column block per tile");
    const S4N16K8View& w = args.w;
    const int64_t octs = w.kp / kS4BlockK;
    const int64_t blocks_per_group = w.groups == 1 ? args.kb : w.group_size / (kOctsPerBlock * kS4BlockK);
    const uint8_t* wp = w.data + nb * octs * kS4BlockBytes;
    const int8_t* qp[MR];
    row_pointers(args.q, m0, args.ldq, qp);
    const __m256i nibble = _mm256_set1_epi8(kNibbleMask);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 t[MR][2];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) t[r][0] = t[r][1] = _mm256_setzero_ps();

    for (int64_t g = 0; g < w.groups; ++g) {
      __m256i zc[2];
      __m256 sc[2], u[MR][2];
      #pragma GCC unroll 16
      for (int h = 0; h < 2; ++h) {
        const int64_t meta = (nb * w.groups + g) * kS4BlockN + h * kHalf;
        zc[h] = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.zeros + meta)));
        // fp16 -> fp32 is exact (VCVTPH2PS, F16C): the same float the reference multiplies by.
        sc[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales + meta)));
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) u[r][h] = _mm256_setzero_ps();
      }
      const int64_t b_end = (g + 1) * blocks_per_group < args.kb ? (g + 1) * blocks_per_group : args.kb;
      for (int64_t b = g * blocks_per_group; b < b_end; ++b) {
        __m256i acc[MR][2];
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
        const int64_t o_end = (b + 1) * kOctsPerBlock < octs ? (b + 1) * kOctsPerBlock : octs;
        for (int64_t o = b * kOctsPerBlock; o < o_end; ++o) {
          __m256i a_lo[MR], a_hi[MR];
          #pragma GCC unroll 16
          for (int r = 0; r < MR; ++r) {
            a_lo[r] = _mm256_set1_epi32(load_u32(qp[r] + o * kS4BlockK));
            a_hi[r] = _mm256_set1_epi32(load_u32(qp[r] + o * kS4BlockK + kS8BlockK));
          }
          #pragma GCC unroll 16
          for (int h = 0; h < 2; ++h) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + o * kS4BlockBytes + h * 32));
            const __m256i lo = _mm256_and_si256(v, nibble);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, kS4NibbleBits), nibble);
            #pragma GCC unroll 16
            for (int r = 0; r < MR; ++r) {
              const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, a_lo[r]), _mm256_maddubs_epi16(hi, a_hi[r]));
              acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(p16, ones));
            }
          }
        }
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          const __m256i s = _mm256_set1_epi32(args.s[(m0 + r) * args.kb + b]);
          const __m256 d = _mm256_set1_ps(args.d[(m0 + r) * args.kb + b]);
          #pragma GCC unroll 16
          for (int h = 0; h < 2; ++h) {
            const __m256i i = _mm256_sub_epi32(acc[r][h], _mm256_mullo_epi32(zc[h], s));
            u[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), d, u[r][h]);
          }
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r)
        #pragma GCC unroll 16
        for (int h = 0; h < 2; ++h) t[r][h] = _mm256_fmadd_ps(u[r][h], sc[h], t[r][h]);
    }

    #pragma GCC unroll 16
    for (int h = 0; h < 2; ++h) {
      const int64_t n0 = nb * kS4BlockN + h * kHalf;
      const __m256i mask = lane_mask(w.n - n0);
      const __m256 bias = args.bias != nullptr ? _mm256_maskload_ps(args.bias + n0, mask) : _mm256_setzero_ps();
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) _mm256_maskstore_ps(args.y + (m0 + r) * args.ldy + n0, mask, _mm256_add_ps(t[r][h], bias));
    }
  }
};

}  // namespace

void gemv_q8s4f32_n16k8_avx2(const GemvQ8S4Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
