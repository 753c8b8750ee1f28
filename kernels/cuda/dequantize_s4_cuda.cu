// int4 weight unpack + dequantization on the GPU (see dequantize_s4_cuda.h).
#include "kernels/cuda/dequantize_s4_cuda.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/unpack_s4_math.h"

namespace qforge::cuda {
namespace {

__global__ void dequantize_s4_kernel(const uint8_t* packed, int64_t N, int64_t K, bool is_signed,
                                     const float* scale, const int32_t* zero, int64_t group_size,
                                     int64_t G, float* w) {
  const int64_t total = N * K;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    w[i] = dequantize_s4_at(packed, i / K, i % K, K, is_signed, scale, zero, group_size, G);
  }
}

}  // namespace

void dequantize_s4_cuda(const uint8_t* packed, int64_t N, int64_t K, bool is_signed,
                        const float* scale, const int32_t* zero, int64_t group_size, float* w,
                        cudaStream_t stream) {
  QF_REQUIRE(N >= 0 && K >= 0 && group_size > 0, "kernels/cuda: dequantize_s4_cuda got N=", N,
             " K=", K, " group_size=", group_size);
  if (N == 0 || K == 0) return;
  const int64_t G = (K + group_size - 1) / group_size;
  dequantize_s4_kernel<<<grid_stride_blocks(N * K), kGridStrideThreads, 0, stream>>>(
      packed, N, K, is_signed, scale, zero, group_size, G, w);
  check_cuda(cudaGetLastError(), "dequantize_s4_cuda launch");
}

}  // namespace qforge::cuda
