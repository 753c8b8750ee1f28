// SyncBatchNorm through a differentiable all-reduce (see batch_norm.h).
#include "framework/nn/batch_norm.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "framework/core/error.h"

namespace qforge::nn {
namespace {

thread_local AllReduceSum t_all_reduce_sum;

const AllReduceSum& current_reducer(const char* where) {
  QF_REQUIRE(static_cast<bool>(t_all_reduce_sum), "SyncBatchNorm: ", where,
             " outside the SyncBatchNormScope of its forward (run backward on the same thread, inside the scope)");
  return t_all_reduce_sum;
}

// y = Σ_ranks x; dL/dx = Σ_ranks dL/dy (every rank's loss depends on every rank's x).
struct AllReduceSumFn : public torch::autograd::Function<AllReduceSumFn> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) {
    at::Tensor y = x.clone(at::MemoryFormat::Contiguous);
    current_reducer("forward")(y);
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grad) {
    at::Tensor g = grad[0].clone(at::MemoryFormat::Contiguous);
    current_reducer("backward")(g);
    return {g};
  }
};

}  // namespace

SyncBatchNormScope::SyncBatchNormScope(AllReduceSum all_reduce_sum) : previous_(std::move(t_all_reduce_sum)) {
  QF_REQUIRE(static_cast<bool>(all_reduce_sum), "SyncBatchNormScope: no all-reduce given");
  t_all_reduce_sum = std::move(all_reduce_sum);
}

SyncBatchNormScope::~SyncBatchNormScope() { t_all_reduce_sum = std::move(previous_); }

at::Tensor batch_norm(torch::nn::BatchNorm2dImpl& bn, const at::Tensor& x) {
  if (!bn.is_training() || !t_all_reduce_sum) return bn.forward(x);
  QF_REQUIRE(x.dim() == 4 && x.size(1) == bn.options.num_features(), "SyncBatchNorm: expected input [N, ",
             bn.options.num_features(), ", H, W], got ", x.sizes());
  const int64_t C = x.size(1);
  const std::vector<int64_t> dims{0, 2, 3};
  const auto shape = std::vector<int64_t>{1, C, 1, 1};
  // Σx per channel and the element count, in one reduction.
  const at::Tensor local_n = at::full({1}, static_cast<double>(x.numel() / C), x.options());
  const at::Tensor s1n = AllReduceSumFn::apply(at::cat({x.sum(dims), local_n}));
  const at::Tensor n = s1n.narrow(0, C, 1).detach();
  const double count = n.item<double>();
  QF_REQUIRE(count > 1, "SyncBatchNorm: ", count, " value(s) per channel over all ranks; need more than 1");
  const at::Tensor mean = s1n.narrow(0, 0, C) / count;
  const at::Tensor centered = x - mean.view(shape);
  const at::Tensor var = AllReduceSumFn::apply(centered.pow(2).sum(dims)) / count;
  at::Tensor y = centered * at::rsqrt(var + bn.options.eps()).view(shape);
  if (bn.options.affine()) y = y * bn.weight.view(shape) + bn.bias.view(shape);
  if (bn.options.track_running_stats()) {
    at::NoGradGuard no_grad;
    bn.num_batches_tracked.add_(1);
    const double m = bn.options.momentum().has_value()
                         ? *bn.options.momentum()
                         : 1.0 / static_cast<double>(bn.num_batches_tracked.item<int64_t>());
    bn.running_mean.mul_(1 - m).add_(mean.detach(), m);
    bn.running_var.mul_(1 - m).add_(var.detach() * (count / (count - 1)), m);
  }
  return y;
}

}  // namespace qforge::nn
