// Decode GEMV on AVX2: block-32 int8 activations x n16k4 int8 weights, float out
// (linear_q8b32_s8_reference bit for bit). Each n16k4 block is two ymm halves (columns 0-7,
// 8-15). VPMADDUBSW(|w|, sign(q, w)): |w| <= 128 and |q| <= 127, so a pair is at most
// 2 * 128 * 127 = 32512, below the int16 saturation; VPMADDWD with ones widens to int32 exactly.
// Compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/tile_driver.h"

namespace qforge::kernels::detail {

namespace {


struct Kernel {
  using Args = GemvQ8S8Args;
  static constexpr int kMaxRows = 2;
  static constexpr int kMaxBlocks = 1;

  template <int MR, int NR>
  static void tile(const GemvQ8S8Args& args, int64_t m0, int64_t nb) {
    static_assert(NR == 1, "one 16-column block per tile");
    const S8N16K4View& w = args.w;
    const int64_t quads = w.kp / kS8BlockK;
    const TileOperands<MR, 1, int8_t, int8_t> op(w.data, nb, quads * kS8BlockBytes, args.q, m0, args.ldq);
    __m256 u[MR][2];
    fill_tile(u, _mm256_setzero_ps());

    for (int64_t b = 0; b < args.kb; ++b) {
      const int64_t q1 = chunk_end(b, kQuadsPerBlock, quads);
      __m256i acc[MR][1][2];
      s8_dot_quads<MR, 1>(op.w, op.a, b * kQuadsPerBlock, q1, acc);
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m256 d = _mm256_set1_ps(args.d[(m0 + r) * args.kb + b]);
        #pragma GCC unroll 16
        for (int h = 0; h < 2; ++h) u[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][0][h]), d, u[r][h]);
      }
    }
    store_halves<MR, 1>(args.y, args.ldy, m0, nb, w.n, args.w_scale, args.bias,
                        [&](int r, int, int h, __m256 ws, __m256 bias) {
                          return _mm256_add_ps(_mm256_mul_ps(u[r][h], ws), bias);
                        });
  }
};

}  // namespace

void gemv_q8s8f32_n16k4_avx2(const GemvQ8S8Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
