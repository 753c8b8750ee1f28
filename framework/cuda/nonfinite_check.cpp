// The process-wide mode of the CUDA non-finite check (nonfinite_check.h); CUDA-free so every build
// has it. The check itself is framework/cuda/nonfinite_check_cuda.cpp.
#include "framework/cuda/nonfinite_check.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace qforge {
namespace {

CudaNonfiniteCheck check_mode_from_environment() {
  const char* v = std::getenv("QFORGE_CUDA_SYNC_CHECK");
  return v != nullptr && std::strcmp(v, "1") == 0 ? CudaNonfiniteCheck::kSynchronous : CudaNonfiniteCheck::kDeferred;
}

std::atomic<CudaNonfiniteCheck>& check_mode() {
  static std::atomic<CudaNonfiniteCheck> m{check_mode_from_environment()};
  return m;
}

}  // namespace

void set_cuda_nonfinite_check(CudaNonfiniteCheck m) { check_mode().store(m); }

CudaNonfiniteCheck cuda_nonfinite_check() { return check_mode().load(); }

}  // namespace qforge
