// GemmS8S8S32Cuda: cuBLASLt IMMA int8 GEMM with the tiled CUDA kernel as fallback (see
// gemm_s8s8s32_cuda.h; shape rules in cublaslt_int8_rules.h). Host code.
#include <array>
#include <map>
#include <memory>
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

namespace {
// The largest power of two (up to 256) dividing the address: cuBLASLt picks algorithms for the
// alignment it is told (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*), so it is part of a plan's key.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}
}  // namespace

// One cuBLASLt plan per shape, strides and alignment: descriptors, layouts and the heuristic's
// algorithm are made once (the heuristic query costs more host time than a small GEMM runs).
struct LtPlan {
  LtMatmulDesc desc{CUBLAS_COMPUTE_32I, CUDA_R_32I};
  LtMatrixLayout w, a, c;
  cublasLtMatmulHeuristicResult_t heuristic{};
  std::string why;  // non-empty: no algorithm (the fallback runs, saying this)
  LtPlan(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldw, int64_t ldc)
      : w(CUDA_R_8I, static_cast<uint64_t>(K), static_cast<uint64_t>(N), ldw),
        a(CUDA_R_8I, static_cast<uint64_t>(K), static_cast<uint64_t>(M), lda),
        c(CUDA_R_32I, static_cast<uint64_t>(N), static_cast<uint64_t>(M), ldc) {}
};

struct GemmS8S8S32Cuda::Lt {
  LtHandle handle;
  DeviceBuffer<unsigned char> workspace{kWorkspaceBytes};
  std::map<std::array<int64_t, 9>, std::unique_ptr<LtPlan>> plans;
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
    const uint32_t align_a = alignment_of(A), align_w = alignment_of(W), align_c = alignment_of(C);
    std::unique_ptr<LtPlan>& plan = lt_->plans[{M, N, K, lda, ldw, ldc, align_a, align_w, align_c}];
    if (!plan) {
      auto p = std::make_unique<LtPlan>(M, N, K, lda, ldw, ldc);
      p->desc.set(CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t{CUBLAS_OP_T});
      p->desc.set(CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t{CUBLAS_OP_N});
      LtMatmulPreference pref;
      pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{lt_->workspace.bytes()});
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_w);  // cuBLASLt's A is the weight
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a);
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c);
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c);
      int found = 0;
      const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
          lt_->handle.get(), p->desc.get(), p->w.get(), p->a.get(), p->c.get(), p->c.get(), pref.get(), 1,
          &p->heuristic, &found);
      if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
        // No algorithm for this GPU / shape (e.g. no int8 tensor cores): fall back, say why.
        p->why = std::string("no cuBLASLt algorithm (") +
                 (hs != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusName(hs) : "0 results") + ")";
      }
      plan = std::move(p);
    }
    if (plan->why.empty()) {
      const int32_t alpha = 1, beta = 0;  // scale type CUDA_R_32I
      check_cublas(cublasLtMatmul(lt_->handle.get(), plan->desc.get(), &alpha, W, plan->w.get(), A, plan->a.get(),
                                  &beta, C, plan->c.get(), C, plan->c.get(), &plan->heuristic.algo,
                                  lt_->workspace.get(), lt_->workspace.bytes(), stream),
                   "cublasLtMatmul");
      ri.kernel = kCublasLtName;
      return;
    }
    why = plan->why;
  }
  ri.skip(kCublasLtName, why);
  gemm_s8s8s32_cuda(A, lda, W, ldw, C, ldc, M, N, K, stream);
  ri.kernel = kFallbackName;
}

}  // namespace qforge::cuda
