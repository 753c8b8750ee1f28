// GemmS8S8S32Cuda: cuBLASLt IMMA int8 GEMM with the tiled CUDA kernel as fallback (see
// gemm_s8s8s32_cuda.h; shape rules in cublaslt_int8_rules.h). Host code; no GPU has run it.
#include <string>

#include "kernels/cuda/cublaslt_handles.h"
#include "kernels/cuda/cublaslt_int8_rules.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm_s8s8s32_cuda.h"

namespace qforge::cuda {

namespace {
// cuBLASLt workspace: enough for its split-K int8 algorithms at transformer shapes.
constexpr size_t kWorkspaceBytes = size_t{4} << 20;
constexpr const char* kCublasLtName = "gemm_s8s8s32_cublaslt";
constexpr const char* kFallbackName = "gemm_s8s8s32_cuda";
}  // namespace

struct GemmS8S8S32Cuda::Lt {
  LtHandle handle;
  DeviceBuffer<unsigned char> workspace{kWorkspaceBytes};
};

GemmS8S8S32Cuda::GemmS8S8S32Cuda() : lt_(std::make_unique<Lt>()) {}
GemmS8S8S32Cuda::~GemmS8S8S32Cuda() = default;

void GemmS8S8S32Cuda::run(const int8_t* A, int64_t lda, const int8_t* W, int64_t ldw, int32_t* C,
                          int64_t ldc, int64_t M, int64_t N, int64_t K, cudaStream_t stream,
                          kernels::RunInfo* info) const {
  QF_REQUIRE(M >= 0 && N >= 0 && K >= 0 && lda >= K && ldw >= K && ldc >= N,
             "kernels/cuda: int8 GEMM got M=", M, " N=", N, " K=", K, " lda=", lda, " ldw=", ldw,
             " ldc=", ldc, " (need lda, ldw >= K and ldc >= N)");
  kernels::RunInfo local;
  kernels::RunInfo& ri = info != nullptr ? *info : local;
  ri = {};
  std::string why;
  bool lt_ok = use_cublaslt_;
  if (!lt_ok) why = "disabled by set_use_cublaslt(false)";
  if (lt_ok) lt_ok = cublaslt_int8_supported(M, N, K, lda, ldw, ldc, &why);
  if (lt_ok) lt_ok = cublaslt_int8_pointers_supported(A, W, C, &why);
  if (lt_ok) {
    // Row-major C = A W^T is column-major C^T = W^T' A^T': weight = cuBLASLt A (op T), activation
    // = cuBLASLt B (op N); cuBLASLt (m, n, k) = (N, M, K). The TN form is the only int8 IMMA form.
    LtMatmulDesc desc(CUBLAS_COMPUTE_32I, CUDA_R_32I);
    desc.set(CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t{CUBLAS_OP_T});
    desc.set(CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t{CUBLAS_OP_N});
    const LtMatrixLayout w_layout(CUDA_R_8I, static_cast<uint64_t>(K), static_cast<uint64_t>(N), ldw);
    const LtMatrixLayout a_layout(CUDA_R_8I, static_cast<uint64_t>(K), static_cast<uint64_t>(M), lda);
    const LtMatrixLayout c_layout(CUDA_R_32I, static_cast<uint64_t>(N), static_cast<uint64_t>(M), ldc);
    LtMatmulPreference pref;
    pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{lt_->workspace.bytes()});
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
        lt_->handle.get(), desc.get(), w_layout.get(), a_layout.get(), c_layout.get(),
        c_layout.get(), pref.get(), 1, &heuristic, &found);
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
      // No algorithm for this GPU / shape (e.g. no int8 tensor cores): fall back, say why.
      why = std::string("no cuBLASLt algorithm (") +
            (hs != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusName(hs) : "0 results") + ")";
    } else {
      const int32_t alpha = 1, beta = 0;  // scale type CUDA_R_32I
      check_cublas(cublasLtMatmul(lt_->handle.get(), desc.get(), &alpha, W, w_layout.get(), A,
                                  a_layout.get(), &beta, C, c_layout.get(), C, c_layout.get(),
                                  &heuristic.algo, lt_->workspace.get(), lt_->workspace.bytes(),
                                  stream),
                   "cublasLtMatmul");
      ri.kernel = kCublasLtName;
      return;
    }
  }
  ri.skip(kCublasLtName, why);
  gemm_s8s8s32_cuda(A, lda, W, ldw, C, ldc, M, N, K, stream);
  ri.kernel = kFallbackName;
}

}  // namespace qforge::cuda
