// Training and evaluation loops for qforge models: AdamW (no decay on 1-D parameters), cosine
// schedule with warmup, gradient clipping, seeded shuffling and dropout, qforge::Progress bars.
// Works for classifiers (logits [B, C], target [B]) and language models (logits [B, T, V],
// target [B, T]); metrics are accuracy and per-token perplexity.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "framework/train/batches.h"

namespace qforge::train {

// Runs the model on a batch and returns logits.
using ForwardFn = std::function<at::Tensor(const Batch&)>;

struct TrainOptions {
  int64_t epochs = 1;
  int64_t batch_size = 64;
  double lr = 1e-3;
  double weight_decay = 0.01;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double warmup_fraction = 0.05;  // of all steps
  double min_lr_fraction = 0.0;
  double grad_clip = 1.0;         // max global L2 norm; <= 0 disables
  uint64_t seed = 0;
  int64_t max_steps = 0;          // > 0: stop (and end the schedule) after this many steps
  double time_budget_s = 0;       // > 0: stop after this much wall time (schedule unchanged)
  bool progress = true;
  std::string label = "train";
  // Called after every optimizer step with the number of steps done (QAT bookkeeping).
  std::function<void(int64_t)> on_step;
  // When it becomes true, training stops after the current step (Ctrl-C in qtrain).
  const std::atomic<bool>* cancel = nullptr;
  // Data parallelism (framework/dist, docs/distributed.md): this process is rank `rank` of
  // `world_size`. Every rank draws the same permutation; a step covers a global batch of
  // batch_size * world_size examples, rank r taking [r * batch_size, (r + 1) * batch_size) of it;
  // the trailing partial global batch is dropped so every rank runs the same steps.
  // after_backward (dist::average_gradients) runs between backward and gradient clipping, so the
  // step is that of one process on the global batch. Progress bars on rank 0 only.
  int rank = 0;
  int world_size = 1;
  std::function<void(torch::nn::Module&)> after_backward;
  // Called after every epoch that ran at least one step, with its number (1-based), before the
  // validation pass: data-parallel runs settle buffers and compare replicas there.
  std::function<void(torch::nn::Module&, int64_t)> after_epoch;
};

struct Metrics {
  double loss = 0;        // mean cross-entropy per predicted token / example (nats)
  double accuracy = 0;    // top-1
  double perplexity = 0;  // exp(loss)
  int64_t examples = 0, tokens = 0;
  at::Tensor confusion;   // classifiers: int64 [C, C], row = true class, column = prediction
};

struct TrainResult {
  std::vector<double> epoch_loss;     // mean training loss per (possibly partial) epoch
  std::vector<Metrics> validation;    // per epoch, when a validation source was given
  std::vector<double> step_loss;      // every step
  int64_t steps = 0;
  double seconds = 0;
  bool stopped_early = false;         // by max_steps or time_budget_s
};

// The loss fit() minimises and evaluate() reports: mean cross-entropy over every prediction
// (classification logits [B, C] against [B], language modelling [B, T, V] against [B, T]).
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target);

TrainResult fit(torch::nn::Module& model, const BatchSource& train_data, const ForwardFn& forward,
                const TrainOptions& options, const BatchSource* validation = nullptr);

// Evaluation split over data-parallel ranks: the batches of batch_size examples (in index order,
// as one process cuts them) are dealt round-robin, batch b to rank b % world_size, and the sums
// behind the metrics (loss, correct predictions, counts, confusion matrix) are added over the
// ranks with all_reduce_sum (dist::World::all_reduce with Reduce::kSum), so every rank returns
// the metrics of one process evaluating everything: counts exactly, the loss up to the order of
// a floating-point sum. world_size 1: no communication.
struct EvalSplit {
  int rank = 0;
  int world_size = 1;
  std::function<void(at::Tensor&)> all_reduce_sum;  // in place, over all ranks; float64 and int64
};

// Evaluates in eval mode (restoring the previous mode) without gradients, in index order.
// Progress bar on rank 0 only.
Metrics evaluate(torch::nn::Module& model, const BatchSource& data, const ForwardFn& forward,
                 int64_t batch_size = 256, const std::string& label = "eval", bool progress = true,
                 const EvalSplit& split = {});

// Confusion matrix as text: one row per true class with the counts, then per-class accuracy.
std::string format_confusion(const at::Tensor& confusion, const std::vector<std::string>& names);

}  // namespace qforge::train
