// Dynamic int8 activation quantization on the GPU (see quantize_rows_s8_cuda.h).
#include "kernels/cuda/quantize_rows_s8_cuda.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/quantize_rows_s8_math.h"

namespace qforge::cuda {
namespace {

constexpr int kThreads = 256;  // power of two: the tree reductions below halve it
constexpr int64_t kMaxGridX = 2147483647;  // one block per row; gridDim.x limit

// Max is exact and order-free, so the parallel reduction gives the reference's amax bit for bit.
__device__ float block_max(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  const float r = shared[0];
  __syncthreads();
  return r;
}

// amax[m] = max_k |x[m, k]| (one block per row); records the first non-finite index.
__global__ void row_amax_kernel(const float* x, int64_t K, float* amax,
                                unsigned long long* first_nonfinite) {
  __shared__ float shared[kThreads];
  const int64_t m = blockIdx.x;
  float a = 0.0f;
  for (int64_t k = threadIdx.x; k < K; k += kThreads) {
    const float v = x[m * K + k];
    if (!isfinite(v)) {
      if (first_nonfinite != nullptr) atomicMin(first_nonfinite, static_cast<unsigned long long>(m * K + k));
    } else {
      a = fmaxf(a, fabsf(v));
    }
  }
  a = block_max(a, shared);
  if (threadIdx.x == 0) amax[m] = a;
}

// Per tensor: every amax[m] becomes the maximum over all rows (one block).
__global__ void tensor_amax_kernel(float* amax, int64_t M) {
  __shared__ float shared[kThreads];
  float a = 0.0f;
  for (int64_t m = threadIdx.x; m < M; m += kThreads) a = fmaxf(a, amax[m]);
  a = block_max(a, shared);
  for (int64_t m = threadIdx.x; m < M; m += kThreads) amax[m] = a;
}

// a_scale holds amax on entry and the scale on exit (one block per row).
__global__ void quantize_kernel(const float* x, int64_t K, int8_t* q, int64_t ldq, float* a_scale) {
  const int64_t m = blockIdx.x;
  const float scale = act_scale_from_amax(a_scale[m]);
  const float inv = act_inv_scale(scale);
  for (int64_t k = threadIdx.x; k < ldq; k += kThreads)
    q[m * ldq + k] = k < K ? quantize_act_s8(x[m * K + k], inv) : int8_t{0};
  __syncthreads();  // every thread has read amax before it is overwritten
  if (threadIdx.x == 0) a_scale[m] = scale;
}

// Per row in one pass of launches: amax (recording the first non-finite index), then the row's
// codes and scale, one block per row (the second read of the row hits the L1 / L2).
__global__ void quantize_rows_per_row_kernel(const float* x, int64_t K, int8_t* q, int64_t ldq, float* a_scale,
                                             unsigned long long* first_nonfinite) {
  __shared__ float shared[kThreads];
  const int64_t m = blockIdx.x;
  const float* row = x + m * K;
  float a = 0.0f;
  for (int64_t k = threadIdx.x; k < K; k += kThreads) {
    const float v = row[k];
    if (!isfinite(v)) {
      if (first_nonfinite != nullptr) atomicMin(first_nonfinite, static_cast<unsigned long long>(m * K + k));
    } else {
      a = fmaxf(a, fabsf(v));
    }
  }
  a = block_max(a, shared);
  const float scale = act_scale_from_amax(a);
  const float inv = act_inv_scale(scale);
  for (int64_t k = threadIdx.x; k < ldq; k += kThreads)
    q[m * ldq + k] = k < K ? quantize_act_s8(row[k], inv) : int8_t{0};
  if (threadIdx.x == 0) a_scale[m] = scale;
}

}  // namespace

void quantize_rows_s8_cuda(const float* x, int64_t M, int64_t K, kernels::ActScale mode, int8_t* q,
                           int64_t ldq, float* a_scale, unsigned long long* first_nonfinite,
                           cudaStream_t stream) {
  QF_REQUIRE(M >= 0 && K >= 0 && ldq >= K, "kernels/cuda: quantize_rows_s8_cuda got M=", M, " K=", K,
             " ldq=", ldq);
  QF_REQUIRE(M <= kMaxGridX, "kernels/cuda: quantize_rows_s8_cuda: M=", M, " rows exceed the grid limit");
  if (M == 0) return;
  const auto grid = static_cast<unsigned>(M);
  if (mode == kernels::ActScale::kPerRow) {
    quantize_rows_per_row_kernel<<<grid, kThreads, 0, stream>>>(x, K, q, ldq, a_scale, first_nonfinite);
    check_cuda(cudaGetLastError(), "quantize_rows_s8_cuda launch");
    return;
  }
  row_amax_kernel<<<grid, kThreads, 0, stream>>>(x, K, a_scale, first_nonfinite);
  if (mode == kernels::ActScale::kPerTensor) tensor_amax_kernel<<<1, kThreads, 0, stream>>>(a_scale, M);
  quantize_kernel<<<grid, kThreads, 0, stream>>>(x, K, q, ldq, a_scale);
  check_cuda(cudaGetLastError(), "quantize_rows_s8_cuda launch");
}

void throw_if_nonfinite(const unsigned long long* first_nonfinite, int64_t K, cudaStream_t stream) {
  unsigned long long idx = kNoNonFinite;
  check_cuda(cudaMemcpyAsync(&idx, first_nonfinite, sizeof idx, cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync(first_nonfinite)");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (idx == kNoNonFinite || K <= 0) return;
  throw Error(nonfinite_message(idx, K));
}

std::string nonfinite_message(unsigned long long idx, int64_t K) {
  const auto k64 = static_cast<unsigned long long>(K > 0 ? K : 1);
  return detail::str_cat("kernels/cuda: activation row ", idx / k64, " column ", idx % k64,
                         " is not finite; dynamic quantization needs finite inputs");
}

}  // namespace qforge::cuda
