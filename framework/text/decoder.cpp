#include "framework/text/decoder.h"

#include "framework/core/error.h"
#include "framework/text/byte_level.h"
#include "framework/text/normalizer.h"
#include "framework/text/utf8.h"

#include <nlohmann/json.hpp>

#include <optional>

namespace qforge::text {

namespace {

using nlohmann::json;

// The byte of a byte-fallback token "<0xAB>" (either case, as HF parses it), if `token` is one.
std::optional<unsigned char> fallback_byte(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return std::nullopt;
  unsigned value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                             : -1;
    if (digit < 0) return std::nullopt;
    value = value * 16 + static_cast<unsigned>(digit);
  }
  return static_cast<unsigned char>(value);
}

// Runs of byte tokens become their text when valid UTF-8, else one U+FFFD per byte (HF's rule).
std::vector<std::string> byte_fallback(const std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string bytes;
  size_t count = 0;
  auto flush = [&] {
    if (count == 0) return;
    if (find_invalid_utf8(bytes) == std::string::npos) {
      out.push_back(bytes);
    } else {
      std::string replacement;
      for (size_t i = 0; i < count; ++i) append_utf8(replacement, kReplacementChar);
      out.push_back(replacement);
    }
    bytes.clear();
    count = 0;
  };
  for (const std::string& t : tokens) {
    if (const auto b = fallback_byte(t)) {
      bytes += static_cast<char>(*b);
      ++count;
    } else {
      flush();
      out.push_back(t);
    }
  }
  flush();
  return out;
}

// Drops up to `start` leading and `stop` trailing copies of `c` (one UTF-8 character).
std::string strip(const std::string& token, const std::string& c, size_t start, size_t stop) {
  size_t begin = 0, end = token.size();
  for (size_t i = 0; i < start && token.compare(begin, c.size(), c) == 0 && begin < end; ++i) begin += c.size();
  for (size_t i = 0; i < stop && end - begin >= c.size() && token.compare(end - c.size(), c.size(), c) == 0; ++i)
    end -= c.size();
  return token.substr(begin, end - begin);
}

size_t count_field(const json& step, const char* name, const std::string& key, const std::string& where) {
  QF_REQUIRE(step.contains(name) && step[name].is_number_unsigned(), where, ": ", key, ".", name,
             " must be a non-negative integer");
  return step[name].get<size_t>();
}

}  // namespace

Decoder Decoder::byte_level() {
  Decoder d;
  d.is_null_ = false;
  d.steps_.push_back({Kind::kByteLevel, "", "", 0, 0});
  return d;
}

void Decoder::add_step(const json& step, const std::string& key, const std::string& where) {
  const std::string type = step.is_object() && step.contains("type") && step["type"].is_string()
                               ? step["type"].get<std::string>() : "";
  if (type == "Sequence") {
    QF_REQUIRE(step.contains("decoders") && step["decoders"].is_array(), where, ": ", key, ".decoders must be an array");
    for (size_t i = 0; i < step["decoders"].size(); ++i)
      add_step(step["decoders"][i], key + ".decoders[" + std::to_string(i) + "]", where);
  } else if (type == "ByteLevel" || type == "ByteFallback" || type == "Fuse") {
    steps_.push_back({type == "ByteLevel" ? Kind::kByteLevel : type == "Fuse" ? Kind::kFuse : Kind::kByteFallback,
                      "", "", 0, 0});
  } else if (type == "Replace") {
    const json& pattern = step.contains("pattern") ? step["pattern"] : json();
    QF_REQUIRE(pattern.is_object() && pattern.contains("String") && pattern["String"].is_string() &&
                   !pattern["String"].get<std::string>().empty() && step.contains("content") &&
                   step["content"].is_string(),
               where, ": ", key, " must have a {\"String\": \"...\"} pattern and a string content");
    steps_.push_back({Kind::kReplace, pattern["String"].get<std::string>(), step["content"].get<std::string>(), 0, 0});
  } else if (type == "Strip") {
    QF_REQUIRE(step.contains("content") && step["content"].is_string() && !step["content"].get<std::string>().empty(),
               where, ": ", key, ".content must be a character");
    steps_.push_back({Kind::kStrip, "", step["content"].get<std::string>(), count_field(step, "start", key, where),
                      count_field(step, "stop", key, where)});
  } else if (type == "Metaspace") {
    QF_REQUIRE(step.contains("replacement") && step["replacement"].is_string() &&
                   !step["replacement"].get<std::string>().empty(),
               where, ": ", key, ".replacement must be a character");
    // Prefixed unless the scheme is "never" (or add_prefix_space false in files before tokenizers 0.19).
    const bool prefixed = step.contains("prepend_scheme") ? step["prepend_scheme"] != "never"
                                                          : !step.contains("add_prefix_space") || step["add_prefix_space"] == true;
    steps_.push_back({Kind::kMetaspace, step["replacement"].get<std::string>(), prefixed ? "prefixed" : "", 0, 0});
  } else {
    throw Error(detail::str_cat(where, ": ", key, ".type ", step.is_object() && step.contains("type") ? step["type"].dump() : "(none)",
                                " is not supported (qforge reads ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence and null)"));
  }
}

Decoder Decoder::parse(const json& decoder, const std::string& where) {
  Decoder d;
  if (decoder.is_null()) return d;
  d.is_null_ = false;
  d.add_step(decoder, "decoder", where);
  return d;
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  if (is_null_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  for (const Step& step : steps_) {
    if (step.kind == Kind::kByteLevel || step.kind == Kind::kFuse) {
      std::string all;
      for (const std::string& t : tokens) all += step.kind == Kind::kByteLevel ? byte_level_decode_token(t) : t;
      tokens = {step.kind == Kind::kByteLevel ? utf8_lossy(all) : all};
    } else if (step.kind == Kind::kByteFallback) {
      tokens = byte_fallback(tokens);
    } else if (step.kind == Kind::kMetaspace) {
      // HF drops every replacement of the first token when prefixed, and spaces all others.
      for (size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = replace_all(tokens[i], step.pattern, i == 0 && !step.content.empty() ? "" : " ");
    } else {
      for (std::string& t : tokens)
        t = step.kind == Kind::kReplace ? replace_all(t, step.pattern, step.content)
                                        : strip(t, step.content, step.start, step.stop);
    }
  }
  std::string text;
  for (const std::string& t : tokens) text += t;
  return text;
}

}  // namespace qforge::text
