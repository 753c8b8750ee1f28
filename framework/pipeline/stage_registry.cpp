// The ordered stage list, and what the public pipeline API derives from it.
#include "framework/pipeline/stage_registry.h"

#include <algorithm>

#include "framework/pipeline/pipeline.h"

namespace qforge {

namespace pipeline {

bool Stage::named(const std::vector<std::string>& stages) const {
  return stages.empty() || std::find(stages.begin(), stages.end(), name()) != stages.end();
}

const std::vector<const Stage*>& stages() {
  static const std::vector<const Stage*> kStages{&data_stage(),  &float_stage(),        &search_stage(),
                                                 &calibrate_stage(), &solve_stage(), &ptq_stage(),
                                                 &qat_stage(),   &layer_errors_stage(), &freeze_stage(),
                                                 &export_stage()};
  return kStages;
}

const Stage* find_stage(const std::string& name) {
  for (const Stage* s : stages())
    if (name == s->name()) return s;
  return nullptr;
}

}  // namespace pipeline

const std::vector<std::string>& pipeline_stages() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> out;
    for (const pipeline::Stage* s : pipeline::stages()) out.emplace_back(s->name());
    return out;
  }();
  return kNames;
}

const std::vector<std::string>& selectable_stages() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> out;
    for (const pipeline::Stage* s : pipeline::stages())
      if (s->selectable()) out.emplace_back(s->name());
    return out;
  }();
  return kNames;
}

void check_stages(const Recipe& r, const std::vector<std::string>& stages) {
  if (stages.empty()) return;
  const bool quantizes = pipeline::calibrate_stage().requested(stages);
  for (const pipeline::Stage* s : pipeline::stages()) {
    const bool named = std::find(stages.begin(), stages.end(), s->name()) != stages.end();
    if (s->needs_calibrated_model() && s->applies(r) && named && !quantizes)
      throw Error(std::string("--stages: '") + s->name() + "' needs the model quantized and calibrated, which 'calibrate' does; "
                  "add calibrate (and ptq to evaluate it), or leave --stages out");
  }
  // Export writes what the whole run would: the frozen model when the recipe freezes.
  const pipeline::Stage& ex = pipeline::export_stage();
  const pipeline::Stage& fr = pipeline::freeze_stage();
  if (ex.applies(r) && std::find(stages.begin(), stages.end(), ex.name()) != stages.end() && fr.applies(r) &&
      !fr.requested(stages))
    throw Error("--stages: 'export' writes the frozen model (the recipe has freeze.enabled: true), which 'freeze' makes; "
                "add freeze (and calibrate), set freeze.enabled=false to export the fake-quant model, or leave --stages out");
}

}  // namespace qforge
