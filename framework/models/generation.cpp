// Greedy generation with timed prefill and decode (see generation.h).
#include "framework/models/generation.h"

#include <ATen/ATen.h>

#include <chrono>
#include <vector>

#include "framework/core/error.h"

namespace qforge::models {
namespace {

constexpr const char* kGeneration = "models/generation";

int64_t next_token(const at::Tensor& logits) {
  QF_REQUIRE(logits.dim() == 3 && logits.size(0) == 1 && logits.size(1) >= 1, kGeneration, ": the forward returned logits ",
             logits.sizes(), "; expected [1, T, vocab]");
  return logits[0][-1].argmax().item<int64_t>();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

GenerationResult greedy_generate(const CachedLmForward& forward, const at::Tensor& prompt, int64_t max_new_tokens,
                                 std::optional<int64_t> eos) {
  QF_REQUIRE(prompt.dim() == 2 && prompt.size(0) == 1 && prompt.size(1) >= 1 && prompt.scalar_type() == at::kLong,
             kGeneration, ": the prompt must be [1, T] int64 with T >= 1, got ", prompt.sizes(), " ", prompt.scalar_type());
  QF_REQUIRE(max_new_tokens >= 1, kGeneration, ": max_new_tokens must be >= 1, got ", max_new_tokens);
  at::NoGradGuard no_grad;
  KvCache cache;
  GenerationResult r;
  r.prompt_tokens = prompt.size(1);
  std::vector<int64_t> out;
  auto t0 = std::chrono::steady_clock::now();
  out.push_back(next_token(forward(prompt, &cache)));
  r.prompt_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  while (static_cast<int64_t>(out.size()) < max_new_tokens && !(eos && out.back() == *eos)) {
    const at::Tensor step = at::full({1, 1}, out.back(), prompt.options());
    out.push_back(next_token(forward(step, &cache)));
  }
  r.decode_seconds = seconds_since(t0);
  r.new_tokens = static_cast<int64_t>(out.size());
  r.tokens = at::tensor(out, at::kLong).unsqueeze(0);
  return r;
}

}  // namespace qforge::models
