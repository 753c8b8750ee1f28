// CUDA fake-quant kernels: grid-stride loops over the shared scalar formulas.
#include "fake_quant/cuda/fake_quantize_cuda.h"

namespace qforge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < kMaxBlocks ? (b > 0 ? b : 1) : kMaxBlocks);
}

__global__ void per_tensor_kernel(const float* x, float* y, bool* mask, int64_t n, fq::AffineGrid g) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = fq::fake_quantize_value(x[i], g, mask ? mask + i : nullptr);
}

__global__ void per_channel_kernel(const float* x, float* y, bool* mask, int64_t n, int64_t C,
                                   int64_t inner, const float* scale, const float* zero_point,
                                   float qmin, float qmax) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = (i / inner) % C;
    const fq::AffineGrid g = fq::make_grid(scale[c], zero_point[c], qmin, qmax);
    y[i] = fq::fake_quantize_value(x[i], g, mask ? mask + i : nullptr);
  }
}

__global__ void float8_kernel(const float* x, float* y, bool* mask, int64_t n, int64_t C, int64_t inner,
                              const float* scale, fq::Float8Format f) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = fq::fake_quantize_float8_value(x[i], scale[(i / inner) % C], f, mask ? mask + i : nullptr);
}

__global__ void backward_kernel(const float* dy, const bool* mask, float* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dx[i] = mask[i] ? dy[i] : 0.0f;
}

}  // namespace

cudaError_t fake_quantize_per_tensor(const float* x, float* y, bool* mask, int64_t n,
                                     const fq::AffineGrid& grid, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  per_tensor_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, mask, n, grid);
  return cudaGetLastError();
}

cudaError_t fake_quantize_per_channel(const float* x, float* y, bool* mask, int64_t n, int64_t C,
                                      int64_t inner, const float* scale, const float* zero_point,
                                      float quant_min, float quant_max, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (C <= 0 || inner <= 0) return cudaErrorInvalidValue;
  per_channel_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, mask, n, C, inner, scale, zero_point,
                                                             quant_min, quant_max);
  return cudaGetLastError();
}

cudaError_t fake_quantize_float8(const float* x, float* y, bool* mask, int64_t n, int64_t C, int64_t inner,
                                 const float* scale, fq::Float8Format format, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (C <= 0 || inner <= 0) return cudaErrorInvalidValue;
  float8_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, mask, n, C, inner, scale, format);
  return cudaGetLastError();
}

cudaError_t fake_quantize_backward(const float* dy, const bool* mask, float* dx, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dy, mask, dx, n);
  return cudaGetLastError();
}

}  // namespace qforge::cuda
