// LSQ backward on the GPU (see lsq_backward_cuda.h): one block per (channel, chunk) writes dx and
// its chunk's two double sums; a second launch adds each channel's chunks in order.
#include "fake_quant/cuda/lsq_backward_cuda.h"

namespace qforge::cuda {
namespace {

constexpr int kThreads = 256;

// One element of lsq_run_reference: dx, and its dScale / dZeroPoint terms (float, as the
// reference evaluates them before adding to its double sums).
struct LsqTerms {
  float dx, dscale, dzero;
};
__device__ __forceinline__ LsqTerms lsq_element(float x, float dy, const fq::LsqGrid& g) {
  const float q = rintf(__fadd_rn(g.zero_point, __fmul_rn(x, g.inv_scale)));
  if (q < g.quant_min || q > g.quant_max) {
    const float bound = q < g.quant_min ? __fsub_rn(g.quant_min, g.zero_point) : __fsub_rn(g.quant_max, g.zero_point);
    return {0.0f, __fmul_rn(__fmul_rn(dy, bound), g.grad_factor),
            __fmul_rn(__fmul_rn(__fmul_rn(dy, -1.0f), g.scale), g.grad_factor)};
  }
  const float xfq = __fmul_rn(__fsub_rn(q, g.zero_point), g.scale);
  return {dy, __fmul_rn(__fmul_rn(__fmul_rn(dy, __fsub_rn(xfq, x)), g.inv_scale), g.grad_factor), 0.0f};
}

__global__ void __launch_bounds__(kThreads)
    lsq_chunk_kernel(const float* __restrict__ x, const float* __restrict__ dy, float* __restrict__ dx, int64_t inner,
                     int64_t chunks, const fq::LsqGrid* __restrict__ grids, double* __restrict__ partial) {
  const int64_t c = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  const int64_t begin = chunk * fq::kLsqChunk;
  const int64_t end = begin + fq::kLsqChunk < inner ? begin + fq::kLsqChunk : inner;
  const fq::LsqGrid g = grids[c];
  const int64_t base = c * inner;
  double s = 0.0, z = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const LsqTerms t = lsq_element(x[base + i], dy[base + i], g);
    dx[base + i] = t.dx;
    s += static_cast<double>(t.dscale);
    z += static_cast<double>(t.dzero);
  }
  // Fixed tree over the block: the same sums on every run.
  __shared__ double ss[kThreads], sz[kThreads];
  ss[threadIdx.x] = s;
  sz[threadIdx.x] = z;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) {
      ss[threadIdx.x] += ss[threadIdx.x + half];
      sz[threadIdx.x] += sz[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int64_t slot = 2 * static_cast<int64_t>(blockIdx.x);  // 2 * (c * chunks + chunk)
    partial[slot] = ss[0];
    partial[slot + 1] = sz[0];
  }
}

__global__ void lsq_reduce_kernel(const double* __restrict__ partial, int64_t C, int64_t chunks, float* dscale,
                                  float* dzero_point) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  double s = 0.0, z = 0.0;
  for (int64_t j = 0; j < chunks; ++j) {
    s += partial[2 * (c * chunks + j)];
    z += partial[2 * (c * chunks + j) + 1];
  }
  dscale[c] = static_cast<float>(s);
  dzero_point[c] = static_cast<float>(z);
}

}  // namespace

cudaError_t lsq_backward_rows(const float* x, const float* dy, float* dx, int64_t C, int64_t inner,
                              const fq::LsqGrid* grids, float* dscale, float* dzero_point, double* workspace,
                              cudaStream_t stream) {
  if (C <= 0) return cudaSuccess;
  const int64_t chunks = inner > 0 ? (inner + fq::kLsqChunk - 1) / fq::kLsqChunk : 1;
  if (C * chunks > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;  // one block per (channel, chunk)
  lsq_chunk_kernel<<<static_cast<unsigned>(C * chunks), kThreads, 0, stream>>>(x, dy, dx, inner, chunks, grids,
                                                                              workspace);
  const int64_t threads = 128;
  lsq_reduce_kernel<<<static_cast<unsigned>((C + threads - 1) / threads), threads, 0, stream>>>(workspace, C, chunks,
                                                                                                   dscale, dzero_point);
  return cudaGetLastError();
}

}  // namespace qforge::cuda
