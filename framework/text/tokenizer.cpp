#include "framework/text/tokenizer.h"

#include "framework/core/error.h"
#include "framework/text/bpe_tokenizer.h"
#include "framework/text/sentencepiece_tokenizer.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace qforge::text {

namespace {

std::unique_ptr<Tokenizer> load_file(const std::filesystem::path& file) {
  QF_REQUIRE(std::filesystem::is_regular_file(file), "framework/text: no tokenizer file at '", file.string(), "'");
  if (file.extension() == ".json") return std::make_unique<BpeTokenizer>(BpeTokenizer::load(file.string()));
  return std::make_unique<SentencePieceTokenizer>(SentencePieceTokenizer::load(file.string()));
}

// The fallback tokenizer.model must give the added tokens tokenizer.json lists the same ids, or the
// model would read other ids than it was trained on.
void require_added_token_ids(const std::filesystem::path& json_path, const Tokenizer& model, const std::string& refused) {
  std::ifstream in(json_path, std::ios::binary);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("added_tokens") || !j["added_tokens"].is_array()) return;
  for (const nlohmann::json& t : j["added_tokens"]) {
    if (!t.is_object() || !t.contains("id") || !t.contains("content") || !t["id"].is_number_integer() ||
        !t["content"].is_string())
      continue;
    const std::string content = t["content"].get<std::string>();
    const int64_t id = t["id"].get<int64_t>();
    const std::optional<int64_t> got = model.token_to_id(content);
    QF_REQUIRE(got && *got == id, "framework/text: ", refused, "; the tokenizer.model beside it gives added token '",
               content, "' ", got ? "id " + std::to_string(*got) : std::string("no id"), ", not tokenizer.json's ", id,
               ", so neither is used");
  }
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path dir(path);
  if (!fs::is_directory(dir)) return load_file(dir);
  const fs::path json = dir / "tokenizer.json", model = dir / "tokenizer.model";
  const bool has_json = fs::is_regular_file(json), has_model = fs::is_regular_file(model);
  QF_REQUIRE(has_json || has_model, "framework/text: '", path, "' holds neither tokenizer.json nor tokenizer.model");
  if (!has_json) return load_file(model);
  try {
    return load_file(json);
  } catch (const Error& e) {
    // A folder may carry a tokenizer.json form qforge refuses beside the model it reads.
    if (!has_model) throw;
    std::unique_ptr<Tokenizer> fallback;
    try {
      fallback = load_file(model);
    } catch (const Error& m) {
      throw Error(std::string(e.what()) + "; and " + m.what());
    }
    require_added_token_ids(json, *fallback, e.what());
    return fallback;
  }
}

}  // namespace qforge::text
