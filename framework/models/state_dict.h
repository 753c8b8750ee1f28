// Named float state of a model (parameters and persistent buffers, without quantizer state) and
// a strict loader: unknown keys, missing keys and shape mismatches are errors that list them all.
// The HF checkpoint importers (bert.h, gpt2.h) build on these.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <map>
#include <string>
#include <vector>

namespace qforge::models {

using StateDict = std::map<std::string, at::Tensor>;

// Parameters and buffers by dotted name, skipping quantizer submodules ("*_quantizer.*") and
// undefined tensors. The tensors alias the model's own.
StateDict model_state(const torch::nn::Module& model);

// Parses an HF-style config.json; errors name `who` (e.g. "models/bert") and the path.
nlohmann::json read_config_json(const std::string& path, const std::string& who);

struct LoadStateOptions {
  // Checkpoint keys ending in one of these are ignored (e.g. HF's "position_ids" buffers).
  std::vector<std::string> ignore_suffixes;
  // Model keys ending in one of these may be absent from the checkpoint (left as initialised),
  // e.g. "num_batches_tracked".
  std::vector<std::string> allow_missing;
  // Label for error messages, e.g. "models/bert: checkpoint.safetensors".
  std::string source = "checkpoint";
  // Load NaN / inf values and negative BatchNorm variances instead of refusing them.
  bool allow_non_finite = false;
};

// Copies `state` into `model` (under NoGradGuard, converting dtype). Throws qforge::Error listing
// every unknown key, missing key and shape mismatch before touching the model.
void load_model_state(torch::nn::Module& model, const StateDict& state, const LoadStateOptions& options = {});

}  // namespace qforge::models
