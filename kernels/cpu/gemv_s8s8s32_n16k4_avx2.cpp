// Small-M int8 GEMM on AVX2: n16k4 weight blocks as two ymm halves (columns 0-7, 8-15).
// VPMADDUBSW multiplies u8 x s8 and adds pairs with int16 SATURATION, so operands are arranged
// to make saturation impossible: the unsigned operand is |w| (<= 128, and |-128| = 0x80 is read
// correctly as 128) and the signed one is a * sign(w) (|a| <= 127 because activations are on
// the symmetric grid [-127, 127]); a pair sums to at most 2 * 128 * 127 = 32512 < 32767.
// VPMADDWD with ones then widens pairs to int32 exactly. Compiled with -mavx2 -mfma.
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {

namespace {

constexpr int kHalf = kAvx2Lanes;  // columns per ymm half of a 16-column block

// sum over 4 k of a * w per int32 lane, exact (see file comment).
inline __m256i dot4(__m256i a, __m256i w, __m256i ones) {
  const __m256i prod16 = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
  return _mm256_madd_epi16(prod16, ones);
}

// Out of line on purpose: inlined, the branchy epilogue makes GCC 12 spill the accumulators
// inside the k loop.
template <int MR, int NR>
__attribute__((noinline)) void finish_tile(const GemvS8Args& args, int64_t m0, int64_t nb0,
                                           const int32_t (*sums)[NR][2][kHalf]) {
  const S8N16K4View& w = args.w;
  #pragma GCC unroll 16
  for (int c = 0; c < NR; ++c) {
    #pragma GCC unroll 16
    for (int h = 0; h < 2; ++h) {
      const int64_t n0 = (nb0 + c) * kS8BlockN + h * kHalf;
      const __m256i mask = lane_mask(w.n - n0);
      if (args.c != nullptr) {
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          const __m256i acc = _mm256_load_si256(reinterpret_cast<const __m256i*>(sums[r][c][h]));
          _mm256_maskstore_epi32(args.c + (m0 + r) * args.ldc + n0, mask, acc);
        }
        continue;
      }
      const __m256 ws = _mm256_maskload_ps(args.w_scale + n0, mask);
      const __m256 b =
          args.bias != nullptr ? _mm256_maskload_ps(args.bias + n0, mask) : _mm256_setzero_ps();
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m256i acc = _mm256_load_si256(reinterpret_cast<const __m256i*>(sums[r][c][h]));
        const __m256 f = _mm256_cvtepi32_ps(acc);
        const __m256 y =
            _mm256_fmadd_ps(_mm256_mul_ps(f, ws), _mm256_set1_ps(args.a_scale[m0 + r]), b);
        _mm256_maskstore_ps(args.y + (m0 + r) * args.ldy + n0, mask, y);
      }
    }
  }
}

struct Kernel {
  using Args = GemvS8Args;
  static constexpr int kMaxRows = 2;    // rows per tile: MR x NR x 2 halves <= 8 ymm accumulators
  static constexpr int kMaxBlocks = 2;  // 16-column blocks per tile

  template <int MR, int NR>
  static void tile(const GemvS8Args& args, int64_t m0, int64_t nb0) {
    const S8N16K4View& w = args.w;
    const int64_t kblocks = w.kp / kS8BlockK;
    const int8_t* wp[NR];
    block_pointers(w.data, nb0, kblocks * kS8BlockBytes, wp);
    const int8_t* ap[MR];
    row_pointers(args.a_s8, m0, args.lda, ap);
    const __m256i ones = _mm256_set1_epi16(1);

    __m256i acc[MR][NR][2];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) acc[r][c][0] = acc[r][c][1] = _mm256_setzero_si256();

    for (int64_t kb = 0; kb < kblocks; ++kb) {
      __m256i av[MR];
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) av[r] = _mm256_set1_epi32(load_u32(ap[r] + kb * kS8BlockK));
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) {
        const int8_t* block = wp[c] + kb * kS8BlockBytes;
        #pragma GCC unroll 16
        for (int h = 0; h < 2; ++h) {
          const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + h * 32));
          #pragma GCC unroll 16
          for (int r = 0; r < MR; ++r) {
            acc[r][c][h] = _mm256_add_epi32(acc[r][c][h], dot4(av[r], wv, ones));
          }
        }
      }
    }

    alignas(32) int32_t sums[MR][NR][2][kHalf];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c)
        #pragma GCC unroll 16
        for (int h = 0; h < 2; ++h) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(sums[r][c][h]), acc[r][c][h]);
        }
    finish_tile<MR, NR>(args, m0, nb0, sums);
  }
};

}  // namespace

void gemv_s8s8s32_n16k4_avx2(const GemvS8Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
