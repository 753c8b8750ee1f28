// CUDA runtime / cuBLASLt status codes -> qforge::Error naming the call and the status
// ("kernels/cuda: cublasLtMatmul failed: CUBLAS_STATUS_NOT_SUPPORTED").
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

#include "framework/core/error.h"

namespace qforge::cuda {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string("kernels/cuda: ") + what + " failed: " + cudaGetErrorName(e) + " (" +
                cudaGetErrorString(e) + ")");
}

inline void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("kernels/cuda: ") + what + " failed: " + cublasLtGetStatusName(s));
}

}  // namespace qforge::cuda
