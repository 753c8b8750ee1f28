// int8 GEMM on the GPU: C[M, N] (int32) = A[M, K] (int8) x W[N, K]^T (int8), row-major, with
// strides, like gemm_s8s8s32_reference. Two kernels, chosen at run time in this order:
//   gemm_s8s8s32_cublaslt  cuBLASLt IMMA (tensor cores) when cublaslt_int8_supported() and the
//                          pointer alignment allow it and cuBLASLt offers an algorithm;
//   gemm_s8s8s32_cuda      a simple tiled CUDA kernel (any shape), the fallback.
// The chosen kernel and the reason for a fallback go to RunInfo, as on the CPU.
// Tested on a GPU (tests/cuda/cuda_kernels_test) against gemm_s8s8s32_reference.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "kernels/cpu/run_info.h"

namespace qforge::cuda {

// The fallback kernel alone. Exact int32 sums (|acc| < 2^31 as on the CPU). Device pointers.
void gemm_s8s8s32_cuda(const int8_t* A, int64_t lda, const int8_t* W, int64_t ldw, int32_t* C,
                       int64_t ldc, int64_t M, int64_t N, int64_t K, cudaStream_t stream);

// Owns a cuBLASLt handle and its workspace (RAII); one per device and thread, not thread-safe.
class GemmS8S8S32Cuda {
 public:
  // Creates the cuBLASLt handle; throws qforge::Error naming the cuBLAS status on failure.
  GemmS8S8S32Cuda();
  ~GemmS8S8S32Cuda();
  GemmS8S8S32Cuda(const GemmS8S8S32Cuda&) = delete;
  GemmS8S8S32Cuda& operator=(const GemmS8S8S32Cuda&) = delete;

  // C = A x W^T on `stream`, device pointers, strides in elements (lda, ldw >= K; ldc >= N).
  // Throws qforge::Error on bad arguments or a CUDA / cuBLASLt error.
  void run(const int8_t* A, int64_t lda, const int8_t* W, int64_t ldw, int32_t* C, int64_t ldc,
           int64_t M, int64_t N, int64_t K, cudaStream_t stream,
           kernels::RunInfo* info = nullptr) const;

  // false: always run gemm_s8s8s32_cuda (tests, or to compare the two on a GPU).
  void set_use_cublaslt(bool on) { use_cublaslt_ = on; }

 private:
  struct Lt;
  std::unique_ptr<Lt> lt_;
  bool use_cublaslt_ = true;
};

}  // namespace qforge::cuda
