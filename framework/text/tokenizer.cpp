#include "framework/text/tokenizer.h"

#include "framework/core/error.h"
#include "framework/text/bpe_tokenizer.h"
#include "framework/text/sentencepiece_tokenizer.h"

#include <filesystem>

namespace qforge::text {

namespace {

std::unique_ptr<Tokenizer> load_file(const std::filesystem::path& file) {
  QF_REQUIRE(std::filesystem::is_regular_file(file), "framework/text: no tokenizer file at '", file.string(), "'");
  if (file.extension() == ".json") return std::make_unique<BpeTokenizer>(BpeTokenizer::load(file.string()));
  return std::make_unique<SentencePieceTokenizer>(SentencePieceTokenizer::load(file.string()));
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
    try {
      return load_file(model);
    } catch (const Error& m) {
      throw Error(std::string(e.what()) + "; and " + m.what());
    }
  }
}

}  // namespace qforge::text
