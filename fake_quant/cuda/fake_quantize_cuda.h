// CUDA twins of the fake-quant CPU kernels. They evaluate the same scalar formulas
// (fake_quant/fake_quant_math.h), which the CPU test suite checks against PyTorch golden vectors.
// Built when CMake finds a CUDA compiler; CI compiles and links it, scripts/gpu-check runs it on a
// GPU (tests/cuda/cuda_kernels_test, bit for bit against the CPU reference kernels).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fake_quant/fake_quant_math.h"

namespace qforge::cuda {

// y = fake_quantize(x) on one affine grid; mask (nullable) gets the STE mask. Device pointers.
cudaError_t fake_quantize_per_tensor(const float* x, float* y, bool* mask, int64_t n,
                                     const fq::AffineGrid& grid, cudaStream_t stream);

// x viewed as [outer, C, inner]; scale/zero_point hold C floats on the device.
cudaError_t fake_quantize_per_channel(const float* x, float* y, bool* mask, int64_t n, int64_t C,
                                      int64_t inner, const float* scale, const float* zero_point,
                                      float quant_min, float quant_max, cudaStream_t stream);

// Float8 grid, one scale per run of `inner` elements (per-tensor: inner = n, scale[0]).
cudaError_t fake_quantize_float8(const float* x, float* y, bool* mask, int64_t n, int64_t C,
                                 int64_t inner, const float* scale, fq::Float8Format format,
                                 cudaStream_t stream);

// dx = mask ? dy : 0
cudaError_t fake_quantize_backward(const float* dy, const bool* mask, float* dx, int64_t n,
                                   cudaStream_t stream);

}  // namespace qforge::cuda
