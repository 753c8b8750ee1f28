// The internals the model checkpoint's writer (model_save.cpp) and reader (model_load.cpp)
// share: keys, the /model group (each quantized layer's scheme, docs/formats.md "Model group"),
// optimizer-state naming, and what a model save writes. Not a public header.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "framework/api/kv_cache_scheme.h"
#include "framework/io/checkpoint.h"
#include "framework/io/model_io.h"
#include "framework/nn/quantizable.h"

namespace qforge::io::model_file {

// "a.b" + "c" -> "a.b.c"; "" + "c" -> "c".
std::string join(const std::string& module, const std::string& name);
std::map<std::string, at::Tensor> to_map(const torch::OrderedDict<std::string, at::Tensor>& d);
// The submodule name of a quantization point: "input" -> "input_quantizer".
std::string child_of(const std::string& point);
// An LSQ quantizer whose learnable scale exists (it is created on the first forward).
bool lsq_initialised(const QuantizerImpl& q);

struct PointMeta {
  QuantizerImpl::Role role = QuantizerImpl::Role::kWeight;
  QuantizerConfig config;
  bool calibrated = false;
};

struct LayerMeta {
  std::string type;
  bool frozen = false;
  LayerScheme scheme;
  std::map<std::string, PointMeta> points;  // "weight", "input", "output", "other"
  at::Tensor float8_scale, float8_zero_point;  // frozen float8 weights
};

struct ModelMeta {
  std::map<std::string, LayerMeta> layers;  // module path -> layer
  // RPQ layers saved frozen (their tensors are stored as the unfrozen layer's): frozen after a load.
  std::vector<std::string> frozen_rpq;
  // The quantized KV-cache schemes of cache-keeping modules (GPT-2, Llama), by module path;
  // absent ones (and files older than the attribute) keep a float cache.
  std::map<std::string, KvCacheScheme> kv_cache;
};

void write_model_meta(const h5::Group& root, const ModelMeta& meta);
ModelMeta read_model_meta(const std::string& path);

// Optimizer state is keyed by TensorImpl* (Adam, AdamW) or by its string form (SGD's
// param_state keys in LibTorch 1.13).
template <class Map>
typename Map::key_type state_key(const Map&, const at::Tensor& p) {
  using K = typename Map::key_type;
  if constexpr (std::is_same_v<K, std::string>) {
    std::ostringstream os;  // c10::guts::to_string of the TensorImpl pointer, as the optimizers key it
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

std::map<const c10::TensorImpl*, std::string> parameter_names(const torch::nn::Module& model);
// "adam", "adamw", "sgd", or nullptr for an optimizer qforge cannot save.
const char* optimizer_kind(const torch::optim::Optimizer& o);

// What a model save writes: the checkpoint data and the /model group.
struct ModelFileData {
  CheckpointData data;
  ModelMeta meta;
};

// Every tensor of the model (and optimizer), aliased, with the layers' schemes.
ModelFileData collect(const torch::nn::Module& model, const SaveOptions& options);
// Deep copies, so a background write sees the model as it was.
ModelFileData snapshot_model(const ModelFileData& f);
// One crash-safe write of the checkpoint layout plus the /model group.
void write_model_file(const std::string& path, const ModelFileData& f);

}  // namespace qforge::io::model_file
