// Single-file and sharded safetensors weights of an HF folder (see hf_folder.h).
#include "framework/models/hf_folder.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "framework/core/error.h"
#include "framework/format/safetensors.h"

namespace qforge::models {
namespace {

constexpr const char* kHfFolder = "models/hf_folder";

// Shard name -> the tensors the index places in it.
std::map<std::string, std::set<std::string>> shard_plan(const nlohmann::json& index, const std::string& path) {
  QF_REQUIRE(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), kHfFolder, ": ", path,
             " has no \"weight_map\" object");
  std::map<std::string, std::set<std::string>> plan;
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    QF_REQUIRE(shard.is_string(), kHfFolder, ": ", path, " maps '", tensor, "' to ", shard.dump(), ", not a file name");
    const std::string name = shard.get<std::string>();
    QF_REQUIRE(!name.empty() && name.find('/') == std::string::npos && name.find('\\') == std::string::npos &&
                   name != "." && name != "..",
               kHfFolder, ": ", path, " maps '", tensor, "' to '", name, "', which is not a file in the folder");
    plan[name].insert(tensor);
  }
  QF_REQUIRE(!plan.empty(), kHfFolder, ": ", path, " lists no tensors");
  return plan;
}

HfWeights read_sharded(const std::string& dir, const std::string& index_path) {
  HfWeights out;
  out.source = index_path;
  for (const auto& [shard, names] : shard_plan(read_config_json(index_path, kHfFolder), index_path)) {
    const std::string shard_path = dir + "/" + shard;
    io::SafetensorsFile file = io::read_safetensors(shard_path);
    for (const std::string& name : names) {
      auto it = file.tensors.find(name);
      QF_REQUIRE(it != file.tensors.end(), kHfFolder, ": ", index_path, " places '", name, "' in ", shard,
                 ", which does not hold it");
      out.tensors[name] = std::move(it->second);
      file.tensors.erase(it);
    }
    QF_REQUIRE(file.tensors.empty(), kHfFolder, ": ", shard_path, " holds '", file.tensors.begin()->first, "', which ",
               index_path, " does not place there");
  }
  return out;
}

}  // namespace

HfWeights read_hf_weights(const std::string& dir) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(dir)) return {io::read_safetensors(dir).tensors, dir};
  const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
  if (fs::exists(single)) return {io::read_safetensors(single).tensors, single};
  if (fs::exists(index)) return read_sharded(dir, index);
  const bool pickled = fs::exists(dir + "/pytorch_model.bin") || fs::exists(dir + "/pytorch_model.bin.index.json");
  throw Error(detail::str_cat(kHfFolder, ": ", dir, " has neither model.safetensors nor model.safetensors.index.json",
                              pickled ? " (pickled pytorch_model.bin checkpoints are not read: convert them to "
                                        "safetensors)"
                                      : ""));
}

void write_hf_folder(const std::string& dir, const nlohmann::json& config, const StateDict& state) {
  std::filesystem::create_directories(dir);
  const std::string config_path = dir + "/config.json";
  std::ofstream out(config_path);
  out << config.dump(2) << "\n";
  QF_REQUIRE(out.flush(), kHfFolder, ": cannot write ", config_path);
  StateDict tensors;
  for (const auto& [k, v] : state) tensors[k] = v.detach().contiguous();
  io::write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
}

}  // namespace qforge::models
