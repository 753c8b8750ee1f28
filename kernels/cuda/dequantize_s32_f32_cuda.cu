// Dequantizing epilogue on the GPU (see dequantize_s32_f32_cuda.h).
#include "kernels/cuda/dequantize_s32_f32_cuda.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/epilogue_math.h"
#include "kernels/cuda/launch.h"

namespace qforge::cuda {
namespace {

__global__ void dequantize_kernel(const int32_t* acc, int64_t ldacc, const float* a_scale,
                                  const float* w_scale, const float* bias, float* y, int64_t M,
                                  int64_t N) {
  const int64_t total = M * N;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t m = i / N, n = i % N;
    y[i] = dequantize_s32_f32_value(acc[m * ldacc + n], a_scale[m], w_scale[n],
                                    bias != nullptr ? bias[n] : 0.0f);
  }
}

}  // namespace

void dequantize_s32_f32_cuda(const int32_t* acc, int64_t ldacc, const float* a_scale,
                             const float* w_scale, const float* bias, float* y, int64_t M, int64_t N,
                             cudaStream_t stream) {
  QF_REQUIRE(M >= 0 && N >= 0 && ldacc >= N, "kernels/cuda: dequantize_s32_f32_cuda got M=", M,
             " N=", N, " ldacc=", ldacc);
  if (M == 0 || N == 0) return;
  dequantize_kernel<<<grid_stride_blocks(M * N), kGridStrideThreads, 0, stream>>>(
      acc, ldacc, a_scale, w_scale, bias, y, M, N);
  check_cuda(cudaGetLastError(), "dequantize_s32_f32_cuda launch");
}

}  // namespace qforge::cuda
