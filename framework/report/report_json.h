// report.json's sections, one builder per section, each from the result of the step that measured
// it (the pipeline's stages call them; report.md and report.html read what they write).
#pragma once

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "framework/io/calibration_io.h"
#include "framework/onnx/export.h"
#include "framework/ptq/awq.h"
#include "framework/ptq/imatrix.h"
#include "framework/ptq/numeric_suite.h"
#include "framework/ptq/ptq.h"
#include "framework/ptq/rotate.h"
#include "framework/ptq/spinquant.h"
#include "framework/search/search.h"
#include "framework/train/trainer.h"

namespace qforge::report {

// Static activation points: observer range, histogram (at most 128 bins), clip range and grid.
nlohmann::json activation_ranges_json(const io::CalibrationDump& dump);

// A training run's loss per step, at most 400 points, each the mean of its span of steps.
nlohmann::json loss_curve(const train::TrainResult& tr);

// The numeric suite's per-layer SQNR, worst first, over `batches` calibration batches.
nlohmann::json layer_errors_json(const std::vector<ptq::LayerError>& errors, int64_t batches);

// The solvers' per-layer errors before and after rounding.
nlohmann::json solve_json(const ptq::SolveReport& sr);

// The search's choice, candidates and Pareto front; `metric` names ParetoPoint::accuracy.
nlohmann::json search_json(const search::SearchResult& sr, const std::string& metric);

// Every quantized layer with its grids, kernel and bytes.
nlohmann::json layers_json(const torch::nn::Module& model);

nlohmann::json equalize_json(const ptq::EqualizeReport& er);
nlohmann::json smoothquant_json(const ptq::SmoothReport& sr, double alpha);
nlohmann::json awq_json(const ptq::AwqReport& ar);
nlohmann::json rotate_json(const ptq::RotateReport& rr);
// report.json's ptq.rotate.spinquant: the learning's settings, its loss per step and before / after.
nlohmann::json spinquant_json(const ptq::SpinQuantReport& sr);
nlohmann::json imatrix_round_json(const ptq::ImatrixRoundReport& ir);
nlohmann::json onnx_json(const onnx_export::ExportInfo& info);

}  // namespace qforge::report
