// The dequantizing epilogue of the int8 GEMM as one host/device function: the CUDA epilogue
// kernel evaluates it per element and tests/kernels/cuda_math_test.cpp checks it bit for bit
// against dequantize_s32_f32_reference (kernels/cpu/reference.h), which defines the result.
#pragma once

#include <cstdint>

#include "framework/core/host_device.h"

namespace qforge::cuda {

// y = fmaf(float(acc) * w_scale, a_scale, bias): int -> float rounds to nearest even, the product
// is rounded once, then one fused multiply-add (bias = 0 when the layer has none).
QF_HOST_DEVICE float dequantize_s32_f32_value(int32_t acc, float a_scale, float w_scale, float bias) {
  return qf_fma_rn(qf_mul_rn(qf_i2f_rn(acc), w_scale), a_scale, bias);
}

}  // namespace qforge::cuda
