// Training / evaluation loops.
#include "framework/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "framework/core/error.h"
#include "framework/api/progress.h"
#include "framework/train/lr_schedule.h"

namespace qforge::train {

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target) {
  const int64_t V = logits.size(-1);
  const at::Tensor flat = logits.reshape({-1, V});
  const at::Tensor t = target.reshape({-1});
  QF_REQUIRE(flat.size(0) == t.size(0), "train: logits ", logits.sizes(), " do not match targets ", target.sizes());
  return at::cross_entropy_loss(flat, t);
}

namespace {

using Clock = std::chrono::steady_clock;

struct Accum {
  double loss_sum = 0;
  int64_t correct = 0, count = 0, examples = 0;
  at::Tensor confusion;
};

// Loss over predictions, plus accuracy / confusion bookkeeping.
at::Tensor loss_and_count(const at::Tensor& logits, const at::Tensor& target, Accum* acc) {
  const int64_t V = logits.size(-1);
  const at::Tensor flat = logits.reshape({-1, V});
  const at::Tensor t = target.reshape({-1});
  const at::Tensor loss = cross_entropy(logits, target);
  if (acc) {
    at::NoGradGuard g;
    const at::Tensor pred = flat.argmax(-1);
    acc->loss_sum += loss.item<double>() * static_cast<double>(t.size(0));
    acc->correct += pred.eq(t).sum().item<int64_t>();
    acc->count += t.size(0);
    acc->examples += target.size(0);
    if (logits.dim() == 2) {
      if (!acc->confusion.defined()) acc->confusion = at::zeros({V, V}, at::kLong);
      acc->confusion.view({-1}).index_add_(0, t * V + pred, at::ones_like(t));
    }
  }
  return loss;
}

Metrics to_metrics(const Accum& a) {
  Metrics m;
  m.examples = a.examples;
  m.tokens = a.count;
  m.loss = a.count ? a.loss_sum / static_cast<double>(a.count) : 0.0;
  m.accuracy = a.count ? static_cast<double>(a.correct) / static_cast<double>(a.count) : 0.0;
  m.perplexity = std::exp(m.loss);
  m.confusion = a.confusion;
  return m;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

Metrics evaluate(torch::nn::Module& model, const BatchSource& data, const ForwardFn& forward, int64_t batch_size,
                 const std::string& label, bool progress, const EvalSplit& split) {
  QF_REQUIRE(batch_size > 0, "train: batch_size must be > 0");
  QF_REQUIRE(split.world_size >= 1 && split.rank >= 0 && split.rank < split.world_size, "train: evaluation rank ",
             split.rank, " is not in [0, world_size ", split.world_size, ")");
  QF_REQUIRE(split.world_size == 1 || split.all_reduce_sum, "train: evaluation over ", split.world_size,
             " ranks needs all_reduce_sum");
  const bool was_training = model.is_training();
  model.eval();
  at::NoGradGuard no_grad;
  Accum acc;
  const int64_t n = data.size();
  const int64_t batches = (n + batch_size - 1) / batch_size;
  const int64_t mine = batches / split.world_size + (split.rank < batches % split.world_size ? 1 : 0);
  std::unique_ptr<Progress> bar = progress && split.rank == 0 ? std::make_unique<Progress>(label, mine) : nullptr;
  for (int64_t b = split.rank; b < batches; b += split.world_size) {
    const int64_t s = b * batch_size;
    const Batch batch = data.get(at::arange(s, std::min(n, s + batch_size), at::kLong));
    loss_and_count(forward(batch), batch.target, &acc);
    if (bar) bar->update(1);
  }
  if (split.world_size > 1) {
    // A rank without batches has no confusion matrix yet: its size travels with the sums.
    const int64_t classes = acc.confusion.defined() ? acc.confusion.size(0) : 0;
    at::Tensor sums = at::tensor({acc.loss_sum, static_cast<double>(acc.correct), static_cast<double>(acc.count),
                                  static_cast<double>(acc.examples), static_cast<double>(classes)},
                                 at::kDouble);
    at::Tensor has = at::tensor({static_cast<int64_t>(classes > 0)}, at::kLong);
    split.all_reduce_sum(sums);
    split.all_reduce_sum(has);
    const auto* v = sums.data_ptr<double>();
    acc.loss_sum = v[0];
    acc.correct = static_cast<int64_t>(std::llround(v[1]));
    acc.count = static_cast<int64_t>(std::llround(v[2]));
    acc.examples = static_cast<int64_t>(std::llround(v[3]));
    const int64_t ranks_with = has.item<int64_t>();
    if (ranks_with > 0) {
      const int64_t V = std::llround(v[4] / static_cast<double>(ranks_with));
      if (!acc.confusion.defined()) acc.confusion = at::zeros({V, V}, at::kLong);
      QF_REQUIRE(acc.confusion.size(0) == V, "train: evaluation ranks disagree on the number of classes");
      split.all_reduce_sum(acc.confusion);
    }
  }
  Metrics m = to_metrics(acc);
  if (bar) bar->finish("loss " + fmt("%.4f", m.loss) + " acc " + fmt("%.4f", m.accuracy));
  model.train(was_training);
  return m;
}

TrainResult fit(torch::nn::Module& model, const BatchSource& data, const ForwardFn& forward, const TrainOptions& o,
                const BatchSource* validation) {
  QF_REQUIRE(o.epochs > 0 && o.batch_size > 0 && o.lr > 0, "train: epochs, batch_size and lr must be > 0");
  QF_REQUIRE(data.size() > 0, "train: empty training data");
  QF_REQUIRE(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size, "train: rank ", o.rank,
             " is not in [0, world_size ", o.world_size, ")");
  at::manual_seed(o.seed);  // dropout masks
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& p : model.parameters())
    if (p.requires_grad()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  torch::optim::AdamWOptions base(o.lr);
  base.betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(base));
  auto nd = std::make_unique<torch::optim::AdamWOptions>(base);
  nd->weight_decay(0.0);
  groups.emplace_back(no_decay, std::move(nd));
  torch::optim::AdamW opt(std::move(groups), base);

  const int64_t n = data.size();
  const int64_t global_batch = o.batch_size * o.world_size;
  QF_REQUIRE(o.world_size == 1 || n >= global_batch, "train: ", n, " examples make no global batch of ",
             global_batch, " (batch_size ", o.batch_size, " x ", o.world_size, " ranks)");
  const int64_t steps_per_epoch = o.world_size == 1 ? (n + o.batch_size - 1) / o.batch_size : n / global_batch;
  const bool show = o.progress && o.rank == 0;
  int64_t total = steps_per_epoch * o.epochs;
  if (o.max_steps > 0) total = std::min(total, o.max_steps);
  CosineSchedule sched{o.lr, static_cast<int64_t>(std::llround(o.warmup_fraction * total)), total, o.min_lr_fraction};

  TrainResult r;
  const auto t0 = Clock::now();
  for (int64_t epoch = 0; epoch < o.epochs && !r.stopped_early; ++epoch) {
    model.train();
    const at::Tensor perm = at::randperm(n, at::detail::createCPUGenerator(o.seed * 1000003 + epoch), at::kLong);
    if (o.max_steps > 0 && r.steps >= o.max_steps) {  // before a bar for an epoch that runs no step
      r.stopped_early = true;
      break;
    }
    // The bar counts the steps this epoch will run: max_steps may end it early.
    const int64_t epoch_total = o.max_steps > 0 ? std::min(steps_per_epoch, o.max_steps - r.steps) : steps_per_epoch;
    std::unique_ptr<Progress> bar =
        show ? std::make_unique<Progress>(o.label + " epoch " + std::to_string(epoch + 1), epoch_total) : nullptr;
    double loss_sum = 0;
    int64_t epoch_steps = 0;
    for (int64_t step = 0; step < steps_per_epoch; ++step) {
      if ((o.max_steps > 0 && r.steps >= o.max_steps) || (o.cancel && o.cancel->load()) ||
          (o.time_budget_s > 0 && std::chrono::duration<double>(Clock::now() - t0).count() > o.time_budget_s)) {
        r.stopped_early = true;
        break;
      }
      const double lr = sched.lr(r.steps);
      for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
      const int64_t begin = step * global_batch + o.rank * o.batch_size;
      const Batch b = data.get(perm.narrow(0, begin, std::min(o.batch_size, n - begin)));
      opt.zero_grad();
      const at::Tensor loss = loss_and_count(forward(b), b.target, nullptr);
      loss.backward();
      if (o.after_backward) o.after_backward(model);
      if (o.grad_clip > 0) torch::nn::utils::clip_grad_norm_(model.parameters(), o.grad_clip);
      opt.step();
      const double l = loss.item<double>();
      QF_REQUIRE(std::isfinite(l), "train: ", o.label, " loss became ", l, " at step ", r.steps);
      r.step_loss.push_back(l);
      loss_sum += l;
      ++epoch_steps;
      ++r.steps;
      if (o.on_step) o.on_step(r.steps);
      if (bar) bar->update(1, "loss " + fmt("%.4f", loss_sum / epoch_steps) + " lr " + fmt("%.2e", lr));
    }
    if (epoch_steps == 0) break;
    r.epoch_loss.push_back(loss_sum / epoch_steps);
    if (bar) bar->finish("loss " + fmt("%.4f", r.epoch_loss.back()));
    if (o.after_epoch) o.after_epoch(model, epoch + 1);
    if (validation) r.validation.push_back(evaluate(model, *validation, forward, 256, o.label + " validation", show));
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

std::string format_confusion(const at::Tensor& confusion, const std::vector<std::string>& names) {
  QF_REQUIRE(confusion.defined() && confusion.dim() == 2 && confusion.size(0) == confusion.size(1) &&
                 confusion.size(0) == static_cast<int64_t>(names.size()),
             "train: confusion matrix does not match ", names.size(), " class names");
  const at::Tensor c = confusion.to(at::kLong).contiguous();
  const auto a = c.accessor<int64_t, 2>();
  std::ostringstream os;
  os << "| true \\ predicted |";
  for (const auto& n : names) os << " " << n.substr(0, 3) << " |";
  os << " accuracy |\n|---|";
  for (size_t i = 0; i <= names.size(); ++i) os << "---|";
  os << "\n";
  for (int64_t i = 0; i < c.size(0); ++i) {
    int64_t row = 0;
    os << "| " << names[i] << " |";
    for (int64_t j = 0; j < c.size(1); ++j) os << " " << a[i][j] << " |", row += a[i][j];
    os << " " << fmt("%.1f%%", row ? 100.0 * a[i][i] / row : 0.0) << " |\n";
  }
  return os.str();
}

}  // namespace qforge::train
