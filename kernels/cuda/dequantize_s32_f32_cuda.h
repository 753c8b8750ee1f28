// CUDA dequantizing epilogue of the int8 GEMM, the twin of dequantize_s32_f32_reference:
//   y[m, n] = fmaf(float(acc[m, n]) * w_scale[n], a_scale[m], bias ? bias[n] : 0)
// evaluated by dequantize_s32_f32_value (epilogue_math.h). Tested on a GPU by tests/cuda/cuda_kernels_test.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace qforge::cuda {

// acc [M, ldacc] int32 -> y [M, N] float (dense). bias may be null. Device pointers, stream-ordered.
void dequantize_s32_f32_cuda(const int32_t* acc, int64_t ldacc, const float* a_scale,
                             const float* w_scale, const float* bias, float* y, int64_t M, int64_t N,
                             cudaStream_t stream);

}  // namespace qforge::cuda
