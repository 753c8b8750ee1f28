// The weights of a Hugging Face model folder: `model.safetensors`, or the shards that
// `model.safetensors.index.json` names ({"weight_map": {tensor: shard file}}). F16 / BF16 tensors
// arrive as float32 (framework/format/safetensors.h converts on read). Also the writer of such a folder.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "framework/models/state_dict.h"

namespace qforge::models {

struct HfWeights {
  StateDict tensors;
  std::string source;  // the file (or index) read, for messages
};

// Throws qforge::Error naming the folder when neither file exists (and saying that pickled
// pytorch_model.bin checkpoints are not read), and naming the tensor and shard when the index
// and its shards disagree: a listed tensor missing from its shard, a shard tensor the index does
// not list, a shard name that leaves the folder.
// `dir` may also be one .safetensors file, read as it is.
HfWeights read_hf_weights(const std::string& dir);

// Writes `dir`/config.json and `dir`/model.safetensors (the tensors as given, HF names), creating
// the folder: what the loaders read back.
void write_hf_folder(const std::string& dir, const nlohmann::json& config, const StateDict& state);

}  // namespace qforge::models
