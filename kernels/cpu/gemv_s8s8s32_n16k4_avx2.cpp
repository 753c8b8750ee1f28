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

namespace qforge::kernels::detail {

namespace {

constexpr int kHalf = kAvx2Lanes;  // columns per ymm half of a 16-column block

// Out of line on purpose: inlined, the branchy epilogue makes GCC 12 spill the accumulators
// inside the k loop.
template <int MR, int NR>
__attribute__((noinline)) void finish_tile(const GemvS8Args& args, int64_t m0, int64_t nb0,
                                           const int32_t (*sums)[NR][2][kHalf]) {
  const auto acc = [&](int r, int c, int h) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(sums[r][c][h]));
  };
  if (args.c != nullptr) {
    #pragma GCC unroll 16
    for (int c = 0; c < NR; ++c)
      #pragma GCC unroll 16
      for (int h = 0; h < 2; ++h) {
        const int64_t n0 = (nb0 + c) * kS8BlockN + h * kHalf;
        const __m256i mask = lane_mask(args.w.n - n0);
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) _mm256_maskstore_epi32(args.c + (m0 + r) * args.ldc + n0, mask, acc(r, c, h));
      }
    return;
  }
  store_halves<MR, NR>(args.y, args.ldy, m0, nb0, args.w.n, args.w_scale, args.bias,
                       [&](int r, int c, int h, __m256 ws, __m256 b) {
                         const __m256 f = _mm256_cvtepi32_ps(acc(r, c, h));
                         return _mm256_fmadd_ps(_mm256_mul_ps(f, ws), _mm256_set1_ps(args.a_scale[m0 + r]), b);
                       });
}

struct Kernel {
  using Args = GemvS8Args;
  static constexpr int kMaxRows = 2;    // rows per tile: MR x NR x 2 halves <= 8 ymm accumulators
  static constexpr int kMaxBlocks = 2;  // 16-column blocks per tile

  template <int MR, int NR>
  static void tile(const GemvS8Args& args, int64_t m0, int64_t nb0) {
    const S8N16K4View& w = args.w;
    const int64_t kblocks = w.kp / kS8BlockK;
    const TileOperands<MR, NR, int8_t, int8_t> op(w.data, nb0, kblocks * kS8BlockBytes, args.a_s8, m0, args.lda);
    __m256i acc[MR][NR][2];
    s8_dot_quads<MR, NR>(op.w, op.a, 0, kblocks, acc);

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
