// Generation with a KV cache for any cached causal LM forward (GPT-2, Llama), greedy or sampled
// (sampling.h), with the prompt (prefill) and decode phases timed apart: one forward over the
// prompt yields the first new token, then one single-token forward per further token.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "framework/models/kv_cache.h"
#include "framework/models/sampling.h"

namespace qforge::models {

// ids [1, T] (the positions after the cache's) -> logits [1, T, vocab]; the cache grows by T.
using CachedLmForward = std::function<at::Tensor(const at::Tensor& ids, KvCache* cache)>;

struct GenerationResult {
  at::Tensor tokens;  // [1, new_tokens] int64, the prompt excluded
  int64_t prompt_tokens = 0, new_tokens = 0;
  int64_t cache_bytes = 0;    // the KV cache's filled keys and values at the end (not spare capacity)
  bool stopped_at_eos = false;
  double prompt_seconds = 0;  // the prefill forward (it produces the first new token)
  double decode_seconds = 0;  // the single-token forwards after it
  double prompt_tokens_per_second() const { return prompt_seconds > 0 ? prompt_tokens / prompt_seconds : 0; }
  // Tokens produced by the decode phase (all but the first) per second.
  double decode_tokens_per_second() const {
    return decode_seconds > 0 && new_tokens > 1 ? (new_tokens - 1) / decode_seconds : 0;
  }
};

struct GenerateOptions {
  int64_t max_new_tokens = 64;  // >= 1
  std::vector<int64_t> eos;     // stop after any of these ids (they are kept in the output)
  SamplingOptions sampling;     // temperature 0: greedy
};

// Decodes after `prompt` ([1, T], int64, T >= 1) with a fresh cache, choosing each token with a
// Sampler over the prompt and the tokens so far (repetition penalty), and calls on_token (when
// set) with each new id as soon as it is chosen, inside the timed phases.
GenerationResult generate(const CachedLmForward& forward, const at::Tensor& prompt, const GenerateOptions& options,
                          const std::function<void(int64_t)>& on_token = {});

// Argmax decoding of up to max_new_tokens (>= 1) after `prompt` ([1, T], int64, T >= 1), stopping
// after `eos` when given. The cache starts empty.
GenerationResult greedy_generate(const CachedLmForward& forward, const at::Tensor& prompt, int64_t max_new_tokens,
                                 std::optional<int64_t> eos = std::nullopt);

}  // namespace qforge::models
