// Perplexity of a causal LM over a long token sequence, with fixed-length windows the way
// Hugging Face's "Perplexity of fixed-length models" guide computes it: windows of max_length
// tokens start every `stride` tokens; each window scores only the tokens the previous window did
// not reach (the rest is context), so with stride < max_length every scored token sees at least
// max_length - stride tokens of context. Token 0 is never scored (nothing predicts it), nor is a
// window's first token when stride == max_length.
//   perplexity = exp( sum over scored tokens p of -log softmax(logits[p - 1])[token p] / count )
// Works over any forward: ids [1, L] -> logits [1, L, vocab].
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace qforge::models {

using CausalLmForward = std::function<at::Tensor(const at::Tensor& ids)>;

struct PerplexityProgress {
  int64_t windows_done = 0, windows_total = 0;
  int64_t tokens_scored = 0, tokens_total = 0;  // tokens_total: all the windows will score (n - 1)
};

struct PerplexityOptions {
  int64_t max_length = 1024;  // tokens per window, >= 2
  int64_t stride = 512;       // 1 .. max_length
};

struct PerplexityResult {
  double perplexity = 0;
  double nll_per_token = 0;  // mean negative log-likelihood in nats
  int64_t tokens_scored = 0;
  int64_t windows = 0;
  int64_t max_length = 0, stride = 0;  // the options used, reported with the figure
};

// The number of windows that score a token over `tokens` ids (the forwards the function runs).
int64_t perplexity_windows(int64_t tokens, const PerplexityOptions& options);

// tokens: 1-D int64, at least 2. Throws qforge::Error for bad options, logits of the wrong shape,
// token ids outside the vocabulary, or non-finite logits.
// on_window (when set) is called after each scored window.
PerplexityResult sliding_window_perplexity(const CausalLmForward& forward, const at::Tensor& tokens,
                                           const PerplexityOptions& options = {},
                                           const std::function<void(const PerplexityProgress&)>& on_window = {});

// How far a model's next-token distributions are from a base model's (e.g. quantized against
// float) over the tokens sliding_window_perplexity scores, both models fed the same windows — the
// statistics of llama.cpp's `perplexity --kl-divergence`. Per scored token p (P = softmax of the
// logits at p - 1, in float64):
//   KL_p = sum over the vocabulary v of P_base(v) (log P_base(v) - log P_test(v))   (nats)
//   same top token: argmax P_base == argmax P_test
struct KlDivergenceResult {
  PerplexityResult base, test;  // each model's perplexity over the same windows
  double mean_kl = 0, median_kl = 0, p99_kl = 0, max_kl = 0;  // over scored tokens; percentiles nearest-rank
  double same_top_token = 0;                                  // fraction of scored tokens
};

// Throws as sliding_window_perplexity does, and when the two forwards' vocabularies differ.
KlDivergenceResult sliding_window_kl_divergence(const CausalLmForward& base, const CausalLmForward& test,
                                                const at::Tensor& tokens, const PerplexityOptions& options = {},
                                                const std::function<void(const PerplexityProgress&)>& on_window = {});

}  // namespace qforge::models
