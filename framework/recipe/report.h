// qtrain's report: report.json (the stages' results as the pipeline records them) and report.md
// rendered from it (metrics per stage, sizes, the per-layer table, notes).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "framework/recipe/recipe.h"

namespace qforge {

// Writes <out_dir>/report.json and <out_dir>/report.md; returns the path of report.json.
std::string write_report_files(const nlohmann::json& report, const Recipe& recipe, const std::string& out_dir);

// The run in two lines, for the end of qtrain's output: the metric of the float model beside the
// last quantized stage that ran (frozen when it did), the size ratio, and the wall time of the
// whole run with float training's share. Stages that did not run are not mentioned as if they had.
std::string headline_text(const nlohmann::json& report);

}  // namespace qforge
