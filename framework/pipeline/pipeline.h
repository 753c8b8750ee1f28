// The qtrain pipeline: runs a validated Recipe stage by stage (data → float → search → calibrate →
// solve → ptq → qat → layer_errors → freeze → export; framework/pipeline/stage_registry.h),
// evaluating after each, and writes report.json / report.md / report.html, the resolved recipe and
// the exported files into the output directory.
#pragma once

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "framework/dist/world.h"
#include "framework/recipe/recipe.h"

namespace qforge {

struct PipelineOptions {
  std::string out_dir = "runs/qtrain";
  std::vector<std::string> stages;  // empty: every stage the recipe asks for
  bool dry_run = false;             // validate, build the model, print the plan; no data
  const std::atomic<bool>* interrupted = nullptr;  // set by a SIGINT handler
  // Data parallelism (docs/distributed.md): this process's rank in a c10d group, or null (one
  // process). Every rank must run the same recipe, stages and float checkpoint (checked first).
  // Float training and QAT split each global batch of data.batch_size examples over the ranks and
  // average gradients; calibration and evaluation batches are dealt round-robin, the observers
  // merged and the metrics added up. Only rank 0's out_dir is the run's.
  const dist::World* world = nullptr;
};

// A stage failed: the message names it. (Invalid recipes throw RecipeError before any stage.)
class StageError : public Error {
 public:
  StageError(std::string stage, const std::string& what) : Error("stage '" + stage + "' failed: " + what), stage_(std::move(stage)) {}
  const std::string& stage() const { return stage_; }

 private:
  std::string stage_;
};

struct PipelineResult {
  std::map<std::string, std::map<std::string, double>> metrics;  // stage -> metric -> value
  std::vector<std::string> completed;
  bool interrupted = false;
  std::string report_path;
  std::string headline;  // headline_text(report): qtrain's last lines
};

// Names of the stages in order, data and layer_errors included.
const std::vector<std::string>& pipeline_stages();

// The stages --stages may name, in order (data and layer_errors run whenever what they serve runs).
const std::vector<std::string>& selectable_stages();

// Throws qforge::Error when `stages` (a --stages subset) asks for a stage whose prerequisite it
// leaves out: qat and freeze work on the model quantized and calibrated by calibrate (or ptq).
void check_stages(const Recipe& recipe, const std::vector<std::string>& stages);

// The stages of `metrics` that ran, in pipeline order (float, ptq, qat, frozen).
std::vector<std::string> metric_stages_in_order(const std::map<std::string, std::map<std::string, double>>& metrics);

PipelineResult run_pipeline(const Recipe& recipe, const PipelineOptions& options);

}  // namespace qforge
