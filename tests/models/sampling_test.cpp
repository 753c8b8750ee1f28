// framework/models/sampling and generate(): each logits processor keeps exactly the documented set
// on hand-made distributions, temperature 0 and top-k 1 are greedy, a seed reproduces its tokens,
// draws follow the kept distribution, and sampled KV-cache generation streams what it returns.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "framework/models/generation.h"
#include "framework/models/llama.h"
#include "framework/models/sampling.h"
#include "tests/error_of.h"

namespace qforge::models {
namespace {

using qforge::testing::error_of;

// Logits whose softmax is `p` (ids in the given order).
at::Tensor logits_of(const std::vector<double>& p) {
  std::vector<double> l;
  for (double x : p) l.push_back(std::log(x));
  return at::tensor(l, at::kDouble);
}

std::vector<double> dist(const SamplingOptions& o, const at::Tensor& logits, const std::vector<int64_t>& history = {}) {
  const at::Tensor d = Sampler(o).distribution(logits, history);
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

void expect_kept(const std::vector<double>& got, const std::vector<double>& p, const std::vector<int64_t>& kept) {
  double total = 0;
  for (int64_t i : kept) total += p[i];
  ASSERT_EQ(got.size(), p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    const bool in = std::find(kept.begin(), kept.end(), static_cast<int64_t>(i)) != kept.end();
    EXPECT_NEAR(got[i], in ? p[i] / total : 0.0, 1e-12) << "id " << i;
  }
}

// Probabilities 0.5, 0.2, 0.15, 0.1, 0.05 on ids 3, 0, 4, 1, 2.
const std::vector<double> kP = {0.2, 0.1, 0.05, 0.5, 0.15};

TEST(Sampling, TopPKeepsTheMostProbableIdsUntilTheirMassReachesP) {
  SamplingOptions o;
  o.top_p = 0.75;  // 0.5, 0.2 (kept before: 0.5), 0.15 (0.7 < 0.75); 0.1 would follow 0.85
  expect_kept(dist(o, logits_of(kP)), kP, {3, 0, 4});
  o.top_p = 0.6;
  expect_kept(dist(o, logits_of(kP)), kP, {3, 0});
  o.top_p = 0.45;  // the most probable id is always kept
  expect_kept(dist(o, logits_of(kP)), kP, {3});
  o.top_p = 1;
  expect_kept(dist(o, logits_of(kP)), kP, {0, 1, 2, 3, 4});
}

TEST(Sampling, MinPKeepsIdsAtLeastMinPTimesTheMostProbable) {
  SamplingOptions o;
  o.min_p = 0.25;  // threshold 0.125
  expect_kept(dist(o, logits_of(kP)), kP, {3, 0, 4});
  o.min_p = 0.5;  // threshold 0.25
  expect_kept(dist(o, logits_of(kP)), kP, {3});
  o.min_p = 0.09;  // threshold 0.045: all
  expect_kept(dist(o, logits_of(kP)), kP, {0, 1, 2, 3, 4});
}

TEST(Sampling, TopKKeepsTiesWithTheKthLogitAndTemperatureDividesLogits) {
  SamplingOptions o;
  o.top_k = 2;
  expect_kept(dist(o, logits_of(kP)), kP, {3, 0});
  const at::Tensor ties = at::tensor({1.0, 3.0, 3.0, 2.0}, at::kDouble);
  o.top_k = 1;
  const std::vector<double> d = dist(o, ties);
  EXPECT_EQ(d, (std::vector<double>{0, 0.5, 0.5, 0}));
  SamplingOptions t;
  t.temperature = 2;
  const at::Tensor l = at::tensor({1.0, 2.0, 3.0, -1.0}, at::kDouble);
  const std::vector<double> got = dist(t, l);
  const at::Tensor want = at::softmax(l / 2, 0);
  for (int64_t i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[i].item<double>(), 1e-12);
}

TEST(Sampling, ProcessorsApplyInOrderTemperatureTopKTopPMinP) {
  // 0.4, 0.3, 0.2, 0.1. Top-k 3 renormalises to 4/9, 3/9, 2/9 before top-p 0.75 looks: the first
  // two hold 7/9 >= 0.75, so the third goes (top-p on the full 0.4, 0.3 = 0.7 would keep it).
  const std::vector<double> p4 = {0.4, 0.3, 0.2, 0.1};
  SamplingOptions o;
  o.top_k = 3;
  o.top_p = 0.75;
  const std::vector<double> got = dist(o, logits_of(p4));
  const std::vector<double> want = {4.0 / 7, 3.0 / 7, 0, 0};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << "id " << i;
  // Min-p after temperature 0.5: 4, 2, 1 become 16, 4, 1; min-p 0.2 of 16 drops 1 (4 / 16 = 0.25
  // stays), leaving 0.8, 0.2 (min-p before temperature would keep all three: 16/21, 4/21, 1/21).
  SamplingOptions m;
  m.temperature = 0.5;
  m.min_p = 0.2;
  const std::vector<double> gm = dist(m, logits_of({4.0 / 7, 2.0 / 7, 1.0 / 7}));
  EXPECT_NEAR(gm[0], 0.8, 1e-12);
  EXPECT_NEAR(gm[1], 0.2, 1e-12);
  EXPECT_EQ(gm[2], 0.0);
}

TEST(Sampling, ATinyTemperatureIsGreedyOverTheTopLogitsNotNaN) {
  // Dividing 2.0 by 1e-310 overflows to +inf; the shifted logits keep the top ones at 0.
  SamplingOptions o;
  o.temperature = 1e-310;
  const std::vector<double> d = dist(o, at::tensor({1.0, 2.0, 2.0, -5.0}, at::kDouble));
  EXPECT_EQ(d, (std::vector<double>{0, 0.5, 0.5, 0}));
}

TEST(Sampling, TemperatureZeroAndTopK1AreGreedy) {
  at::manual_seed(5);
  SamplingOptions zero;
  zero.temperature = 0;
  SamplingOptions k1;
  k1.top_k = 1;
  k1.seed = 99;
  Sampler a(zero), b(k1);
  for (int i = 0; i < 50; ++i) {
    const at::Tensor l = at::randn({1, 3, 37});
    const int64_t want = l[0][-1].argmax().item<int64_t>();
    EXPECT_EQ(a.next(l, {}), want);
    EXPECT_EQ(b.next(l, {}), want);
  }
}

// Greedy on float32 logits reads them in place: the first id of the largest logit (ties, -inf
// entries), the answer of the float64 path (a strided view, or a repetition penalty of 1.0 exactly
// set, takes it), and the same errors for NaN, +inf, all -inf and a history outside the vocabulary.
TEST(Sampling, GreedyOnFloatLogitsReadsThemInPlaceWithTheSameAnswersAndErrors) {
  SamplingOptions o;
  o.temperature = 0;
  Sampler s(o);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(s.next(at::tensor({1.0f, 3.0f, 3.0f, -inf}), {}), 1);
  EXPECT_EQ(s.next(at::tensor({-inf, -inf, -2.0f}), {}), 2);
  EXPECT_EQ(s.next(at::tensor({-0.0f, 0.0f}), {}), 0);
  at::manual_seed(8);
  for (int i = 0; i < 20; ++i) {
    const at::Tensor l = at::randn({2, 3, 50257});
    const int64_t want = l[1][-1].argmax().item<int64_t>();
    EXPECT_EQ(s.next(l, {7}), want);
    EXPECT_EQ(s.next(l.transpose(0, 1), {}), want);  // not contiguous (last row l[1][-1]): the float64 path
  }
  EXPECT_NE(error_of([&] { s.next(at::tensor({0.0f, NAN}), {}); }).find("logit of id 1 is nan"), std::string::npos);
  EXPECT_NE(error_of([&] { s.next(at::tensor({0.0f, inf}), {}); }).find("logit of id 1 is inf"), std::string::npos);
  EXPECT_NE(error_of([&] { s.next(at::tensor({-inf, -inf}), {}); }).find("every logit is -inf"), std::string::npos);
  EXPECT_NE(error_of([&] { s.next(at::tensor({0.0f, 1.0f}), {2}); }).find("history id 2 is outside"), std::string::npos);
  EXPECT_ANY_THROW(s.next(at::zeros({0, 5}), {}));  // no row to choose from (never read before the buffer)
}

TEST(Sampling, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingOptions o;
  o.temperature = 0;
  o.repetition_penalty = 1.5;
  // 2.0 / 1.5 = 1.33 falls below 1.9; -1.0 * 1.5 = -1.5 falls below -1.2.
  EXPECT_EQ(Sampler(o).next(at::tensor({2.0, 1.9, -3.0}), {0, 0}), 1);
  EXPECT_EQ(Sampler(o).next(at::tensor({-1.0, -1.2}), {0}), 1);
  EXPECT_EQ(Sampler(o).next(at::tensor({-1.0, -1.2}), {}), 0);
  o.temperature = 1;
  const std::vector<double> d = dist(o, at::tensor({0.0, 3.0, -2.0}, at::kDouble), {1, 2});
  const at::Tensor want = at::softmax(at::tensor({0.0, 2.0, -3.0}, at::kDouble), 0);
  for (int64_t i = 0; i < 3; ++i) EXPECT_NEAR(d[i], want[i].item<double>(), 1e-12);
}

TEST(Sampling, ASeedReproducesItsDrawsWhichFollowTheKeptDistribution) {
  SamplingOptions o;
  o.top_p = 0.75;
  o.seed = 1234;
  Sampler a(o), b(o);
  o.seed = 1235;
  Sampler c(o);
  std::vector<int64_t> da, db, dc;
  std::vector<double> counts(5, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    da.push_back(a.next(logits_of(kP), {}));
    db.push_back(b.next(logits_of(kP), {}));
    dc.push_back(c.next(logits_of(kP), {}));
    counts[da.back()] += 1.0 / n;
  }
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
  // Kept {3, 0, 4} with 0.5, 0.2, 0.15 of 0.85; 4 standard deviations of a binomial at n.
  for (int64_t id : {3, 0, 4, 1, 2}) {
    const double want = id == 3 ? 0.5 / 0.85 : id == 0 ? 0.2 / 0.85 : id == 4 ? 0.15 / 0.85 : 0;
    EXPECT_NEAR(counts[id], want, 4 * std::sqrt(want * (1 - want) / n) + 1e-12) << "id " << id;
  }
}

TEST(Sampling, BadOptionsAndLogitsAreErrorsNamingThem) {
  SamplingOptions o;
  o.temperature = -1;
  EXPECT_NE(error_of([&] { Sampler s(o); }).find("temperature must be >= 0"), std::string::npos);
  o = {};
  o.top_p = 0;
  EXPECT_NE(error_of([&] { Sampler s(o); }).find("top_p must be in (0, 1]"), std::string::npos);
  o = {};
  o.min_p = 2;
  EXPECT_NE(error_of([&] { Sampler s(o); }).find("min_p must be in [0, 1]"), std::string::npos);
  o = {};
  o.repetition_penalty = 0;
  EXPECT_NE(error_of([&] { Sampler s(o); }).find("repetition_penalty must be > 0"), std::string::npos);
  Sampler s(SamplingOptions{});
  EXPECT_NE(error_of([&] { s.next(at::tensor({0.0, NAN}), {}); }).find("logit of id 1 is nan"), std::string::npos);
  EXPECT_NE(error_of([&] { s.next(at::tensor({0.0, 1.0}), {5}); }).find("history id 5 is outside"), std::string::npos);
}

LlamaForCausalLM tiny_llama() {
  LlamaConfig c;
  c.vocab_size = 40, c.hidden_size = 16, c.intermediate_size = 32, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2;
  at::manual_seed(11);
  LlamaForCausalLM m(c);
  m->eval();
  return m;
}

TEST(LlamaGenerate, SampledDecodingStreamsItsTokensAndASeedReproducesThem) {
  LlamaForCausalLM m = tiny_llama();
  const CachedLmForward fwd = [&](const at::Tensor& ids, KvCache* cache) { return m->forward(ids, cache); };
  const at::Tensor prompt = at::tensor({3, 14, 15, 9}, at::kLong).unsqueeze(0);
  GenerateOptions o;
  o.max_new_tokens = 12;
  o.sampling.temperature = 1.3;
  o.sampling.top_k = 20;
  o.sampling.top_p = 0.95;
  o.sampling.min_p = 0.01;
  o.sampling.repetition_penalty = 1.1;
  o.sampling.seed = 42;
  std::vector<int64_t> streamed;
  const GenerationResult a = generate(fwd, prompt, o, [&](int64_t id) { streamed.push_back(id); });
  const GenerationResult b = generate(fwd, prompt, o);
  ASSERT_EQ(a.new_tokens, 12);
  EXPECT_TRUE(at::equal(a.tokens, b.tokens));
  EXPECT_EQ(streamed, std::vector<int64_t>(a.tokens.data_ptr<int64_t>(), a.tokens.data_ptr<int64_t>() + 12));
  EXPECT_GT(a.cache_bytes, 0);
  // top-k 1 is greedy_generate's argmax decoding, whatever the seed and temperature.
  GenerateOptions k1;
  k1.max_new_tokens = 12;
  k1.sampling.top_k = 1;
  k1.sampling.seed = 7;
  EXPECT_TRUE(at::equal(generate(fwd, prompt, k1).tokens, greedy_generate(fwd, prompt, 12).tokens));
  // Stops after an eos id, keeping it.
  GenerateOptions stop = o;
  stop.eos = {streamed[4]};
  const GenerationResult s = generate(fwd, prompt, stop);
  EXPECT_TRUE(s.stopped_at_eos);
  EXPECT_LE(s.new_tokens, 5);
  EXPECT_EQ(s.tokens[0][-1].item<int64_t>(), streamed[4]);
}

}  // namespace
}  // namespace qforge::models
