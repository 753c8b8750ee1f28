// Model checkpoints: a whole qforge model -- float tensors, each qforge layer's LayerScheme, static
// activation qparams, LSQ parameters, frozen (packed) weights and optimizer state -- in one HDF5
// checkpoint (format "qforge.checkpoint" v1 plus a /model group of layer schemes, docs/formats.md),
// loaded back into a model in the same state, into a freshly built float model (which becomes
// quantized / frozen as saved), or dequantized into a float model. Also the safetensors export of a
// frozen model. Sits above the layers (framework/nn) and below apps.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <future>
#include <string>
#include <vector>

#include "framework/api/module_like.h"
#include "framework/io/checkpoint.h"

namespace qforge::io {

struct SaveOptions {
  // Adam, AdamW or SGD: per-parameter state is saved keyed by parameter name. Others throw.
  const torch::optim::Optimizer* optimizer = nullptr;
  int64_t step = 0;
  std::string recipe;  // recipe text (YAML) used; may be empty
};

struct LoadModelOptions {
  // Every selected file entry must have a model counterpart and every model tensor an entry.
  // Non-strict loads list them in LoadReport instead.
  bool strict = true;
  // Fill the float weights of float layers with the saved (fake-)quantized weights' values: the
  // model stays float, without quantizers.
  bool dequantize = false;
  // Only the layers / tensors at or below this module path ("encoder.layer.3"); empty: all.
  std::string prefix;
  // Skip plain buffers (e.g. BatchNorm statistics) and optimizer state. Quantizer qparams still
  // come with their layers: they are part of the layer's scheme.
  bool parameters_only = false;
  // When set (and not parameters_only), its state is restored from the file's; its parameters are
  // matched to the file by the model's parameter names.
  torch::optim::Optimizer* optimizer = nullptr;
  // Load NaN / inf parameters and buffers (and negative BatchNorm variances) instead of refusing
  // them. Quantizer state is checked by its own rules either way.
  bool allow_non_finite = false;
};

struct LoadReport {
  std::vector<std::string> missing_keys;     // model tensors without an entry (non-strict only)
  std::vector<std::string> unexpected_keys;  // file entries without a model tensor (non-strict)
  std::vector<std::string> quantized_layers; // layers that got the saved scheme attached
  std::vector<std::string> frozen_layers;    // layers rebuilt frozen from packed weights
  int64_t step = 0;
  std::string recipe;
};

// Writes `model` crash-safely (temporary file, fsync, rename). Throws qforge::Error naming the
// layer or key for state it cannot save (e.g. an unsupported optimizer); the old file stays.
void save_model(const torch::nn::Module& model, const std::string& path, const SaveOptions& options = {});

// A background model save: wait() blocks until the file is committed and rethrows the writer's
// error; the destructor waits too (printing an unobserved error, never throwing).
// The background save of a model is a checkpoint save: the same handle.
using ModelSaveHandle = SaveHandle;

// Snapshots every tensor of the model (and optimizer) before returning, then writes on a
// background thread: training may continue at once.
ModelSaveHandle save_model_async(const torch::nn::Module& model, const std::string& path,
                                 const SaveOptions& options = {});

// Loads `path` into `model`. Reads and checks everything first -- missing / unexpected keys,
// shapes, dtypes, qtypes, schemes the layers accept, the frozen weights themselves -- and changes
// the model only when all passed, so a failed load leaves it exactly as it was. Errors name the
// file and the dataset: "framework/io: m.h5: dataset '/parameters/fc1/weight' has shape [8, 16],
// model expects [16, 8]". Layers already frozen cannot be loaded into (build a fresh model).
LoadReport load_model(torch::nn::Module& model, const std::string& path, const LoadModelOptions& options = {});

// Writes a frozen (or float) model as safetensors: float tensors as they are; each packed weight
// as "<name>" (its codes: I8 / U8, packed as in the checkpoint), "<name>.scale" (F32) and
// "<name>.zero_point" (I32); "__metadata__" holds "format": "qforge.quantized" and
// "qforge.quantized": a JSON object describing each packed weight (qtype, bits, granularity, axis,
// group_size, packing, shape, symmetric).
void export_safetensors(const torch::nn::Module& model, const std::string& path);

// ModuleHolder conveniences (nn::Linear, user TORCH_MODULEs).
template <class Holder, class = ModuleLike<Holder>>
void save_model(const Holder& model, const std::string& path, const SaveOptions& options = {}) {
  save_model(detail::module_of(model), path, options);
}
template <class Holder, class = ModuleLike<Holder>>
ModelSaveHandle save_model_async(const Holder& model, const std::string& path, const SaveOptions& options = {}) {
  return save_model_async(detail::module_of(model), path, options);
}
template <class Holder, class = ModuleLike<Holder>>
LoadReport load_model(Holder& model, const std::string& path, const LoadModelOptions& options = {}) {
  return load_model(detail::module_of(model), path, options);
}
template <class Holder, class = ModuleLike<Holder>>
void export_safetensors(const Holder& model, const std::string& path) {
  export_safetensors(detail::module_of(model), path);
}

}  // namespace qforge::io
