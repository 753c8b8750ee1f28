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

// A float checkpoint records float_provenance (recipe.h) on its first line.
constexpr const char* kProvenancePrefix = "# qforge float provenance: ";

}  // namespace

void save_float_checkpoint(torch::nn::Module& model, const std::string& path, const Recipe& r) {
  io::CheckpointData data;
  for (const auto& [k, v] : models::model_state(model)) data.parameters[k] = v;
  data.recipe = kProvenancePrefix + float_provenance(r).dump() + "\n" + r.resolved_yaml;
  fs::create_directories(fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path());
  io::save_checkpoint(path, data);
}

namespace {

// "(settings match)" or why nothing was checked; throws naming every setting that differs.
std::string check_provenance(const io::CheckpointReader& reader, const std::string& path, const Recipe& r) {
  const std::string& text = reader.recipe();
  if (text.rfind(kProvenancePrefix, 0) != 0)
    return " (written without a provenance record: not checked against this recipe's model, data and training)";
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
                "would train:" + diffs + "\ndelete it to retrain, point model.checkpoint at another file, or put " +
                kFloatKeyToken + " in its name (one file per float training)");
  return " (model, data and training settings match)";
}

}  // namespace

std::string check_float_checkpoint(const std::string& path, const Recipe& r) {
  return "float weights from " + path + check_provenance(io::CheckpointReader(path), path, r);
}

std::string load_float_checkpoint(torch::nn::Module& model, const std::string& path, const Recipe& r) {
  const io::CheckpointReader reader(path);
  const std::string note = "float weights loaded from " + path + check_provenance(reader, path, r);
  const io::CheckpointData data = reader.read(io::ReadOptions::parameters_only());
  models::LoadStateOptions o;
  o.source = path;
  models::load_model_state(model, data.parameters, o);
  return note;
}

}  // namespace qforge::pipeline
