// Calibration dumps of a model: every quantizer's observer state and qparams written per module
// path and quantization point ("fc1" / "input", "weight", ...), and loaded back into a quantized
// model so calibration can be skipped (then freeze() works). The file format and merging are
// calibration_dump.h's; this file maps it onto the qforge layers.
#pragma once

#include <torch/nn/module.h>

#include <string>

#include "framework/api/module_like.h"
#include "framework/io/calibration_dump.h"

namespace qforge::io {

// The module path of the root module in a dump ("" has no HDF5 name).
inline constexpr const char* kRootModuleName = "__root__";

// One entry per quantizer of every quantized layer:
//  - static activations ("input", "output", "other"): the observer's state and the qparams in
//    force (the observer's, or those set directly when the observer saw nothing);
//  - weights ("weight"): a min/max observer of the weight's granularity fed with the weight (the
//    dequantized packed weight once frozen) and the weight's qparams (learned ones under LSQ).
// Dynamic and LSQ activation quantizers have no observer and are left out, and so are mxfp4 /
// nvfp4 weights: their scales are a function of the weight (nothing to calibrate or merge).
CalibrationDump calibration_dump(const torch::nn::Module& model);
// `search`: the mixed-precision search's sensitivities to keep in the same file (see
// calibration_dump.h), or nullptr.
void save_calibration(const torch::nn::Module& model, const std::string& path,
                      const SearchSensitivities* search = nullptr, const LayerErrorTable* errors = nullptr,
                      const Imatrix* imatrix = nullptr);

// Loads every static activation point of `dump` into the model: the observer takes the saved
// state (so calibration can continue) and the quantizer the saved qparams. Weight points are
// checked (spec) and otherwise skipped: weight qparams follow the weights. Checks everything first
// -- unknown module path, unquantized or frozen layer, unknown point, spec / observer mismatch,
// LSQ quantizers that already train -- and changes nothing on error. `source` names the dump in
// messages.
void apply_calibration(torch::nn::Module& model, const CalibrationDump& dump, const std::string& source = "dump");
void load_calibration(torch::nn::Module& model, const std::string& path);

template <class Holder, class = ModuleLike<Holder>>
void save_calibration(const Holder& model, const std::string& path) {
  save_calibration(detail::module_of(model), path);
}
template <class Holder, class = ModuleLike<Holder>>
void load_calibration(Holder& model, const std::string& path) {
  load_calibration(detail::module_of(model), path);
}

}  // namespace qforge::io
