// The "pre_tokenizer" section of a Hugging Face tokenizer.json: the steps that cut text (between
// added tokens) into the pieces the BPE model tokenizes one by one. Supported: ByteLevel (with or
// without GPT-2's regex, add_prefix_space), Split on a regex or string with behaviour "Isolated",
// Metaspace (spaces to "▁", the prefix, optional split before each "▁"), and a Sequence of these.
// Anything else is refused naming its JSON key.
#pragma once

#include "framework/text/regex_split.h"

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <vector>

namespace qforge::text {

class PreTokenizer {
 public:
  // `pre_tokenizer`: the JSON value (null: the whole segment is one piece); `where` names the file.
  static PreTokenizer parse(const nlohmann::json& pre_tokenizer, const std::string& where);
  // GPT-2's: ByteLevel with its regex, no prefix space.
  static PreTokenizer byte_level(const std::string& pattern);

  // The pieces of one segment, in order; each step splits every piece of the step before, and
  // ByteLevel maps the bytes of its pieces to the byte-level alphabet. `at_start`: the segment
  // begins the text (Metaspace's prepend_scheme "first" prefixes only there).
  std::vector<std::string> pre_tokenize(const std::string& segment, bool at_start = true) const;

  // Whether a ByteLevel step runs (so ids decode through the byte-level alphabet).
  bool is_byte_level() const;

 private:
  enum class Prepend { kNever, kFirst, kAlways };
  struct Step {
    bool byte_level = false;        // else Split or Metaspace
    bool add_prefix_space = false;  // ByteLevel
    std::optional<RegexSplitter> regex;  // Split's pattern, or ByteLevel's when use_regex
    std::string replacement;        // Metaspace (non-empty marks the step as Metaspace)
    Prepend prepend = Prepend::kNever;
    bool split = false;
  };
  void add_step(const nlohmann::json& step, const std::string& key, const std::string& where);
  static Step metaspace_step(const nlohmann::json& step, const std::string& key, const std::string& where);
  static void metaspace(const Step& step, std::string piece, bool first, std::vector<std::string>& out);
  std::vector<Step> steps_;
};

}  // namespace qforge::text
