// Greedy and sampled generation with timed prefill and decode (see generation.h).
#include "framework/models/generation.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "framework/core/error.h"

namespace qforge::models {
namespace {

constexpr const char* kGeneration = "models/generation";

void require_logits(const at::Tensor& logits) {
  QF_REQUIRE(logits.dim() == 3 && logits.size(0) == 1 && logits.size(1) >= 1, kGeneration, ": the forward returned logits ",
             logits.sizes(), "; expected [1, T, vocab]");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

GenerationResult generate(const CachedLmForward& forward, const at::Tensor& prompt, const GenerateOptions& options,
                          const std::function<void(int64_t)>& on_token) {
  QF_REQUIRE(prompt.dim() == 2 && prompt.size(0) == 1 && prompt.size(1) >= 1 && prompt.scalar_type() == at::kLong,
             kGeneration, ": the prompt must be [1, T] int64 with T >= 1, got ", prompt.sizes(), " ", prompt.scalar_type());
  QF_REQUIRE(options.max_new_tokens >= 1, kGeneration, ": max_new_tokens must be >= 1, got ", options.max_new_tokens);
  Sampler sampler(options.sampling);
  at::NoGradGuard no_grad;
  KvCache cache;
  // Stores sized for the whole generation, up to 4096 positions (a huge max_new_tokens would
  // reserve memory never used); longer generations grow by doubling.
  cache.reserve(std::min<int64_t>(prompt.size(1) + options.max_new_tokens, 4096));
  GenerationResult r;
  r.prompt_tokens = prompt.size(1);
  const at::Tensor p = prompt.contiguous();
  std::vector<int64_t> seq(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
  auto choose = [&](const at::Tensor& logits) {
    require_logits(logits);
    seq.push_back(sampler.next(logits[0][-1], seq));
    if (on_token) on_token(seq.back());
    const auto& eos = options.eos;
    r.stopped_at_eos = std::find(eos.begin(), eos.end(), seq.back()) != eos.end();
  };
  auto t0 = std::chrono::steady_clock::now();
  choose(forward(prompt, &cache));
  r.prompt_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  while (static_cast<int64_t>(seq.size()) - r.prompt_tokens < options.max_new_tokens && !r.stopped_at_eos)
    choose(forward(at::full({1, 1}, seq.back(), prompt.options()), &cache));
  r.decode_seconds = seconds_since(t0);
  r.new_tokens = static_cast<int64_t>(seq.size()) - r.prompt_tokens;
  r.cache_bytes = cache.bytes();
  r.tokens = at::tensor(std::vector<int64_t>(seq.begin() + r.prompt_tokens, seq.end()), at::kLong).unsqueeze(0);
  return r;
}

GenerationResult greedy_generate(const CachedLmForward& forward, const at::Tensor& prompt, int64_t max_new_tokens,
                                 std::optional<int64_t> eos) {
  GenerateOptions o;
  o.max_new_tokens = max_new_tokens;
  if (eos) o.eos.push_back(*eos);
  o.sampling.temperature = 0;
  return generate(forward, prompt, o);
}

}  // namespace qforge::models
