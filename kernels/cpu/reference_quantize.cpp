// Reference dynamic activation quantization (float -> symmetric int8 per row / per tensor).
#include <algorithm>
#include <cmath>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/reference.h"

namespace qforge::kernels {

namespace {
float row_amax(const float* x, int64_t K, int64_t m) {
  float amax = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    QF_REQUIRE(std::isfinite(x[k]), "kernels/cpu: activation row ", m, " column ", k,
               " is not finite (", x[k], "); dynamic quantization needs finite inputs");
    amax = std::max(amax, std::fabs(x[k]));
  }
  return amax;
}
}  // namespace

void quantize_rows_s8_reference(const float* x, int64_t M, int64_t K, ActScale mode, int8_t* q,
                                int64_t ldq, float* a_scale, int qmax, float clip) {
  QF_REQUIRE(M >= 0 && K >= 0 && ldq >= K, "kernels/cpu: quantize_rows_s8 got M=", M, " K=", K,
             " ldq=", ldq);
  QF_REQUIRE(qmax >= 1 && qmax <= kActQMax, "kernels/cpu: quantize_rows_s8 got qmax=", qmax, " (1 to 127)");
  QF_REQUIRE(clip > 0.0f && clip <= 1.0f, "kernels/cpu: quantize_rows_s8 got clip=", clip, " (in (0, 1])");
  std::vector<float> amax(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) amax[m] = row_amax(x + m * K, K, m);
  if (mode == ActScale::kPerTensor) {
    const float all = M > 0 ? *std::max_element(amax.begin(), amax.end()) : 0.0f;
    std::fill(amax.begin(), amax.end(), all);
  }
  for (int64_t m = 0; m < M; ++m) {
    const float range = clip == 1.0f ? amax[m] : amax[m] * clip;
    const float scale = range > 0.0f ? range / static_cast<float>(qmax) : 1.0f;
    const float inv = 1.0f / scale;
    a_scale[m] = scale;
    for (int64_t k = 0; k < K; ++k) {
      const float r = std::nearbyint(x[m * K + k] * inv);
      const float c = std::min(std::max(r, -static_cast<float>(qmax)), static_cast<float>(qmax));
      q[m * ldq + k] = static_cast<int8_t>(c);
    }
    for (int64_t k = K; k < ldq; ++k) q[m * ldq + k] = 0;
  }
}

void quantize_static_s8_reference(const float* x, int64_t count, float inv, int qmin, int qmax, int8_t* q) {
  QF_REQUIRE(count >= 0 && -128 <= qmin && qmin <= qmax && qmax <= 127, "kernels/cpu: quantize_static_s8 got count=",
             count, " grid [", qmin, ", ", qmax, "]");
  for (int64_t i = 0; i < count; ++i) {
    QF_REQUIRE(std::isfinite(x[i]), "kernels/cpu: activation element ", i, " is not finite (", x[i],
               "); static int8 quantization needs finite inputs");
    const float r = std::nearbyint(x[i] * inv);
    q[i] = static_cast<int8_t>(std::min(std::max(r, static_cast<float>(qmin)), static_cast<float>(qmax)));
  }
}

}  // namespace qforge::kernels
