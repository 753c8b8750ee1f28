// BatchNorm as qforge's models call it, with synchronised batch statistics for data-parallel
// training (SyncBatchNorm, docs/distributed.md).
//
// Outside a SyncBatchNormScope, or in eval mode, batch_norm(bn, x) is bn->forward(x). Inside a
// scope and in training mode, the batch statistics are those of every rank's batch together:
//   S1 = Σ_ranks Σ_{n,h,w} x,   N = Σ_ranks N·H·W,   mean = S1 / N,
//   var = Σ_ranks Σ (x − mean)² / N  (biased, normalises),   y = (x − mean) / sqrt(var + eps) · γ + β,
//   running_mean ← (1 − m)·running_mean + m·mean,   running_var ← (1 − m)·running_var + m·var·N/(N − 1),
// with m the module's momentum (none: 1 / num_batches_tracked, as LibTorch). The sums travel
// through a differentiable all-reduce (its backward all-reduces the incoming gradient), so the
// backward of rank r gives ∂(Σ_ranks loss_rank)/∂x_r, PyTorch's SyncBatchNorm gradient: with a
// mean loss per rank and gradients averaged over the ranks afterwards (dist::average_gradients),
// training equals one process on the concatenated batch. Every rank must call batch_norm on the
// same layers in the same order (the reductions are collectives).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/batchnorm.h>

#include <functional>

namespace qforge::nn {

// Adds a tensor over every rank in place (dist::World::all_reduce with Reduce::kSum).
using AllReduceSum = std::function<void(at::Tensor&)>;

// While alive, batch_norm() in training mode on this thread synchronises its statistics through
// `all_reduce_sum`; the backward of those forwards must run on this thread while the scope lives
// (LibTorch runs a CPU backward on the calling thread). Scopes nest (the innermost wins).
class SyncBatchNormScope {
 public:
  explicit SyncBatchNormScope(AllReduceSum all_reduce_sum);
  ~SyncBatchNormScope();
  SyncBatchNormScope(const SyncBatchNormScope&) = delete;
  SyncBatchNormScope& operator=(const SyncBatchNormScope&) = delete;

 private:
  AllReduceSum previous_;
};

at::Tensor batch_norm(torch::nn::BatchNorm2dImpl& bn, const at::Tensor& x);

}  // namespace qforge::nn
