// BRECQ: AdaRound's rounding variables of a block's Linears trained together with Adam against the
// float block's output, weighted by the diagonal Fisher.
#include "framework/ptq/brecq.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <cmath>

#include "framework/core/error.h"
#include "framework/nn/linear.h"
#include "framework/ptq/adaround.h"
#include "framework/ptq/block_capture.h"

namespace qforge::ptq {

namespace {

void check_options(const BrecqOptions& o) {
  QF_REQUIRE(o.iterations > 0, "brecq: iterations must be > 0, got ", o.iterations);
  QF_REQUIRE(o.batch_size > 0, "brecq: batch_size must be > 0, got ", o.batch_size);
  QF_REQUIRE(o.lr > 0 && std::isfinite(o.lr), "brecq: lr must be > 0, got ", o.lr);
  QF_REQUIRE(o.reg_weight >= 0 && o.warmup >= 0 && o.warmup < 1 && o.beta_start >= o.beta_end && o.beta_end > 0,
             "brecq: needs reg_weight >= 0, 0 <= warmup < 1 and beta_start >= beta_end > 0");
}

// The grid a layer's weight rounds onto: its weight quantizer's (round-to-nearest's) grid.
QParams layer_grid(nn::LinearImpl& l) {
  const QParams qp = l.weight_quantizer()->qparams(l.weight.detach());
  const QSpec& spec = qp.spec;
  QF_REQUIRE(spec.qtype.is_integer(), "brecq: rounds onto integer grids; ", spec.qtype.name,
             " has no round-up / round-down choice");
  return qp;
}

}  // namespace

BrecqBlockResult brecq_block(const std::function<at::Tensor(const at::Tensor&)>& forward,
                             const std::vector<nn::LinearImpl*>& layers, const at::Tensor& x, const at::Tensor& target,
                             const at::Tensor& fisher, const BrecqOptions& o, const std::function<void()>& on_step) {
  check_options(o);
  QF_REQUIRE(!layers.empty(), "brecq: no layers to round");
  QF_REQUIRE(x.dim() >= 2 && x.size(0) == target.size(0), "brecq: inputs ", x.sizes(), " and targets ", target.sizes(),
             " hold different numbers of sequences");
  QF_REQUIRE(!fisher.defined() || fisher.sizes() == target.sizes(), "brecq: Fisher weights ",
             fisher.defined() ? fisher.sizes() : at::IntArrayRef{}, " do not match the targets ", target.sizes());
  BrecqBlockResult r;
  std::vector<SoftRounding> rounding;
  std::vector<at::Tensor> params;
  for (nn::LinearImpl* l : layers) {
    r.grids.push_back(layer_grid(*l));
    rounding.emplace_back(l->weight.detach(), r.grids.back());
  }
  for (SoftRounding& sr : rounding) params.push_back(sr.v());
  at::AutoGradMode grad_on(true);  // solve() runs under NoGradGuard
  torch::optim::Adam opt(params, torch::optim::AdamOptions(o.lr));
  at::Generator gen = at::detail::createCPUGenerator(o.seed);
  const int64_t S = x.size(0), bs = std::min(o.batch_size, S);
  for (int64_t t = 0; t < o.iterations; ++t) {
    const at::Tensor idx = bs < S ? at::randperm(S, gen, at::TensorOptions().dtype(at::kLong)).slice(0, 0, bs)
                                  : at::arange(S, at::TensorOptions().dtype(at::kLong));
    at::Tensor rec;
    {
      std::vector<at::Tensor> soft;
      for (const SoftRounding& sr : rounding) soft.push_back(sr.soft_weight());
      const ScopedBlockWeights swapped(layers, soft);
      const at::Tensor d2 = (forward(x.index_select(0, idx)).to(at::kFloat) - target.index_select(0, idx).to(at::kFloat)).pow(2);
      // Summed over the hidden features, averaged over tokens: AdaRound's loss with a block's output.
      rec = (fisher.defined() ? d2 * fisher.index_select(0, idx).to(at::kFloat) : d2).sum(-1).mean();
    }
    const double lv = rec.item<double>();
    QF_REQUIRE(std::isfinite(lv), "brecq: the block's output error is not finite at step ", t);
    if (t == 0) r.first_loss = lv;
    r.last_loss = lv;
    at::Tensor loss = rec;
    const double beta = annealed_beta(t, o.iterations, o.warmup, o.beta_start, o.beta_end);
    if (beta > 0 && o.reg_weight > 0)
      for (const SoftRounding& sr : rounding) loss = loss + o.reg_weight * sr.regularizer(beta);
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (on_step) on_step();
  }
  at::NoGradGuard no_grad;
  for (const SoftRounding& sr : rounding) {
    r.weights.push_back(sr.hard_weight());
    r.binary_fraction.push_back(sr.binary_fraction());
    r.rounded_up.push_back(sr.rounded_up());
  }
  return r;
}

}  // namespace qforge::ptq
