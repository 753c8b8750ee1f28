// qgen's streaming of a generation: prints the decoded continuation as it grows and times that
// printing, so the prefill and decode times generate() reports are given without it.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/elapsed.h"
#include "framework/models/generation.h"
#include "framework/text/tokenizer.h"

namespace qforge::apps {

// Prints the decoded continuation as it grows, holding back a trailing partial UTF-8 character.
// add() runs inside generate()'s timed phases: the first id's in the prefill, the others' in decode.
class Streamer {
 public:
  explicit Streamer(const text::Tokenizer& t, std::FILE* out = stdout) : tok_(t), out_(out) {}
  void add(int64_t id) {
    const auto t0 = std::chrono::steady_clock::now();
    print(id);
    (ids_.size() == 1 ? first_seconds_ : later_seconds_) += seconds_since(t0);
  }
  double first_seconds() const { return first_seconds_; }  // spent in the prefill phase (the first id)
  double later_seconds() const { return later_seconds_; }  // spent in the decode phase

 private:
  void print(int64_t id) {
    ids_.push_back(id);
    const std::string text = tok_.decode(ids_, /*skip_special_tokens=*/true);
    if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return;
    if (text.compare(0, printed_.size(), printed_) == 0) std::fputs(text.c_str() + printed_.size(), out_);
    else std::fputs(("\n" + text).c_str(), out_);  // a decoder that rewrote earlier text: print it whole
    std::fflush(out_);
    printed_ = text;
  }
  const text::Tokenizer& tok_;
  std::FILE* out_;
  std::vector<int64_t> ids_;
  std::string printed_;
  double first_seconds_ = 0, later_seconds_ = 0;
};

// qgen's line of generate()'s phases without the streamer's printing (the model's prefill and decode
// times and rates), the decode phase's printing time beside them.
inline std::string phase_times(models::GenerationResult r, const Streamer& s) {
  r.prompt_seconds -= s.first_seconds();
  r.decode_seconds -= s.later_seconds();
  char line[320];
  std::snprintf(line, sizeof line, "prompt %lld tokens in %.3f s (%.1f tokens/s); decode %lld tokens in %.3f s "
                "(%.1f tokens/s; printing took %.3f s more); %s", static_cast<long long>(r.prompt_tokens),
                r.prompt_seconds, r.prompt_tokens_per_second(), static_cast<long long>(r.new_tokens - 1),
                r.decode_seconds, r.decode_tokens_per_second(), s.later_seconds(),
                r.stopped_at_eos ? "stopped at eos" : "stopped at --max-new-tokens");
  return line;
}

}  // namespace qforge::apps
