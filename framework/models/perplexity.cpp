// Sliding-window perplexity (see perplexity.h).
#include "framework/models/perplexity.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "framework/core/error.h"

namespace qforge::models {
namespace {

constexpr const char* kPerplexity = "models/perplexity";

// log softmax (float64) of the logits predicting tokens [first, end) of one window: [end - first, vocab].
at::Tensor scored_log_probs(const at::Tensor& logits, const at::Tensor& window, int64_t begin, int64_t first,
                            int64_t end) {
  const int64_t L = window.size(0);
  QF_REQUIRE(logits.dim() == 3 && logits.size(0) == 1 && logits.size(1) == L, kPerplexity, ": the forward returned logits ",
             logits.sizes(), " for ids [1, ", L, "]; expected [1, ", L, ", vocab]");
  const int64_t vocab = logits.size(2);
  // The window's context ids too: a forward need not range-check the ids it embeds.
  QF_REQUIRE(window.min().item<int64_t>() >= 0 && window.max().item<int64_t>() < vocab, kPerplexity,
             ": token ids must lie in [0, ", vocab, ")");
  // Position p is predicted by the logits at p - 1.
  const at::Tensor rows = logits[0].narrow(0, first - begin - 1, end - first).to(at::kDouble);
  QF_REQUIRE(at::isfinite(rows).all().item<bool>(), kPerplexity, ": the forward returned non-finite logits in the window "
             "starting at token ", begin);
  return at::log_softmax(rows, -1);
}

// Sum of -log p(token p | tokens begin .. p-1) over p in [first, end), from the scored rows' log-probabilities.
double window_nll(const at::Tensor& log_probs, const at::Tensor& window, int64_t begin, int64_t first, int64_t end) {
  const at::Tensor targets = window.narrow(0, first - begin, end - first);
  return -log_probs.gather(1, targets.unsqueeze(1)).sum().item<double>();
}

void require_tokens(const at::Tensor& tokens) {
  QF_REQUIRE(tokens.dim() == 1 && tokens.scalar_type() == at::kLong && tokens.size(0) >= 2, kPerplexity,
             ": tokens must be a 1-D int64 tensor of at least 2 ids, got ", tokens.sizes(), " ", tokens.scalar_type());
}

// r's perplexity from its summed negative log-likelihood.
void finish(PerplexityResult& r, double nll) {
  r.nll_per_token = nll / static_cast<double>(r.tokens_scored);
  r.perplexity = std::exp(r.nll_per_token);
}

void require_options(const PerplexityOptions& o) {
  QF_REQUIRE(o.max_length >= 2 && o.stride >= 1 && o.stride <= o.max_length, kPerplexity, ": need max_length >= 2 and "
             "1 <= stride <= max_length, got max_length ", o.max_length, " and stride ", o.stride);
}

// Calls visit(begin, first, end) for each window that scores tokens [first, end) with context from begin.
template <typename Visit>
void for_each_window(int64_t n, const PerplexityOptions& o, Visit&& visit) {
  int64_t prev_end = 0;
  for (int64_t begin = 0; prev_end < n; begin += o.stride) {
    const int64_t end = std::min(begin + o.max_length, n), first = std::max(prev_end, begin + 1);
    prev_end = end;
    if (first < end) visit(begin, first, end);  // else nothing new: a last window inside the previous one
  }
}

}  // namespace

int64_t perplexity_windows(int64_t tokens, const PerplexityOptions& o) {
  require_options(o);
  int64_t windows = 0;
  for_each_window(tokens, o, [&](int64_t, int64_t, int64_t) { ++windows; });
  return windows;
}

PerplexityResult sliding_window_perplexity(const CausalLmForward& forward, const at::Tensor& tokens,
                                           const PerplexityOptions& o,
                                           const std::function<void(const PerplexityProgress&)>& on_window) {
  require_options(o);
  require_tokens(tokens);
  const int64_t n = tokens.size(0);
  PerplexityResult r;
  r.max_length = o.max_length, r.stride = o.stride;
  double nll = 0;
  const int64_t total = on_window ? perplexity_windows(n, o) : 0;
  at::NoGradGuard no_grad;
  for_each_window(n, o, [&](int64_t begin, int64_t first, int64_t end) {
    const at::Tensor window = tokens.narrow(0, begin, end - begin);
    nll += window_nll(scored_log_probs(forward(window.unsqueeze(0)), window, begin, first, end), window, begin,
                      first, end);
    r.tokens_scored += end - first;
    ++r.windows;
    if (on_window) on_window({r.windows, total, r.tokens_scored, n - 1});
  });
  finish(r, nll);
  return r;
}

KlDivergenceResult sliding_window_kl_divergence(const CausalLmForward& base, const CausalLmForward& test,
                                                const at::Tensor& tokens, const PerplexityOptions& o,
                                                const std::function<void(const PerplexityProgress&)>& on_window) {
  require_options(o);
  require_tokens(tokens);
  const int64_t n = tokens.size(0);
  KlDivergenceResult r;
  r.base.max_length = r.test.max_length = o.max_length, r.base.stride = r.test.stride = o.stride;
  double nll_base = 0, nll_test = 0;
  int64_t same = 0;
  std::vector<double> kl;
  kl.reserve(static_cast<size_t>(n - 1));
  const int64_t total = on_window ? perplexity_windows(n, o) : 0;
  at::NoGradGuard no_grad;
  for_each_window(n, o, [&](int64_t begin, int64_t first, int64_t end) {
    const at::Tensor window = tokens.narrow(0, begin, end - begin);
    const at::Tensor lb = scored_log_probs(base(window.unsqueeze(0)), window, begin, first, end);
    const at::Tensor lt = scored_log_probs(test(window.unsqueeze(0)), window, begin, first, end);
    QF_REQUIRE(lb.size(1) == lt.size(1), kPerplexity, ": the base model's vocabulary has ", lb.size(1),
               " tokens and the compared model's ", lt.size(1), "; the divergence needs the same vocabulary");
    nll_base += window_nll(lb, window, begin, first, end);
    nll_test += window_nll(lt, window, begin, first, end);
    const at::Tensor per_token = (lb.exp() * (lb - lt)).sum(1).contiguous();
    const double* d = per_token.data_ptr<double>();
    kl.insert(kl.end(), d, d + per_token.numel());
    same += lb.argmax(1).eq(lt.argmax(1)).sum().item<int64_t>();
    r.base.tokens_scored = r.test.tokens_scored += end - first;
    r.base.windows = ++r.test.windows;
    if (on_window) on_window({r.test.windows, total, r.test.tokens_scored, n - 1});
  });
  finish(r.base, nll_base);
  finish(r.test, nll_test);
  const auto count = static_cast<double>(kl.size());
  r.mean_kl = std::accumulate(kl.begin(), kl.end(), 0.0) / count;
  std::sort(kl.begin(), kl.end());
  // Nearest rank: the smallest value with at least q of the tokens at or below it.
  const auto rank = [&](double q) { return kl[static_cast<size_t>(std::max(1.0, std::ceil(q * count))) - 1]; };
  r.median_kl = rank(0.5), r.p99_kl = rank(0.99), r.max_kl = kl.back();
  r.same_top_token = static_cast<double>(same) / count;
  return r;
}

}  // namespace qforge::models
