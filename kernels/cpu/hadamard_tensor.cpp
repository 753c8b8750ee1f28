// The Hadamard transform as a differentiable tensor op over the rows of the last dimension.
#include "kernels/cpu/hadamard_tensor.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "framework/core/error.h"
#include "kernels/cpu/hadamard.h"

namespace qforge::kernels {
namespace {

at::Tensor rotate_rows(const at::Tensor& x, bool transpose) {
  QF_REQUIRE(x.device().is_cpu(), "kernels/cpu: the Hadamard transform runs on CPU tensors, got one on ", x.device());
  QF_REQUIRE(at::isFloatingType(x.scalar_type()) && x.dim() >= 1, "kernels/cpu: the Hadamard transform needs a ",
             "float tensor of at least one dimension, got ", x.scalar_type(), " ", x.sizes());
  const int64_t n = x.size(-1);
  hadamard_size(n);  // the size error before any copy
  at::Tensor y = x.to(at::kFloat).contiguous().clone();
  hadamard_transform(y.data_ptr<float>(), n == 0 ? 0 : y.numel() / n, n, transpose);
  return y.to(x.scalar_type());
}

struct HadamardFunction : public torch::autograd::Function<HadamardFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, bool transpose) {
    ctx->saved_data["transpose"] = transpose;
    return rotate_rows(x, transpose);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // Through the op itself, not the raw kernel, so a double backward (Hessian-vector products) sees it.
    return {hadamard_rotate(grads[0], !ctx->saved_data["transpose"].toBool()), at::Tensor()};
  }
};

}  // namespace

at::Tensor hadamard_rotate(const at::Tensor& x, bool transpose) {
  if (!x.requires_grad()) return rotate_rows(x, transpose);
  return HadamardFunction::apply(x, transpose);
}

}  // namespace qforge::kernels
