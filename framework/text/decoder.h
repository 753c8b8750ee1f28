// The "decoder" section of a Hugging Face tokenizer.json: how token strings become text. ByteLevel
// (GPT-2 style), the Llama-2 form's Replace ("▁" by " "), ByteFallback ("<0xAB>" tokens to
// bytes), Fuse and Strip, and Metaspace, in a Sequence; null joins the tokens with spaces, as HF
// does. Others are refused naming the key.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace qforge::text {

class Decoder {
 public:
  static Decoder parse(const nlohmann::json& decoder, const std::string& where);
  static Decoder byte_level();

  std::string decode(std::vector<std::string> tokens) const;

 private:
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  struct Step {
    Kind kind;
    std::string pattern, content;  // Replace: pattern -> content; Strip: content (one character);
                                   // Metaspace: pattern = the replacement, content = "" or "prefixed"
    size_t start = 0, stop = 0;    // Strip: how many leading / trailing `content` characters go
  };
  void add_step(const nlohmann::json& step, const std::string& key, const std::string& where);
  std::vector<Step> steps_;
  bool is_null_ = true;
};

}  // namespace qforge::text
