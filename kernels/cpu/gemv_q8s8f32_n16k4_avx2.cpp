// Decode GEMV on AVX2: block-32 int8 activations x n16k4 int8 weights, float out
// (linear_q8b32_s8_reference bit for bit). Each n16k4 block is two ymm halves (columns 0-7,
// 8-15). VPMADDUBSW(|w|, sign(q, w)): |w| <= 128 and |q| <= 127, so a pair is at most
// 2 * 128 * 127 = 32512, below the int16 saturation; VPMADDWD with ones widens to int32 exactly.
// Compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {

namespace {

constexpr int kHalf = kAvx2Lanes;
constexpr int64_t kQuadsPerBlock = 8;  // n16k4 blocks in one 32-value activation block

struct Kernel {
  using Args = GemvQ8S8Args;
  static constexpr int kMaxRows = 2;
  static constexpr int kMaxBlocks = 1;

  template <int MR, int NR>
  static void tile(const GemvQ8S8Args& args, int64_t m0, int64_t nb) {
    static_assert(NR == 1, "one 16-column block per tile");
    const S8N16K4View& w = args.w;
    const int64_t quads = w.kp / kS8BlockK;
    const int8_t* wp = w.data + nb * quads * kS8BlockBytes;
    const int8_t* qp[MR];
    row_pointers(args.q, m0, args.ldq, qp);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 u[MR][2];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) u[r][0] = u[r][1] = _mm256_setzero_ps();

    for (int64_t b = 0; b < args.kb; ++b) {
      __m256i acc[MR][2];
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
      const int64_t q1 = (b + 1) * kQuadsPerBlock < quads ? (b + 1) * kQuadsPerBlock : quads;
      for (int64_t kq = b * kQuadsPerBlock; kq < q1; ++kq) {
        __m256i a[MR];
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) a[r] = _mm256_set1_epi32(load_u32(qp[r] + kq * kS8BlockK));
        #pragma GCC unroll 16
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + kq * kS8BlockBytes + h * 32));
          const __m256i av = _mm256_abs_epi8(v);
          #pragma GCC unroll 16
          for (int r = 0; r < MR; ++r) {
            const __m256i p16 = _mm256_maddubs_epi16(av, _mm256_sign_epi8(a[r], v));
            acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(p16, ones));
          }
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m256 d = _mm256_set1_ps(args.d[(m0 + r) * args.kb + b]);
        #pragma GCC unroll 16
        for (int h = 0; h < 2; ++h) u[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][h]), d, u[r][h]);
      }
    }

    #pragma GCC unroll 16
    for (int h = 0; h < 2; ++h) {
      const int64_t n0 = nb * kS8BlockN + h * kHalf;
      const __m256i mask = lane_mask(w.n - n0);
      const __m256 ws = _mm256_maskload_ps(args.w_scale + n0, mask);
      const __m256 bias = args.bias != nullptr ? _mm256_maskload_ps(args.bias + n0, mask) : _mm256_setzero_ps();
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        _mm256_maskstore_ps(args.y + (m0 + r) * args.ldy + n0, mask, _mm256_add_ps(_mm256_mul_ps(u[r][h], ws), bias));
      }
    }
  }
};

}  // namespace

void gemv_q8s8f32_n16k4_avx2(const GemvQ8S8Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
