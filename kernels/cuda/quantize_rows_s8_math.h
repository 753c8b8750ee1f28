// Dynamic symmetric int8 activation quantization as host/device functions: the CUDA kernel
// evaluates them and tests/kernels/cuda_math_test.cpp checks them bit for bit against
// quantize_rows_s8_reference (kernels/cpu/reference.h), which defines the result.
#pragma once

#include <cstdint>

#include "framework/core/host_device.h"

namespace qforge::cuda {

// Grid [-127, 127], never -128 (kernels/cpu kActQMax; the CPU kernels rely on it).
constexpr int kActQMaxCuda = 127;

// scale = amax > 0 ? amax / 127 : 1 (float division; an all-zero row gets scale 1).
QF_HOST_DEVICE float act_scale_from_amax(float amax) {
  return amax > 0.0f ? qf_div_rn(amax, static_cast<float>(kActQMaxCuda)) : 1.0f;
}

// inv = 1 / scale (float division, not a reciprocal approximation).
QF_HOST_DEVICE float act_inv_scale(float scale) { return qf_div_rn(1.0f, scale); }

// q = clamp(nearbyint(x * inv), -127, 127): float product, round half to even.
QF_HOST_DEVICE int8_t quantize_act_s8(float x, float inv) {
  const float r = qf_nearbyint(qf_mul_rn(x, inv));
  const float lo = r > -static_cast<float>(kActQMaxCuda) ? r : -static_cast<float>(kActQMaxCuda);
  const float c = lo < static_cast<float>(kActQMaxCuda) ? lo : static_cast<float>(kActQMaxCuda);
  return static_cast<int8_t>(c);
}

}  // namespace qforge::cuda
