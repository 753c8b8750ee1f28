// The fallback int8 GEMM kernel: 16 x 16 output tiles, K staged through shared memory.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm_s8s8s32_cuda.h"

namespace qforge::cuda {
namespace {

constexpr int kTile = 16;

__global__ void gemm_s8s8s32_kernel(const int8_t* A, int64_t lda, const int8_t* W, int64_t ldw,
                                    int32_t* C, int64_t ldc, int64_t M, int64_t N, int64_t K) {
  __shared__ int32_t a_tile[kTile][kTile];  // [m][k]
  __shared__ int32_t w_tile[kTile][kTile];  // [n][k]
  const int64_t m = blockIdx.y * int64_t{kTile} + threadIdx.y;
  const int64_t n = blockIdx.x * int64_t{kTile} + threadIdx.x;
  const int64_t w_row = blockIdx.x * int64_t{kTile} + threadIdx.y;  // W row this thread loads
  int32_t acc = 0;
  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    const int64_t k = k0 + threadIdx.x;
    a_tile[threadIdx.y][threadIdx.x] = (m < M && k < K) ? A[m * lda + k] : 0;
    w_tile[threadIdx.y][threadIdx.x] = (w_row < N && k < K) ? W[w_row * ldw + k] : 0;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTile; ++i) acc += a_tile[threadIdx.y][i] * w_tile[threadIdx.x][i];
    __syncthreads();
  }
  if (m < M && n < N) C[m * ldc + n] = acc;
}

}  // namespace

void gemm_s8s8s32_cuda(const int8_t* A, int64_t lda, const int8_t* W, int64_t ldw, int32_t* C,
                       int64_t ldc, int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
  QF_REQUIRE(M >= 0 && N >= 0 && K >= 0 && lda >= K && ldw >= K && ldc >= N,
             "kernels/cuda: gemm_s8s8s32_cuda got M=", M, " N=", N, " K=", K, " lda=", lda,
             " ldw=", ldw, " ldc=", ldc);
  if (M == 0 || N == 0) return;
  const dim3 block(kTile, kTile);
  const dim3 grid(static_cast<unsigned>((N + kTile - 1) / kTile),
                  static_cast<unsigned>((M + kTile - 1) / kTile));
  QF_REQUIRE((M + kTile - 1) / kTile <= 65535, "kernels/cuda: gemm_s8s8s32_cuda: M=", M,
             " exceeds the grid's y limit");
  gemm_s8s8s32_kernel<<<grid, block, 0, stream>>>(A, lda, W, ldw, C, ldc, M, N, K);
  check_cuda(cudaGetLastError(), "gemm_s8s8s32_cuda launch");
}

}  // namespace qforge::cuda
