// Frozen layers on CUDA in a build without a CUDA-enabled LibTorch: every call says what to
// rebuild against (see linear_cuda.h).
#include <ATen/ATen.h>

#include "framework/core/error.h"
#include "framework/cuda/cuda_graph.h"
#include "framework/cuda/linear_cuda.h"
#include "framework/cuda/nonfinite_check.h"

namespace qforge::cuda_ops {

bool built() { return false; }

std::string unavailable_reason() {
  return "this qforge build has no CUDA kernels (it was built against a LibTorch without CUDA); rebuild against a "
         "CUDA-enabled LibTorch (docs/kernels.md, \"CUDA\") or keep the model on the CPU";
}

at::Tensor linear_s8(const at::Tensor&, const at::Tensor&, float, const at::Tensor&, const at::Tensor&,
                     const at::Tensor&, kernels::RunInfo*) {
  throw Error("CUDA Linear: " + unavailable_reason());
}

at::Tensor dequantize_s4(const at::Tensor&, int64_t, int64_t, bool, const at::Tensor&, const at::Tensor&, int64_t,
                         bool) {
  throw Error("CUDA int4 dequantize: " + unavailable_reason());
}

bool s4_tiles_serve(int64_t, int64_t, const at::Device&) { return false; }

at::Tensor repack_s4_tiles(const at::Tensor&, int64_t, int64_t) {
  throw Error("CUDA int4 repack: " + unavailable_reason());
}

at::Tensor linear_s4(const at::Tensor&, const at::Tensor&, int64_t, int64_t, bool, const at::Tensor&, const at::Tensor&,
                     int64_t, bool, const at::Tensor&, kernels::RunInfo*) {
  throw Error("CUDA int4 Linear: " + unavailable_reason());
}

at::Tensor linear_s8_weight_only(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 kernels::RunInfo*) {
  throw Error("CUDA int8 weight-only Linear: " + unavailable_reason());
}

}  // namespace qforge::cuda_ops

namespace qforge {

// Nothing runs on CUDA in this build, so nothing was recorded.
void cuda_check_nonfinite() {}

struct CudaGraphStep::Impl {};
CudaGraphStep::CudaGraphStep() = default;
CudaGraphStep::~CudaGraphStep() = default;
bool CudaGraphStep::captured() const { return false; }
std::vector<at::Tensor> CudaGraphStep::capture(const std::function<std::vector<at::Tensor>()>&) {
  throw Error("CudaGraphStep: " + cuda_ops::unavailable_reason());
}
void CudaGraphStep::replay() { throw Error("CudaGraphStep: " + cuda_ops::unavailable_reason()); }

}  // namespace qforge
