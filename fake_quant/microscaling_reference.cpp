// Scalar reference of the microscaling formats (MXFP4, NVFP4), written from the definitions: the
// oracle the tensor-level path and the packed weights are tested against.
#include <cmath>

#include "fake_quant/fake_quantize_kernels.h"
#include "fake_quant/microscaling_math.h"
#include "framework/core/error.h"

namespace qforge::fq {

void e2m1_run_reference(const float* x, float* y, bool* mask, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) y[i] = fake_quantize_e2m1_value(x[i], scale, mask ? mask + i : nullptr);
}

void microscaling_run_reference(const float* x, float* y, int64_t n, int block, bool nvfp4, float tensor_scale,
                                float* scales) {
  QF_REQUIRE(block > 0 && n % block == 0, "microscaling_run_reference: ", n, " values are not whole blocks of ", block);
  for (int64_t b = 0; b < n / block; ++b) {
    const float* xb = x + b * block;
    float amax = 0.0f;
    for (int i = 0; i < block; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float s = nvfp4 ? nvfp4_block_scale(amax, tensor_scale) * tensor_scale
                          : std::ldexp(1.0f, mx_shared_exponent(amax));
    if (scales) scales[b] = s;
    e2m1_run_reference(xb, y + b * block, nullptr, block, s);
  }
}

}  // namespace qforge::fq
