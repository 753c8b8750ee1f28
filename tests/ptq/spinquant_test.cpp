// Learned rotations (SpinQuant): the Cayley step stays orthogonal and descends; learning descends on
// a smooth loss of the folded weights and folds in what it learned; on a rotated, quantized Llama
// with planted outlier channels it moves the rotations while the float logits stay those of the
// unrotated model; refusals leave the model untouched. (Whether the learned rotations beat the
// Hadamard ones is measured on the trained tiny Llama, docs/rotations.md, not asserted here.)
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <string>

#include "framework/api/quantize.h"
#include "framework/core/error.h"
#include "framework/models/gpt2.h"
#include "framework/models/llama.h"
#include "framework/ptq/float_view.h"
#include "framework/ptq/rotate.h"
#include "framework/ptq/spinquant.h"
#include "planted_llama.h"

namespace qforge::ptq {
namespace {

using models::LlamaConfig;
using models::LlamaForCausalLM;

at::Tensor random_orthogonal(int64_t n, uint64_t seed) {
  at::manual_seed(seed);
  return std::get<0>(at::linalg_qr(at::randn({n, n}, at::kDouble)));
}

double orthogonality_error(const at::Tensor& U) {
  return (at::matmul(U.t(), U) - at::eye(U.size(0), U.options())).abs().max().item<double>();
}

// f(U) = ‖A·U − B‖²: its gradient 2·Aᵀ(A·U − B).
TEST(SpinQuant, CayleyStepStaysOrthogonalAndDescends) {
  const int64_t n = 24;
  at::manual_seed(5);
  const at::Tensor A = at::randn({40, n}, at::kDouble), B = at::randn({40, n}, at::kDouble);
  auto f = [&](const at::Tensor& U) { return (at::matmul(A, U) - B).pow(2).sum().item<double>(); };
  at::Tensor U = random_orthogonal(n, 7);
  const double f0 = f(U);
  double last = f0;
  for (int step = 0; step < 50; ++step) {
    const at::Tensor G = 2 * at::matmul(A.t(), at::matmul(A, U) - B);
    double alpha = 0;
    U = cayley_step(U, G, 0.005, &alpha);
    EXPECT_GT(alpha, 0.0);
    EXPECT_LE(alpha, 0.005);
    EXPECT_LT(orthogonality_error(U), 1e-12) << "step " << step;
    const double now = f(U);
    EXPECT_LE(now, last * (1 + 1e-12)) << "step " << step;
    last = now;
  }
  EXPECT_LT(last, 0.9 * f0);

  // First order: U·(I − α/2·W)(I + α/2·W)⁻¹ = U − α·U·W + O(α²), W = ½(UᵀG − GᵀU).
  const at::Tensor G = 2 * at::matmul(A.t(), at::matmul(A, U) - B);
  const double a = 1e-6;
  const at::Tensor ug = at::matmul(U.t(), G), W = 0.5 * (ug - ug.t());
  double alpha = 0;
  const at::Tensor next = cayley_step(U, G, a, &alpha);
  ASSERT_EQ(alpha, a);
  EXPECT_LT((next - (U - a * at::matmul(U, W))).abs().max().item<double>(), 1e-10);

  EXPECT_THROW(cayley_step(at::eye(3, at::kDouble), at::zeros({3, 4}, at::kDouble), 0.1), Error);
}

LlamaConfig small_config(bool biases, int64_t head_dim = 0) {
  LlamaConfig c;
  c.vocab_size = 96, c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 64;
  c.attention_bias = biases, c.mlp_bias = biases;
  c.head_dim = head_dim;  // 0: hidden / heads
  return c;
}

// Every quantizer fake-quantizes again (no FloatView left behind).
void expect_quantizers_on(const torch::nn::Module& m) {
  for (const auto& [path, layer] : quantizable_layers(m))
    for (const Quantizer& q : layer->quantizers()) EXPECT_TRUE(q->fake_quant()) << path;
}

// The planted-outlier model (residual-stream channels and norm weights 12× the rest), its key
// channels too, so int4 rows and an int4 cache suffer as in the papers.
LlamaForCausalLM planted(const LlamaConfig& c) {
  LlamaForCausalLM m = tools::planted_llama(c, 12.0);
  at::NoGradGuard g;
  for (auto& p : m->named_parameters())
    if (p.key().find("bias") != std::string::npos) p.value().normal_(0.0, 0.02);
  const int64_t D = c.head_size();
  for (const auto& l : *m->model->layers) {
    auto* attn = l->as<models::LlamaDecoderLayerImpl>()->self_attn.get();
    for (int64_t h = 0; h < c.kv_heads(); ++h) attn->k_proj->weight[h * D + 5].mul_(12.0);
  }
  return m;
}

// W16A4 (dynamic per-token int4 rows into every Linear, int4 weights per channel while
// quantized_weights), embedding and attention products float.
Scheme w4a4() {
  Scheme s(qint4);
  s.weight_granularity = Granularity::kPerChannel;
  s.group_size = 0;
  s.activations = ActivationMode::kDynamicPerToken;
  s.activation_qtype = qint4;
  for (const char* pattern : {"model.embed_tokens", "*.qk_matmul", "*.av_matmul"}) {
    LayerRule keep;
    keep.pattern = pattern;
    keep.keep_float = true;
    s.rules.push_back(keep);
  }
  return s;
}

// What learning starts from: the Hadamard rotation, then W4A4 (and an int4 cache).
void rotate_and_quantize(LlamaForCausalLM& m, uint64_t seed, bool kv4) {
  RotateOptions ro;
  ro.seed = seed;
  rotate(*m, ro);
  quantize(*m, w4a4());
  if (!kv4) return;
  KvCacheScheme cache;
  cache.qtype = qint4;
  m->set_kv_cache_scheme(cache);
}

// KL(float ‖ quantized) per token on batch b of `text` (batches of 4 sequences), against the float
// model's log-probabilities `float_logp` [N, T, vocab]: a loss without the text's own entropy
// (qtrain learns on the next-token cross-entropy, as SpinQuant does; this random model's text is
// close to uniform, where that signal drowns).
LossBatch kl_on(LlamaForCausalLM& m, const at::Tensor& text, const at::Tensor& float_logp) {
  return [&m, text, float_logp](int64_t b) {
    const at::Tensor logp = at::log_softmax(m->forward(text.narrow(0, b * 4, 4)), -1);
    const at::Tensor ref = float_logp.narrow(0, b * 4, 4);
    return (ref.exp() * (ref - logp)).sum(-1).mean();
  };
}

at::Tensor float_log_probs(LlamaForCausalLM& m, const at::Tensor& text) {
  at::NoGradGuard g;
  return at::log_softmax(m->forward(text), -1);
}

// Next-token cross-entropy of batch b (the refusal test's loss).
LossBatch loss_on(LlamaForCausalLM& m, const at::Tensor& text) {
  return [&m, text](int64_t b) {
    const at::Tensor ids = text.narrow(0, b * 4, 4);
    const int64_t T = ids.size(1);
    const at::Tensor logits = m->forward(ids.narrow(1, 0, T - 1));
    return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), ids.narrow(1, 1, T - 1).reshape({-1}));
  };
}

double max_relative(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

struct LearnCase {
  const char* name;
  bool biases, values, quantized_weights, kv4;
  int64_t head_dim = 0;
};

class SpinQuantLearn : public ::testing::TestWithParam<LearnCase> {};

// Learning on the quantized model's KL to the float one moves R1 (and R2) away from the Hadamard
// rotations while the float function stays the unrotated model's: every fold of spinquant.h's table
// (readers, writers and their biases, the values' rows, bias and o_proj's columns) is exercised,
// and a wrong one would change the float logits once U ≠ I.
TEST_P(SpinQuantLearn, KeepsTheFloatLogitsAndStaysOrthogonal) {
  const LearnCase& p = GetParam();
  const LlamaConfig c = small_config(p.biases, p.head_dim);
  LlamaForCausalLM m = planted(c);
  const at::Tensor train = tools::sample_text(m, 16, 24, 1), held_out = tools::sample_text(m, 8, 24, 2);
  const at::Tensor train_logp = float_log_probs(m, train), reference = float_log_probs(m, held_out);
  rotate_and_quantize(m, 1, p.kv4);
  SpinQuantOptions o;
  o.steps = 12;
  o.lr = 20;
  o.values = p.values;
  o.quantized_weights = p.quantized_weights;
  o.progress = false;
  const SpinQuantReport r = learn_rotations(*m, 4, kl_on(m, train, train_logp), o);

  EXPECT_EQ(r.losses.size(), 12u);
  EXPECT_EQ(r.hidden_size, 64);
  EXPECT_EQ(r.head_dim, p.head_dim > 0 ? p.head_dim : 16);
  EXPECT_LT(r.orthogonality_error, 1e-10);
  EXPECT_GT(r.rotation_change, 1e-3) << "R1 did not move";
  if (p.values) {
    EXPECT_GT(r.value_rotation_change, 1e-3) << "R2 did not move";
  } else {
    EXPECT_EQ(r.value_rotation_change, 0.0);
  }
  expect_quantizers_on(*m);
  EXPECT_TRUE(std::isfinite(r.loss_after));
  EXPECT_NEAR(r.float_loss_after, r.float_loss_before, 1e-6);  // a KL to the float model: ~0 both times
  // The float function is the unrotated model's (within float32 rounding through two layers), the
  // cache's scheme back as it was.
  EXPECT_EQ(m->config.kv_cache.quantized(), p.kv4);
  {
    const KvCacheScheme cache = m->config.kv_cache;
    m->set_kv_cache_scheme(KvCacheScheme{});
    const FloatView float_view(*m);
    at::NoGradGuard g;
    EXPECT_LT(max_relative(at::log_softmax(m->forward(held_out), -1), reference), 1e-5);
    m->set_kv_cache_scheme(cache);
  }
  // The norms stay folded, the head untied: a second learning run starts from this one's result.
  o.steps = 2;
  EXPECT_NO_THROW(learn_rotations(*m, 4, kl_on(m, train, train_logp), o));
}

INSTANTIATE_TEST_SUITE_P(Cases, SpinQuantLearn,
                         ::testing::Values(LearnCase{"R1R2_W16A4", false, true, false, false},
                                           LearnCase{"R1only_biases", true, false, false, false},
                                           LearnCase{"R1R2_W4A4KV4_biases", true, true, true, true},
                                           LearnCase{"R1R2_head_dim_8_biases", true, true, false, true, 8}),
                         [](const ::testing::TestParamInfo<LearnCase>& i) { return std::string(i.param.name); });

// A smooth loss that depends on the rotation: Σ w⁴ over the weights of every q_proj and down_proj
// (a rotation spreading large entries lowers it) read from the modules' members, which learning
// swaps for the folded values. Cayley steps on it descend, and what learning folds in is what it
// learned: the loss after equals the loss of the U's last step, recomputed on the assigned weights.
TEST(SpinQuant, DescendsOnASmoothLossThroughTheFoldedWeights) {
  const LlamaConfig c = small_config(true);
  LlamaForCausalLM m = planted(c);
  rotate(*m, RotateOptions{});
  auto quartic = [&m](int64_t) {
    at::Tensor sum = at::zeros({}, at::kFloat);
    for (const auto& item : *m->model->layers) {
      auto& layer = *item->as<models::LlamaDecoderLayerImpl>();
      sum = sum + layer.self_attn->q_proj->weight.pow(4).sum() + layer.mlp->down_proj->weight.pow(4).sum() +
            layer.self_attn->v_proj->weight.pow(4).sum();
    }
    return sum;
  };
  SpinQuantOptions o;
  o.steps = 40;
  o.lr = 50;
  o.progress = false;
  const SpinQuantReport r = learn_rotations(*m, 1, quartic, o);
  ASSERT_EQ(r.losses.size(), 40u);
  for (size_t i = 1; i < r.losses.size(); ++i) EXPECT_LE(r.losses[i], r.losses[i - 1] * (1 + 1e-6)) << "step " << i;
  EXPECT_LT(r.loss_after, 0.9 * r.loss_before);
  EXPECT_LE(r.loss_after, r.losses.back() * (1 + 1e-6));
  EXPECT_NEAR(r.loss_after, quartic(0).item<double>(), 1e-5 * r.loss_after);  // the folded weights
  EXPECT_EQ(r.r1_steps.size(), 40u);
  EXPECT_LT(r.orthogonality_error, 1e-10);
}

// learn_rotations_distilled: the KL to the float model computed inside (the float outputs from the
// same call with the quantizers passed through and the cache float) is the loss kl_on computes
// against precomputed float log-probabilities: the same first-step loss (within 1 %).
TEST(SpinQuant, DistilledLearnsOnTheKlToTheFloatModel) {
  const LlamaConfig c = small_config(false);
  LlamaForCausalLM m = planted(c);
  const at::Tensor train = tools::sample_text(m, 8, 24, 1);
  const at::Tensor train_logp = float_log_probs(m, train);
  rotate_and_quantize(m, 0, true);
  SpinQuantOptions o;
  o.steps = 4;
  o.lr = 20;
  o.quantized_weights = true;  // as kl_on's forward below quantizes them
  o.progress = false;
  const LossBatch reference = kl_on(m, train, train_logp);
  double expected = 0;
  {
    at::NoGradGuard g;
    expected = reference(0).item<double>();
  }
  const SpinQuantReport r = learn_rotations_distilled(
      *m, 2, [&m, &train](int64_t b) { return m->forward(train.narrow(0, b * 4, 4)); }, o);
  ASSERT_EQ(r.losses.size(), 4u);
  // Not bit for bit: the step's forward runs with autograd (ATen's attention, not the fused kernel)
  // and the float pass on 4 sequences, not 8, so int4 codes at a rounding boundary may differ.
  EXPECT_NEAR(r.losses[0], expected, 0.01 * expected);
  EXPECT_GT(r.losses[0], 1e-4);  // the int4 rows and cache are quantized while learning
  EXPECT_NEAR(r.float_loss_before, 0.0, 1e-7);
  EXPECT_NEAR(r.float_loss_after, 0.0, 1e-7);
  EXPECT_GE(r.float_output_change, 0.0);  // the float function's own check
  EXPECT_LT(r.float_output_change, 1e-5);
  EXPECT_GT(r.rotation_change, 0.0);
  EXPECT_TRUE(m->config.kv_cache.quantized());  // the cache's scheme back after each float pass
  expect_quantizers_on(*m);
  // With float weights the bypass holds the weight quantizers while each loss nests a FloatView of
  // every quantizer: all of them fake-quantize again afterwards.
  o.quantized_weights = false;
  const SpinQuantReport r2 = learn_rotations_distilled(
      *m, 2, [&m, &train](int64_t b) { return m->forward(train.narrow(0, b * 4, 4)); }, o);
  EXPECT_LT(r2.float_output_change, 1e-5);
  expect_quantizers_on(*m);
}

std::map<std::string, at::Tensor> snapshot(const torch::nn::Module& m) {
  std::map<std::string, at::Tensor> s;
  for (const auto& p : m.named_parameters()) s[p.key()] = p.value().detach().clone();
  return s;
}

void expect_unchanged(const torch::nn::Module& m, const std::map<std::string, at::Tensor>& before) {
  for (const auto& p : m.named_parameters()) EXPECT_TRUE(at::equal(p.value(), before.at(p.key()))) << p.key();
}

void expect_refused(torch::nn::Module& m, const LossBatch& loss, const SpinQuantOptions& o, const std::string& words,
                    int64_t batches = 2) {
  const auto before = snapshot(m);
  try {
    learn_rotations(m, batches, loss, o);
    ADD_FAILURE() << "not refused: " << words;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
  expect_unchanged(m, before);
}

TEST(SpinQuant, RefusalsLeaveTheModelUntouched) {
  const LlamaConfig c = small_config(false);
  SpinQuantOptions o;
  o.steps = 3;
  o.progress = false;
  LlamaForCausalLM m = planted(c);
  const at::Tensor text = tools::sample_text(m, 8, 12, 1);
  const LossBatch loss = loss_on(m, text);

  expect_refused(*m, loss, o, "rotate() first");  // norms not folded
  rotate(*m, RotateOptions{});
  SpinQuantOptions bad = o;
  bad.steps = 0;
  expect_refused(*m, loss, bad, "steps");
  bad = o;
  bad.lr = 0;
  expect_refused(*m, loss, bad, "lr");
  expect_refused(*m, loss, o, "batches", 0);

  quantize(*m, w4a4());
  KvCacheScheme kv;
  kv.qtype = qint8;
  kv.scales = KvScales::kStaticHead;
  m->set_kv_cache_scheme(kv);
  expect_refused(*m, loss, o, "static KV cache");
  m->set_kv_cache_scheme(KvCacheScheme{});

  // A solved (fixed) weight grid.
  auto* q = m->model->layers[0]->as<models::LlamaDecoderLayerImpl>()->self_attn->q_proj.get();
  Quantizer wq = q->weight_quantizer();
  wq->set_qparams(wq->qparams(q->weight));
  expect_refused(*m, loss, o, "fixed weight grid");

  // A loss that turns non-finite mid-way stops learning and restores the weights.
  LlamaForCausalLM fresh = planted(c);
  rotate_and_quantize(fresh, 0, false);
  int calls = 0;
  const LossBatch base = loss_on(fresh, text);
  const LossBatch nan_later = [&](int64_t b) {
    at::Tensor l = base(b);
    return ++calls > 4 ? l * std::nan("") : l;
  };
  expect_refused(*fresh, nan_later, o, "not finite");
  expect_quantizers_on(*fresh);
  // Non-finite with the learned rotations folded in (the loss after learning: calls 7 and 8 with
  // 3 steps on 2 batches): the entry weights come back.
  calls = 0;
  const LossBatch nan_after = [&](int64_t b) {
    at::Tensor l = base(b);
    return ++calls > 6 ? l * std::nan("") : l;
  };
  expect_refused(*fresh, nan_after, o, "with the learned rotations folded in");
  expect_quantizers_on(*fresh);
  // Codebook weights fit their levels once: refused when fake-quantized while learning.
  LlamaForCausalLM kmeans = planted(c);
  rotate(*kmeans, RotateOptions{});
  Scheme k4 = w4a4();
  k4.weights = qkmeans4;
  quantize(*kmeans, k4);
  SpinQuantOptions with_weights = o;
  with_weights.quantized_weights = true;
  expect_refused(*kmeans, loss_on(kmeans, text), with_weights, "codebook weights");
  // A pre_quant_scale (SmoothQuant / AWQ) does not commute with the rotation.
  auto* up = fresh->model->layers[1]->as<models::LlamaDecoderLayerImpl>()->mlp->up_proj.get();
  up->set_pre_quant_scale(at::ones({c.hidden_size}));
  expect_refused(*fresh, base, o, "pre_quant_scale");

  models::Gpt2Config gc;
  gc.vocab_size = 32, gc.n_positions = 16, gc.n_embd = 32, gc.n_layer = 1, gc.n_head = 2;
  models::Gpt2LMHeadModel gpt2(gc);
  expect_refused(*gpt2, loss, o, "Llama-family");
}

}  // namespace
}  // namespace qforge::ptq
