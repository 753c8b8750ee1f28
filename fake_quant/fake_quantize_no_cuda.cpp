// The CUDA override of the fake-quant ops in a build without it (LibTorch without CUDA, or no
// CUDA compiler): a CUDA tensor gets an error that says what to rebuild against.
#include <ATen/ATen.h>

#include "fake_quant/cuda/fake_quantize_op.h"
#include "framework/core/error.h"

namespace qforge::fq {

namespace {
[[noreturn]] void no_cuda(const at::Tensor& t) {
  throw Error(detail::str_cat("fake_quantize: the input is on ", t.device(),
                              ", but this qforge build has no CUDA kernels (it was built against a LibTorch "
                              "without CUDA, or without nvcc); rebuild against a CUDA-enabled LibTorch "
                              "(docs/kernels.md, \"CUDA\") or move the tensor to the CPU"));
}
}  // namespace

bool cuda_fake_quantize_built() { return false; }

std::tuple<at::Tensor, at::Tensor> cuda_fake_quantize(const at::Tensor& x, const DeviceFakeQuant&, bool) { no_cuda(x); }

at::Tensor cuda_mask_grad(const at::Tensor& dy, const at::Tensor&) { no_cuda(dy); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> cuda_lsq_backward_rows(const at::Tensor& x, const at::Tensor&,
                                                                      const std::vector<LsqGrid>&) {
  no_cuda(x);
}

}  // namespace qforge::fq
