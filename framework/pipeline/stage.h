// A stage of qtrain's pipeline: one step over the run (train the float model, calibrate, freeze,
// export, ...). Each stage lives in its own file; the registry (stage_registry.h) orders them and
// is what the dry run, --stages and the run iterate.
#pragma once

#include <string>
#include <vector>

#include "framework/recipe/recipe.h"

namespace qforge::pipeline {

class RunContext;

class Stage {
 public:
  virtual ~Stage() = default;
  // The name of stage lines, --stages, timings_s and completed_stages.
  virtual const char* name() const = 0;
  // Whether the recipe asks for the stage (a quantize section, qat.epochs > 0, ...): decided here
  // only; the dry run, check_stages and the run all ask this.
  virtual bool applies(const Recipe& recipe) const = 0;
  // Whether --stages may name it; data and layer_errors run whenever what they serve runs.
  virtual bool selectable() const { return true; }
  // Whether nothing after it can run unless it completes (data: the task); the run ends there.
  virtual bool required() const { return false; }
  // Whether --stages is empty or names it; what the dry run lists.
  bool named(const std::vector<std::string>& stages) const;
  // Whether the stage runs under --stages: named, unless it runs whenever what it serves runs.
  virtual bool requested(const std::vector<std::string>& stages) const { return named(stages); }
  // Needs the model quantized and calibrated by the calibrate stage of the same run.
  virtual bool needs_calibrated_model() const { return false; }
  // Checks before the first stage runs, so an unwritable path or an unexportable scheme fails
  // before training; called for every stage that applies and is requested.
  virtual void check(RunContext&) const {}
  // Runs where the stage sits in the order whenever it applies, requested or not (records that
  // belong to that point of the run: a note that --stages skipped it, the layer table).
  virtual void pass(RunContext&) const {}
  // Whether what it works on exists by now (layer_errors: a quantized stage completed).
  virtual bool ready(const RunContext&) const { return true; }
  virtual void run(RunContext& ctx) const = 0;
  // Runs once the stage completed and the report written after it: what is set here first
  // appears in the next stage's report (data: the metric, world size and baselines).
  virtual void after_report(RunContext&) const {}
};

}  // namespace qforge::pipeline
