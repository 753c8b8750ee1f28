// Small-M int8 x int4 GEMM on AVX2 with per-group scales, float output (semantics of
// gemm_s8s4f32_reference). Each n16k8 block is two ymm halves (columns 0-7, 8-15).
// VPMADDUBSW(u, a) with codes u in [0, 15] and |a| <= 127: a pair is at most 2 * 15 * 127 =
// 3810, and the low-nibble plus high-nibble pair sums (4 products) at most 7620, far below the
// int16 saturation at 32767; VPMADDWD with ones then widens to int32 exactly.
// Group scales are fp16 (F16C's VCVTPH2PS widens them). Compiled with -mavx2 -mfma -mf16c.
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

struct Kernel {
  using Args = GemvS4Args;
  static constexpr int kMaxRows = 2;
  static constexpr int kMaxBlocks = 1;

  template <int MR, int NR>
  static void tile(const GemvS4Args& args, int64_t m0, int64_t nb) {
    static_assert(NR == 1, "one 16-column block per tile");
    const S4N16K8View& w = args.w;
    const int64_t kblocks = w.kp / kS4BlockK;
    const int64_t blocks_per_group = w.group_size / kS4BlockK;
    const uint8_t* wp = w.data + nb * kblocks * kS4BlockBytes;
    const int8_t* ap[MR];
    row_pointers(args.a, m0, args.lda, ap);
    const __m256i nibble = _mm256_set1_epi8(kNibbleMask);
    const __m256i ones = _mm256_set1_epi16(1);

    __m256 t[MR][2];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) t[r][0] = t[r][1] = _mm256_setzero_ps();

    for (int64_t g = 0; g < w.groups; ++g) {
      __m256i acc[MR][2];
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
      const int64_t kb_end = (g + 1) * blocks_per_group < kblocks ? (g + 1) * blocks_per_group : kblocks;
      for (int64_t kb = g * blocks_per_group; kb < kb_end; ++kb) {
        __m256i a_lo[MR], a_hi[MR];
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          a_lo[r] = _mm256_set1_epi32(load_u32(ap[r] + kb * kS4BlockK));
          a_hi[r] = _mm256_set1_epi32(load_u32(ap[r] + kb * kS4BlockK + kS8BlockK));
        }
        #pragma GCC unroll 16
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(wp + kb * kS4BlockBytes + h * 32));
          const __m256i lo = _mm256_and_si256(v, nibble);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, kS4NibbleBits), nibble);
          #pragma GCC unroll 16
          for (int r = 0; r < MR; ++r) {
            const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, a_lo[r]),
                                                 _mm256_maddubs_epi16(hi, a_hi[r]));
            acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(p16, ones));
          }
        }
      }
      #pragma GCC unroll 16
      for (int h = 0; h < 2; ++h) {
        const int64_t meta = (nb * w.groups + g) * kS4BlockN + h * kHalf;
        const __m256i z = _mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.zeros + meta)));
        // fp16 -> fp32 is exact (VCVTPH2PS, F16C): the same float the reference multiplies by.
        const __m256 s =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales + meta)));
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          const __m256i corr =
              _mm256_mullo_epi32(z, _mm256_set1_epi32(args.a_group_sum[(m0 + r) * w.groups + g]));
          const __m256i a = _mm256_sub_epi32(acc[r][h], corr);
          t[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), s, t[r][h]);
        }
      }
    }

    #pragma GCC unroll 16
    for (int h = 0; h < 2; ++h) {
      const int64_t n0 = nb * kS4BlockN + h * kHalf;
      const __m256i mask = lane_mask(w.n - n0);
      const __m256 b =
          args.bias != nullptr ? _mm256_maskload_ps(args.bias + n0, mask) : _mm256_setzero_ps();
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m256 y = _mm256_fmadd_ps(t[r][h], _mm256_set1_ps(args.a_scale[m0 + r]), b);
        _mm256_maskstore_ps(args.y + (m0 + r) * args.ldy + n0, mask, y);
      }
    }
  }
};

}  // namespace

void gemv_s8s4f32_n16k8_avx2(const GemvS4Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
