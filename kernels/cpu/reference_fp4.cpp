// Scalar reference of the MXFP4 / NVFP4 weight-only Linear: the float order of kernels/cpu/fp4_linear.h.
#include <cmath>

#include "framework/core/error.h"
#include "framework/core/qtype.h"
#include "kernels/cpu/fp4_layout.h"

namespace qforge::kernels {

namespace {

// code_of(n, k): the E2M1 code of W[n, k], from unpacked or packed storage.
template <class CodeOf>
void reference(const float* x, int64_t M, CodeOf code_of, const float* scales, int64_t N, int64_t K, int64_t block,
               const float* bias, float* y) {
  QF_REQUIRE(block > 0 && block % kFp4Chunk == 0 && K % block == 0, "linear_f32fp4_reference: block ", block,
             " must be a multiple of ", kFp4Chunk, " dividing K = ", K);
  const int64_t blocks = K / block;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float acc[kFp4Lanes] = {};
      for (int64_t b = 0; b < blocks; ++b) {
        float t[kFp4Lanes] = {};
        for (int64_t c = 0; c < block / kFp4Lanes; ++c) {
          for (int64_t l = 0; l < kFp4Lanes; ++l) {
            const int64_t k = b * block + c * kFp4Lanes + l;
            t[l] = std::fmaf(x[m * K + k], kE2M1Values[code_of(n, k)], t[l]);
          }
        }
        for (int64_t l = 0; l < kFp4Lanes; ++l) acc[l] = std::fmaf(scales[n * blocks + b], t[l], acc[l]);
      }
      for (int64_t w = kFp4Lanes / 2; w >= 1; w /= 2)
        for (int64_t l = 0; l < w; ++l) acc[l] = acc[l] + acc[l + w];
      y[m * N + n] = bias ? acc[0] + bias[n] : acc[0];
    }
  }
}

}  // namespace

void linear_f32fp4_reference(const float* x, int64_t M, const uint8_t* codes, const float* scales, int64_t N,
                             int64_t K, int64_t block, const float* bias, float* y) {
  reference(x, M, [codes, K](int64_t n, int64_t k) { return codes[n * K + k] & 15; }, scales, N, K, block, bias, y);
}

void linear_f32fp4_reference_packed(const float* x, int64_t M, const uint8_t* packed, const float* scales,
                                    int64_t N, int64_t K, int64_t block, const float* bias, float* y) {
  const auto code_of = [packed, K](int64_t n, int64_t k) { return fp4_packed_code(packed + n * (K / 2), k); };
  reference(x, M, code_of, scales, N, K, block, bias, y);
}

}  // namespace qforge::kernels
