// The float stage's checkpoint with its provenance record (float_checkpoint.h).
#include "framework/pipeline/float_checkpoint.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <map>

#include "framework/io/checkpoint.h"
#include "framework/models/state_dict.h"

namespace qforge::pipeline {

namespace fs = std::filesystem;

namespace {

// Everything that decides the float weights: architecture and config, data, training, seed
// (effective values, defaults included). A float checkpoint records it on its first line.
constexpr const char* kProvenancePrefix = "# qforge float provenance: ";

nlohmann::json float_provenance(const Recipe& r) {
  return {{"model.arch", r.model.arch},
          {"model.config", r.model.config},
          {"data.dataset", r.data.dataset},
          {"data.batch_size", r.data.batch_size},
          {"data.validation_size", r.data.validation_size},
          {"data.max_train_examples", r.data.max_train_examples},
          {"data.seq_len", r.data.seq_len},
          {"data.examples_per_language", r.data.examples_per_language},
          {"data.tokens", r.data.tokens},
          {"train.epochs", r.train.epochs},
          {"train.lr", r.train.lr},
          {"train.weight_decay", r.train.weight_decay},
          {"train.warmup_steps", r.train.warmup_steps},
          {"train.grad_clip", r.train.grad_clip},
          {"train.max_steps", r.train.max_steps},
          {"seed", r.seed}};
}

}  // namespace

void save_float_checkpoint(torch::nn::Module& model, const std::string& path, const Recipe& r) {
  io::CheckpointData data;
  for (const auto& [k, v] : models::model_state(model)) data.parameters[k] = v;
  data.recipe = kProvenancePrefix + float_provenance(r).dump() + "\n" + r.resolved_yaml;
  fs::create_directories(fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path());
  io::save_checkpoint(path, data);
}

std::string load_float_checkpoint(torch::nn::Module& model, const std::string& path, const Recipe& r) {
  const io::CheckpointReader reader(path);
  std::string note = "float weights loaded from " + path;
  const std::string& text = reader.recipe();
  if (text.rfind(kProvenancePrefix, 0) != 0) {
    note += " (written without a provenance record: not checked against this recipe's model, data and training)";
  } else {
    const size_t eol = text.find('\n');
    nlohmann::json saved;
    try {
      saved = nlohmann::json::parse(text.substr(std::strlen(kProvenancePrefix), eol - std::strlen(kProvenancePrefix)));
    } catch (const std::exception& e) {
      throw Error("model.checkpoint " + path + ": unreadable provenance record (" + e.what() + ")");
    }
    const nlohmann::json want = float_provenance(r);
    std::string diffs;
    // Settings added after a checkpoint was written count as their value at the time.
    const std::map<std::string, nlohmann::json> added_later = {{"data.tokens", "chars"}};
    for (const auto& [k, v] : want.items()) {
      if (!saved.contains(k) && added_later.count(k)) saved[k] = added_later.at(k);
    }
    for (const auto& [k, v] : want.items())
      if (!saved.contains(k) || saved[k] != v)
        diffs += "\n  " + k + ": checkpoint " + (saved.contains(k) ? saved[k].dump() : std::string("(absent)")) +
                 ", this recipe " + v.dump();
    if (!diffs.empty())
      throw Error("model.checkpoint " + path + " holds float weights trained differently from what this recipe "
                  "would train:" + diffs + "\ndelete it to retrain, or point model.checkpoint at another file");
    note += " (model, data and training settings match)";
  }
  const io::CheckpointData data = reader.read(io::ReadOptions::parameters_only());
  models::LoadStateOptions o;
  o.source = path;
  models::load_model_state(model, data.parameters, o);
  return note;
}

}  // namespace qforge::pipeline
