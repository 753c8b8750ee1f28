// Choosing the next token from a causal LM's logits: greedy, or a seeded draw after the logits
// processors Hugging Face's generate() applies, in its order (docs/llm.md "Sampling"):
//   1. repetition penalty r: every id already in the sequence (prompt and output) has its logit
//      l set to l / r when l > 0, else l · r;
//   2. temperature T: l / T (T = 0: greedy, the argmax after step 1; the lowest id on ties);
//   3. top-k: keep the ids whose logit is at least the k-th largest (ties with it stay);
//   4. top-p: with p = softmax(l), the ids in order of decreasing p (lower id first on ties) are
//      kept while the probability of those kept before them is below top_p (the first always);
//   5. min-p: keep the ids with p >= min_p · max p (p renormalised over the ids still kept);
//   then draw id i with probability p_i / (sum of kept p): with u = (mt19937_64() >> 11) · 2^-53
//   (the generator seeded with `seed`), the first id in id order whose cumulative probability
//   exceeds u.
// The same seed, options and logits give the same tokens on every machine.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>
#include <vector>

namespace qforge::models {

struct SamplingOptions {
  double temperature = 1.0;         // >= 0; 0: greedy
  int64_t top_k = 0;                // >= 0; 0: off
  double top_p = 1.0;               // (0, 1]; 1: off
  double min_p = 0.0;               // [0, 1]; 0: off
  double repetition_penalty = 1.0;  // > 0; 1: off
  uint64_t seed = 0;
  bool greedy() const { return temperature == 0; }
  // Throws qforge::Error naming the option that is out of its range (or not finite).
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  // The next id from `logits` ([vocab], or [..., vocab]: the last row) after `history`, the ids
  // of the sequence so far. Non-finite logits other than -inf (masked) are errors. Greedy with no
  // repetition penalty reads contiguous float32 CPU logits where they lie (no float64 copy of the
  // vocabulary per token): the same id, the first of the largest logit.
  int64_t next(const at::Tensor& logits, const std::vector<int64_t>& history);
  // The probabilities next() draws from (float64 [vocab], zero outside the kept set); for greedy
  // options, one-hot at the argmax.
  at::Tensor distribution(const at::Tensor& logits, const std::vector<int64_t>& history) const;
  const SamplingOptions& options() const { return options_; }

 private:
  std::vector<double> probabilities(const at::Tensor& logits, const std::vector<int64_t>& history) const;
  SamplingOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace qforge::models
