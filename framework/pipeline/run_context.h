// What the stages of one qtrain run share: the recipe and options, the process group, the task
// (model and data), the report being written, the scheme (searched or not), the records kept for
// the calibration dump, and the run's services: saving with a fallback path, writing the report,
// running a stage, evaluating, calibrating, data parallelism.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "framework/io/calibration_dump.h"
#include "framework/pipeline/pipeline.h"
#include "framework/pipeline/run_directory.h"
#include "framework/pipeline/stage.h"
#include "framework/ptq/ptq.h"
#include "framework/recipe/task.h"
#include "framework/train/trainer.h"

namespace qforge::pipeline {


// Fails (qforge::Error naming `what`) unless a file can be written into `dir` (created if missing).
void probe_writable(const std::string& dir, const std::string& what);

class RunContext {
 public:
  RunContext(const Recipe& recipe, const PipelineOptions& options);
  // `world` may refer to this object's own one_process_: a copy would point into the original.
  RunContext(const RunContext&) = delete;
  RunContext(RunContext&&) = delete;
  RunContext& operator=(const RunContext&) = delete;
  RunContext& operator=(RunContext&&) = delete;

  const Recipe& recipe;
  const PipelineOptions& options;

 private:
  const dist::World one_process_;

 public:
  const dist::World& world;  // options.world, or this process alone
  Task task;                 // built by the data stage
  nlohmann::json report;     // report.json as the stages fill it
  PipelineResult result;
  Scheme scheme;             // the recipe's, with the search's per-layer rules once it has run
  std::string recipe_text;   // what the checkpoint records (the searched recipe once it ran)
  std::optional<io::SearchSensitivities> search_record;  // kept in the calibration dump
  std::optional<io::LayerErrorTable> error_record;       // likewise
  // The float weights the solve stage replaced, the numeric suite's reference (freed after it).
  std::map<std::string, ptq::FloatWeights> solved_from;
  std::optional<Imatrix> imatrix;                        // calibrate.imatrix; likewise, and imatrix.gguf
  std::vector<std::string> awq_clipped;                  // layers AWQ clipped: the imatrix grid search leaves them

  // --stages names `stage` (or is empty).
  bool wanted(const Stage& stage) const { return stage.named(options.stages); }
  bool interrupted() const;
  bool completed(const std::string& stage) const;
  void note(const std::string& text) { report["notes"].push_back(text); }

  // Every rank runs the same recipe, stages and float checkpoint; refused on every rank otherwise.
  void check_world() const;
  // Fails unless --out can be written into (before the first stage, not after training) and no
  // other run holds it; takes its lock for this run; checks the recipe's inputs against the
  // run's outputs (run_directory.h).
  void check_out_dir();
  // Removes the previous run's outputs (not the recipe's inputs) and writes recipe.resolved.yaml;
  // the report starts here.
  void open_outputs();

  // Writes `path` through `write`; a failed write goes to a fallback path that stderr and the
  // report's notes name. Returns the path written.
  std::string save(const std::string& path, const std::function<void(const std::string&)>& write);
  void write_report();
  // Runs `stage`, timing it and writing the report after it; false when interrupted (before or
  // during it). A failure is a StageError naming it, after the report is written.
  bool run_stage(const Stage& stage);

  // Records `m` as stage `stage`'s metrics (result, report, stderr).
  void record(const std::string& stage, const train::Metrics& m);
  train::Metrics evaluate(const std::string& label);
  // report.json's latency_ms for `stage` ("float", "frozen"): the whole-model forward of one test
  // example and, for causal LMs, one decode step through a KV cache, each the median of 21 calls
  // with the last-level cache evicted before each; the regime (input shape, phase, threads) and
  // how many cores other processes kept busy meanwhile (docs/reports.md).
  void record_latency(const std::string& stage);

  // Runs the task's one-time preparation before quantize (BatchNorm folding), once.
  void before_quantize();
  // The calibration examples: the first calibration_examples() training examples, in batches of
  // data.batch_size; the solvers take the first solve_batches() of those batches.
  int64_t calibration_examples() const;
  int64_t calibration_batches() const;
  int64_t solve_batches() const;
  at::Tensor calibration_batch(int64_t b);
  // The task's training loss (next-token cross-entropy, or the classes') on calibration batch b,
  // with autograd: what ptq.rotate: spinquant learns on.
  at::Tensor calibration_loss(int64_t b);
  // Calibrates the quantized model (static activations only); batches dealt over the ranks.
  void calibrate(const Scheme& scheme);

  // Float training and QAT on every rank: each rank's slice of the recipe's batch, gradients
  // averaged in buckets overlapping backward, replicas compared before training and after every
  // epoch, where rank 0's buffers (BatchNorm statistics, activation scales) are broadcast first.
  void data_parallel(train::TrainOptions& o, torch::nn::Module& model);
  void settle_replicas(torch::nn::Module& model, const std::string& when);

 private:
  at::Tensor calibration_indices(int64_t b) const;
  std::unique_ptr<RunLock> lock_;
  train::EvalSplit eval_split_;
  bool folded_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace qforge::pipeline
