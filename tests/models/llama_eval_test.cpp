// framework/models/perplexity and generation: the sliding-window perplexity against a case worked
// by hand and against HF's perplexity-guide loop (llama_fixtures/perplexity_reference.json, by
// llama_reference.py), and greedy KV-cache generation against a cache-free argmax loop on a tiny Llama.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "framework/models/generation.h"
#include "framework/models/llama.h"
#include "framework/models/perplexity.h"
#include "tests/error_of.h"
#include "tests/paths.h"

namespace qforge::models {
namespace {

using qforge::testing::error_of;

// A 2-token "model" whose prediction depends only on the position inside the window: row j of
// kProbs is p(next token) after window position j. Logits are log-probabilities, so the
// log-softmax gives them back exactly.
const double kProbs[3][2] = {{0.5, 0.5}, {0.25, 0.75}, {0.9, 0.1}};
// Another such model, for the divergence between two.
const double kOtherProbs[3][2] = {{0.5, 0.5}, {0.5, 0.5}, {0.6, 0.4}};

at::Tensor logits_of(const at::Tensor& ids, const double (&probs)[3][2]) {
  const int64_t L = ids.size(1);
  at::Tensor out = at::empty({1, L, 2}, at::kFloat);
  for (int64_t j = 0; j < L; ++j)
    for (int64_t v = 0; v < 2; ++v) out[0][j][v] = std::log(probs[j][v]);
  return out;
}
at::Tensor positional_logits(const at::Tensor& ids) { return logits_of(ids, kProbs); }
at::Tensor other_positional_logits(const at::Tensor& ids) { return logits_of(ids, kOtherProbs); }

// A float model with random weights, GQA 4/2 (or 2/1 with one layer).
LlamaForCausalLM tiny_llama(int64_t vocab, int64_t layers, int64_t heads, uint64_t seed) {
  LlamaConfig c;
  c.vocab_size = vocab, c.hidden_size = 16, c.intermediate_size = 32, c.num_hidden_layers = layers;
  c.num_attention_heads = heads, c.num_key_value_heads = heads / 2;
  at::manual_seed(seed);
  LlamaForCausalLM m(c);
  m->eval();
  return m;
}

TEST(LlamaPerplexity, SlidingWindowsScoreEachTokenOnceAsWorkedByHand) {
  const at::Tensor tokens = at::tensor({0, 1, 1, 0, 1}, at::kLong);
  // max_length 3, stride 2: windows [0,3) scores tokens 1,2 (window positions 0,1 predict them);
  // [2,5) scores tokens 3,4 (predicted from positions 0,1 of that window); token 2 is context.
  PerplexityResult r = sliding_window_perplexity(positional_logits, tokens, {3, 2});
  EXPECT_EQ(r.windows, 2);
  EXPECT_EQ(r.tokens_scored, 4);
  EXPECT_NEAR(r.perplexity, std::pow(0.5 * 0.75 * 0.5 * 0.75, -1.0 / 4), 1e-6);
  EXPECT_EQ(r.max_length, 3);
  EXPECT_EQ(r.stride, 2);
  // stride = max_length: [0,3) scores 1,2; [3,5) cannot score its first token 3, scores token 4
  // from position 0.
  r = sliding_window_perplexity(positional_logits, tokens, {3, 3});
  EXPECT_EQ(r.tokens_scored, 3);
  EXPECT_NEAR(r.perplexity, std::pow(0.5 * 0.75 * 0.5, -1.0 / 3), 1e-6);
  EXPECT_NEAR(r.nll_per_token, -std::log(0.5 * 0.75 * 0.5) / 3, 1e-9);
}

TEST(LlamaPerplexity, RefusesBadOptionsLogitsAndTokens) {
  const at::Tensor tokens = at::tensor({0, 1, 1}, at::kLong);
  EXPECT_NE(error_of([&] { sliding_window_perplexity(positional_logits, tokens, {3, 4}); }).find("stride"),
            std::string::npos);
  EXPECT_NE(error_of([&] { sliding_window_perplexity(positional_logits, at::tensor({0, 5}, at::kLong), {3, 1}); })
                .find("token ids must lie in [0, 2)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { sliding_window_perplexity(positional_logits, at::tensor({7, 1, 0}, at::kLong), {3, 1}); })
                .find("token ids must lie in [0, 2)"),
            std::string::npos)
      << "token 0 is only context, never a target";
  auto nan = [](const at::Tensor& ids) { return positional_logits(ids) * NAN; };
  EXPECT_NE(error_of([&] { sliding_window_perplexity(nan, tokens, {3, 1}); }).find("non-finite"), std::string::npos);
  auto flat = [](const at::Tensor& ids) { return at::zeros({ids.size(1), 2}); };
  EXPECT_NE(error_of([&] { sliding_window_perplexity(flat, tokens, {3, 1}); }).find("expected [1, 3, vocab]"),
            std::string::npos);
}

TEST(LlamaPerplexity, EqualsHfPerplexityGuideLoopOnAFixture) {
  const std::string root = QFORGE_LLAMA_FIXTURES;
  nlohmann::json ref;
  std::ifstream(root + "/perplexity_reference.json") >> ref;
  LlamaForCausalLM m = load_llama_for_causal_lm(root + "/" + ref["fixture"].get<std::string>());
  m->eval();
  at::NoGradGuard ng;
  const at::Tensor tokens = at::tensor(ref["tokens"].get<std::vector<int64_t>>(), at::kLong);
  ASSERT_EQ(ref["runs"].size(), 3u);
  for (const auto& run : ref["runs"]) {
    const PerplexityOptions o{run["max_length"].get<int64_t>(), run["stride"].get<int64_t>()};
    const PerplexityResult r = sliding_window_perplexity([&](const at::Tensor& ids) { return m->forward(ids); }, tokens, o);
    const double want = run["perplexity"].get<double>();
    EXPECT_LT(std::abs(r.perplexity - want) / want, 1e-5) << "max_length " << o.max_length << ", stride " << o.stride;
    EXPECT_EQ(r.tokens_scored, run["tokens_scored"].get<int64_t>());
  }
}

// The windows of SlidingWindowsScoreEachTokenOnceAsWorkedByHand score tokens from window positions
// 0, 1, 0, 1: position 0 predicts alike in both models (KL 0, the same top token: the first of two
// equal), position 1 does not: KL((0.25, 0.75) || (0.5, 0.5)) = 0.25 ln 0.5 + 0.75 ln 1.5, and the
// top tokens differ.
TEST(LlamaPerplexity, KlDivergenceAsWorkedByHandAndZeroFromItself) {
  const at::Tensor tokens = at::tensor({0, 1, 1, 0, 1}, at::kLong);
  const KlDivergenceResult r = sliding_window_kl_divergence(positional_logits, other_positional_logits, tokens, {3, 2});
  const double k = 0.25 * std::log(0.25 / 0.5) + 0.75 * std::log(0.75 / 0.5);
  EXPECT_NEAR(r.mean_kl, k / 2, 1e-7);
  EXPECT_NEAR(r.median_kl, 0, 1e-12);  // nearest rank: the 2nd of 0, 0, k, k
  EXPECT_NEAR(r.p99_kl, k, 1e-7);
  EXPECT_NEAR(r.max_kl, k, 1e-7);
  EXPECT_DOUBLE_EQ(r.same_top_token, 0.5);
  EXPECT_EQ(r.test.tokens_scored, 4);
  EXPECT_EQ(r.base.windows, 2);
  EXPECT_NEAR(r.base.perplexity, std::pow(0.5 * 0.75 * 0.5 * 0.75, -1.0 / 4), 1e-6);
  EXPECT_NEAR(r.test.perplexity, 2.0, 1e-6);
  EXPECT_NE(error_of([&] { sliding_window_kl_divergence(positional_logits, other_positional_logits, tokens, {3, 4}); })
                .find("stride"),
            std::string::npos);

  // A model from itself: exactly 0, every top token the same, both perplexities the plain one.
  LlamaForCausalLM m = tiny_llama(40, 1, 2, 7);
  const auto forward = [&](const at::Tensor& ids) { return m->forward(ids); };
  const at::Tensor text = at::randint(0, 40, {40}, at::kLong);
  const KlDivergenceResult self = sliding_window_kl_divergence(forward, forward, text, {16, 8});
  EXPECT_EQ(self.max_kl, 0.0);
  EXPECT_EQ(self.same_top_token, 1.0);
  const PerplexityResult plain = sliding_window_perplexity(forward, text, {16, 8});
  EXPECT_DOUBLE_EQ(self.test.perplexity, plain.perplexity);
  EXPECT_DOUBLE_EQ(self.base.perplexity, plain.perplexity);
  EXPECT_EQ(self.test.tokens_scored, plain.tokens_scored);
  // Vocabularies of 40 and 2 (ids 0 and 1 lie in both).
  EXPECT_NE(error_of([&] { sliding_window_kl_divergence(forward, positional_logits, tokens, {3, 2}); })
                .find("the same vocabulary"),
            std::string::npos);
}

TEST(LlamaPerplexity, OfATinyLlamaEqualsTheMeanTokenLossOfOneWindow) {
  LlamaForCausalLM m = tiny_llama(40, 1, 2, 7);
  at::NoGradGuard ng;
  const at::Tensor tokens = at::randint(0, 40, {12}, at::kLong);
  const PerplexityResult r =
      sliding_window_perplexity([&](const at::Tensor& ids) { return m->forward(ids); }, tokens, {12, 12});
  const at::Tensor logits = m->forward(tokens.unsqueeze(0))[0].narrow(0, 0, 11);
  const double loss = at::cross_entropy_loss(logits, tokens.narrow(0, 1, 11)).item<double>();
  EXPECT_NEAR(r.nll_per_token, loss, 1e-5);
}

TEST(LlamaGeneration, GreedyWithACacheEqualsArgmaxOfTheFullForward) {
  LlamaForCausalLM m = tiny_llama(30, 2, 4, 11);
  at::NoGradGuard ng;
  const at::Tensor prompt = at::randint(0, 30, {1, 5}, at::kLong);
  const GenerationResult g =
      greedy_generate([&](const at::Tensor& ids, KvCache* cache) { return m->forward(ids, cache); }, prompt, 6);
  ASSERT_EQ(g.tokens.sizes(), at::IntArrayRef({1, 6}));
  at::Tensor seq = prompt;
  for (int64_t i = 0; i < 6; ++i) {
    const int64_t want = m->forward(seq)[0][-1].argmax().item<int64_t>();
    EXPECT_EQ(g.tokens[0][i].item<int64_t>(), want) << "token " << i;
    seq = at::cat({seq, at::full({1, 1}, want, at::kLong)}, 1);
  }
  EXPECT_EQ(g.prompt_tokens, 5);
  EXPECT_GT(g.prompt_seconds, 0);
  EXPECT_GT(g.decode_tokens_per_second(), 0);
  // Stops after eos.
  const int64_t first = g.tokens[0][0].item<int64_t>();
  const GenerationResult e = greedy_generate(
      [&](const at::Tensor& ids, KvCache* cache) { return m->forward(ids, cache); }, prompt, 6, first);
  EXPECT_EQ(e.new_tokens, 1);
  EXPECT_NE(error_of([&] { greedy_generate({}, at::zeros({2, 3}, at::kLong), 1); }).find("[1, T]"), std::string::npos);
}

}  // namespace
}  // namespace qforge::models
