// Greedy and sampled next-token choice (sampling.h).
#include "framework/models/sampling.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "framework/core/error.h"

namespace qforge::models {
namespace {

constexpr const char* kSampling = "models/sampling";
constexpr double kMasked = -std::numeric_limits<double>::infinity();

std::vector<double> last_row(const at::Tensor& logits) {
  QF_REQUIRE(logits.defined() && logits.dim() >= 1 && logits.size(-1) >= 1, kSampling,
             ": expected logits [..., vocab], got ", logits.defined() ? logits.sizes() : at::IntArrayRef{});
  const at::Tensor row = logits.reshape({-1, logits.size(-1)})[-1].to(at::kDouble).contiguous();
  std::vector<double> l(row.data_ptr<double>(), row.data_ptr<double>() + row.numel());
  bool any = false;
  for (size_t i = 0; i < l.size(); ++i) {
    QF_REQUIRE(!std::isnan(l[i]) && l[i] != std::numeric_limits<double>::infinity(), kSampling, ": logit of id ", i,
               " is ", l[i]);
    any = any || l[i] != kMasked;
  }
  QF_REQUIRE(any, kSampling, ": every logit is -inf");
  return l;
}

void require_in_vocabulary(const std::vector<int64_t>& history, size_t vocab) {
  for (const int64_t id : history)
    QF_REQUIRE(id >= 0 && id < static_cast<int64_t>(vocab), kSampling, ": history id ", id,
               " is outside the vocabulary of ", vocab);
}

void penalize_repetitions(std::vector<double>& l, const std::vector<int64_t>& history, double penalty) {
  std::vector<bool> seen(l.size(), false);
  for (const int64_t id : history) {
    if (seen[id]) continue;
    seen[id] = true;
    l[id] = l[id] > 0 ? l[id] / penalty : l[id] * penalty;
  }
}

size_t argmax(const std::vector<double>& v) { return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin()); }

// The greedy choice read from float32 CPU logits where they lie (a decode step's [1, 1, vocab]):
// the first id of the largest logit, as argmax() of last_row() gives it (float to double is exact
// and keeps the order). -1 where it does not apply, or where a logit is NaN or +inf or every one is
// -inf (last_row then names the problem).
int64_t greedy_in_place(const at::Tensor& logits) {
  if (!logits.defined() || logits.dim() < 1 || logits.size(-1) < 1 || logits.numel() < logits.size(-1) ||
      logits.scalar_type() != at::kFloat || !logits.device().is_cpu() || !logits.is_contiguous())
    return -1;
  const int64_t vocab = logits.size(-1);
  const float* l = logits.data_ptr<float>() + (logits.numel() - vocab);
  float top = -std::numeric_limits<float>::infinity();
  bool bad = false;
  for (int64_t i = 0; i < vocab; ++i) {  // two branch-free reductions (vectorized)
    bad = bad | (l[i] != l[i]) | (l[i] == std::numeric_limits<float>::infinity());
    top = l[i] > top ? l[i] : top;
  }
  if (bad || top == -std::numeric_limits<float>::infinity()) return -1;
  for (int64_t i = 0; i < vocab; ++i)
    if (l[i] == top) return i;
  return -1;
}

void keep_top_k(std::vector<double>& l, int64_t k) {
  if (k <= 0 || k >= static_cast<int64_t>(l.size())) return;
  std::vector<double> sorted = l;
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<double>());
  const double kth = sorted[k - 1];
  for (double& x : l)
    if (x < kth) x = kMasked;
}

std::vector<double> softmax(const std::vector<double>& l) {
  const double top = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double sum = 0;
  for (size_t i = 0; i < l.size(); ++i) sum += p[i] = l[i] == kMasked ? 0.0 : std::exp(l[i] - top);
  for (double& x : p) x /= sum;
  return p;
}

// Keeps the most probable ids while the probability kept before each is below top_p.
void keep_top_p(std::vector<double>& p, double top_p) {
  if (top_p >= 1) return;
  std::vector<size_t> order(p.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  double kept = 0;
  for (size_t r = 0; r < order.size(); ++r) {
    if (r > 0 && kept >= top_p) p[order[r]] = 0;
    kept += p[order[r]];
  }
}

void keep_min_p(std::vector<double>& p, double min_p) {
  if (min_p <= 0) return;
  const double threshold = min_p * *std::max_element(p.begin(), p.end());
  for (double& x : p)
    if (x < threshold) x = 0;
}

}  // namespace

void SamplingOptions::validate() const {
  QF_REQUIRE(std::isfinite(temperature) && temperature >= 0, kSampling, ": temperature must be >= 0, got ", temperature);
  QF_REQUIRE(top_k >= 0, kSampling, ": top_k must be >= 0 (0: off), got ", top_k);
  QF_REQUIRE(std::isfinite(top_p) && top_p > 0 && top_p <= 1, kSampling, ": top_p must be in (0, 1], got ", top_p);
  QF_REQUIRE(std::isfinite(min_p) && min_p >= 0 && min_p <= 1, kSampling, ": min_p must be in [0, 1], got ", min_p);
  QF_REQUIRE(std::isfinite(repetition_penalty) && repetition_penalty > 0, kSampling,
             ": repetition_penalty must be > 0 (1: off), got ", repetition_penalty);
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), rng_(options.seed) { options_.validate(); }

std::vector<double> Sampler::probabilities(const at::Tensor& logits, const std::vector<int64_t>& history) const {
  std::vector<double> l = last_row(logits);
  require_in_vocabulary(history, l.size());
  if (options_.repetition_penalty != 1) penalize_repetitions(l, history, options_.repetition_penalty);
  if (options_.greedy()) {
    std::vector<double> one_hot(l.size(), 0.0);
    one_hot[argmax(l)] = 1;
    return one_hot;
  }
  // Shifted by the top logit first: a tiny temperature sends the rest to -inf, never the top to +inf (NaN).
  const double top = *std::max_element(l.begin(), l.end());
  for (double& x : l)
    if (x != kMasked) x = (x - top) / options_.temperature;
  keep_top_k(l, options_.top_k);
  std::vector<double> p = softmax(l);
  keep_top_p(p, options_.top_p);
  keep_min_p(p, options_.min_p);
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= total;
  return p;
}

at::Tensor Sampler::distribution(const at::Tensor& logits, const std::vector<int64_t>& history) const {
  const std::vector<double> p = probabilities(logits, history);
  return at::tensor(p, at::kDouble);
}

int64_t Sampler::next(const at::Tensor& logits, const std::vector<int64_t>& history) {
  if (options_.greedy() && options_.repetition_penalty == 1) {  // no copy of the vocabulary's logits
    const int64_t id = greedy_in_place(logits);
    if (id >= 0) {
      require_in_vocabulary(history, static_cast<size_t>(logits.size(-1)));
      return id;
    }
  }
  const std::vector<double> p = probabilities(logits, history);
  if (options_.greedy()) return static_cast<int64_t>(argmax(p));
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  double cumulative = 0;
  int64_t last_kept = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) continue;
    last_kept = static_cast<int64_t>(i);
    cumulative += p[i];
    if (cumulative > u) return last_kept;
  }
  return last_kept;  // u within rounding of 1
}

}  // namespace qforge::models
