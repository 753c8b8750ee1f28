// Hadamard rotation of Llama models: the float logits are unchanged (computational invariance),
// tied and untied, with biases, with the online Hadamard on down_proj's input; the rotated model
// saves and loads with its hook; models that cannot be rotated are refused untouched.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <map>
#include <string>

#include <unistd.h>

#include "framework/api/quantize.h"
#include "framework/core/error.h"
#include "framework/io/model_io.h"
#include "framework/models/gguf_export.h"
#include "framework/models/gpt2.h"
#include "framework/models/llama.h"
#include "framework/nn/linear.h"
#include "framework/ptq/rotate.h"
#include "framework/report/report_json.h"

namespace qforge::ptq {
namespace {

namespace fs = std::filesystem;
using models::LlamaConfig;
using models::LlamaForCausalLM;

LlamaConfig config(int64_t hidden, int64_t inter, bool tied, bool biases) {
  LlamaConfig c;
  c.vocab_size = 61, c.hidden_size = hidden, c.intermediate_size = inter, c.num_hidden_layers = 3;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied, c.attention_bias = biases, c.mlp_bias = biases;
  return c;
}

// HF's init, then norm weights and biases away from ones and zeros, so folding them matters.
LlamaForCausalLM random_llama(const LlamaConfig& c, uint64_t seed) {
  at::manual_seed(seed);
  LlamaForCausalLM m(c);
  at::NoGradGuard g;
  for (auto& p : m->named_parameters()) {
    if (p.key().find("norm") != std::string::npos) p.value().uniform_(0.5, 1.5);
    if (p.key().find("bias") != std::string::npos) p.value().normal_(0.0, 0.02);
  }
  m->eval();
  return m;
}

at::Tensor ids() {
  at::manual_seed(3);
  return at::randint(0, 61, {2, 9}, at::kLong);
}

// max |a − b| / max |b|: float32 through three layers of re-associated sums (rows of length
// hidden and intermediate, each ~ sqrt(len) · 2^-24 relative) stays ~1e-6; 1e-5 leaves a margin.
double relative_max_error(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

std::map<std::string, at::Tensor> snapshot(const torch::nn::Module& m) {
  std::map<std::string, at::Tensor> s;
  for (const auto& p : m.named_parameters()) s[p.key()] = p.value().detach().clone();
  return s;
}

void expect_unchanged(const torch::nn::Module& m, const std::map<std::string, at::Tensor>& before) {
  const auto now = m.named_parameters();
  EXPECT_EQ(now.size(), before.size());
  for (const auto& p : now) EXPECT_TRUE(at::equal(p.value(), before.at(p.key()))) << p.key();
}

struct Case {
  const char* name;
  int64_t hidden, inter;
  bool tied, biases;
};

class RotateLlama : public ::testing::TestWithParam<Case> {};

TEST_P(RotateLlama, FloatLogitsEqualTheUnrotatedWithin1e5) {
  const Case k = GetParam();
  LlamaForCausalLM m = random_llama(config(k.hidden, k.inter, k.tied, k.biases), 11);
  at::NoGradGuard g;
  const at::Tensor before = m->forward(ids());
  RotateOptions o;
  o.seed = 42;
  const RotateReport r = rotate(*m, o);
  const at::Tensor after = m->forward(ids());
  EXPECT_LT(relative_max_error(after, before), 1e-5) << k.name;
  EXPECT_TRUE(m->config.down_proj_hadamard);
  EXPECT_EQ(r.notes.size(), k.tied ? 1u : 0u);
  EXPECT_FALSE(m->config.tie_word_embeddings);
  EXPECT_TRUE(at::equal(m->model->norm->weight, at::ones_like(m->model->norm->weight)));
  // Every weight moved: the rotation is not the identity.
  EXPECT_GT((m->model->embed_tokens->weight - random_llama(config(k.hidden, k.inter, k.tied, k.biases), 11)
                                                   ->model->embed_tokens->weight)
                .abs()
                .max()
                .item<double>(),
            1e-3);
  // Incremental decoding goes through the same hook.
  models::KvCache cache;
  const at::Tensor t = ids();
  m->forward(t.narrow(1, 0, 5), &cache);
  const at::Tensor step = m->forward(t.narrow(1, 5, 1), &cache);
  EXPECT_LT(relative_max_error(step.squeeze(1), before.select(1, 5)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RotateLlama,
    ::testing::Values(Case{"tied_sylvester_paley28", 64, 112, true, false},  // 112 = 4 · 28 (Paley II)
                      Case{"untied_biases_paley12_paley20", 48, 160, false, true}),  // 48 = 4 · 12, 160 = 8 · 20
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(RotateLlama, WithoutTheOnlineHadamardTheLogitsAlsoHold) {
  LlamaForCausalLM m = random_llama(config(64, 96, false, false), 5);  // 96 = 8 · 12
  at::NoGradGuard g;
  const at::Tensor before = m->forward(ids());
  RotateOptions o;
  o.online_down_proj = false;
  rotate(*m, o);
  EXPECT_FALSE(m->config.down_proj_hadamard);
  EXPECT_LT(relative_max_error(m->forward(ids()), before), 1e-5);
}

TEST(RotateLlama, WithoutTheQueryKeyHadamardTheValuesStayAndTheLogitsHold) {
  LlamaForCausalLM m = random_llama(config(64, 96, false, false), 5);
  LlamaForCausalLM ref = random_llama(config(64, 96, false, false), 5);
  at::NoGradGuard g;
  const at::Tensor before = m->forward(ids());
  RotateOptions o;
  o.online_qk = false;
  const RotateReport r = rotate(*m, o);
  EXPECT_FALSE(m->config.qk_hadamard);
  EXPECT_FALSE(r.online_qk);
  EXPECT_LT(relative_max_error(m->forward(ids()), before), 1e-5);
  // Without the value fold o_proj took the residual side only: Qᵀ·W_o, the unrotated weight's
  // column norms (a left orthogonal factor keeps them); the fold would mix each head's columns.
  auto o_proj = [](LlamaForCausalLM x) {
    return x->model->layers[0]->as<models::LlamaDecoderLayerImpl>()->self_attn->o_proj->weight.detach();
  };
  EXPECT_TRUE(at::allclose(o_proj(m).norm(2, {0}), o_proj(ref).norm(2, {0}), 1e-4, 1e-6));
}

// QuaRot's KV-cache rotation: keys with outlier channels (here k_proj's and v_proj's rows of one
// channel per head scaled 20x, the pattern of real models' keys) lose much of an int4 cache's
// precision to the channel's range; turning queries and keys by H after RoPE and values offline
// spreads it. The rotated model's float logits stay within 1e-5, its KV4 logits move less than the
// unrotated model's KV4 logits, and its quantized cache gives its fake-quantized forward's logits.
TEST(RotateLlama, KvCacheQuantHadamardOnKeysAndValuesCutsTheInt4CacheError) {
  const LlamaConfig c = config(128, 112, false, false);  // head_dim 32, 2 key/value heads
  auto planted = [&] {
    LlamaForCausalLM m = random_llama(c, 21);
    at::NoGradGuard g;
    for (const auto& l : *m->model->layers) {
      auto* attn = l->as<models::LlamaDecoderLayerImpl>()->self_attn.get();
      for (int64_t h = 0; h < c.kv_heads(); ++h) {
        attn->k_proj->weight[h * 32 + 3].mul_(20.0);
        attn->v_proj->weight[h * 32 + 9].mul_(20.0);
      }
    }
    return m;
  };
  KvCacheScheme kv4;
  kv4.qtype = qint4;
  LlamaForCausalLM plain = planted(), turned = planted();
  at::NoGradGuard g;
  const at::Tensor reference = plain->forward(ids());
  RotateOptions o;
  o.seed = 3;
  rotate(*turned, o);
  EXPECT_TRUE(turned->config.qk_hadamard);
  EXPECT_LT(relative_max_error(turned->forward(ids()), reference), 1e-5);
  plain->set_kv_cache_scheme(kv4);
  turned->set_kv_cache_scheme(kv4);
  const at::Tensor plain4 = plain->forward(ids()), turned4 = turned->forward(ids());
  const double plain_error = relative_max_error(plain4, reference), turned_error = relative_max_error(turned4, reference);
  EXPECT_LT(turned_error, plain_error / 2) << "unrotated KV4 " << plain_error << ", rotated " << turned_error;
  auto mean_error = [&](const at::Tensor& y) { return (y - reference).abs().mean().item<double>(); };
  EXPECT_LT(mean_error(turned4), 0.6 * mean_error(plain4));
  // The rotated model's int4 cache, filled by a prefill, gives the cacheless forward's logits bit
  // for bit (that forward attends to the fake-quantized rotated keys and values). A decode step
  // after it computes its keys from a one-row product, whose float rounding can move an int4 code.
  models::KvCache cache;
  EXPECT_TRUE(at::equal(turned->forward(ids(), &cache), turned4));
  EXPECT_GT(cache.bytes(), 0);
}

TEST(RotateLlama, SignsAreSeededAndRecorded) {
  at::Tensor s1, s2, s3;
  const at::Tensor q1 = random_hadamard(48, 7, &s1);
  random_hadamard(48, 7, &s2);
  random_hadamard(48, 8, &s3);
  EXPECT_TRUE(at::equal(s1, s2));
  EXPECT_FALSE(at::equal(s1, s3));
  EXPECT_TRUE(at::allclose(at::matmul(q1, q1.t()), at::eye(48, at::kDouble), 0.0, 1e-12));
}

TEST(RotateLlama, RotatedModelSavesAndLoadsWithItsOnlineHadamard) {
  LlamaForCausalLM m = random_llama(config(64, 112, false, false), 9);
  at::NoGradGuard g;
  rotate(*m);
  const at::Tensor want = m->forward(ids());
  const std::string dir = (fs::path(::testing::TempDir()) / "qforge_rotated_llama").string();
  fs::remove_all(dir);
  models::save_hf_llama(m, dir);
  LlamaForCausalLM back = models::load_llama_for_causal_lm(dir);
  back->eval();
  EXPECT_TRUE(back->config.down_proj_hadamard);
  EXPECT_TRUE(back->config.qk_hadamard);
  EXPECT_TRUE(at::equal(back->forward(ids()), want));
}

// What qgen does with a ptq.rotate run directory: a fresh model given the structure the run
// recorded loads the rotated checkpoint (an int4 KV cache) and computes the rotated model's
// logits. The query / key Hadamard leaves float scores unchanged, so only the quantized cache
// shows it: without it (a report older than it) the cache would quantize unrotated keys.
TEST(RotateLlama, PreparedStructureLoadsTheRotatedCheckpointWithTheQueryKeyHadamard) {
  const LlamaConfig c = config(64, 112, true, false);  // head_dim 16
  LlamaForCausalLM m = random_llama(c, 9);
  at::NoGradGuard g;
  // A key channel 20x the rest in each head: the unrotated keys' int4 step is then far coarser.
  for (const auto& l : *m->model->layers)
    for (int64_t h = 0; h < c.kv_heads(); ++h)
      l->as<models::LlamaDecoderLayerImpl>()->self_attn->k_proj->weight[h * 16 + 3].mul_(20.0);
  rotate(*m);
  KvCacheScheme kv4;
  kv4.qtype = qint4;
  m->set_kv_cache_scheme(kv4);
  const at::Tensor want = m->forward(ids());
  const std::string path =
      (fs::path(::testing::TempDir()) / ("qforge_rotated_llama_" + std::to_string(::getpid()) + ".h5")).string();
  io::save_model(*m, path);
  LlamaForCausalLM back = random_llama(c, 1);
  prepare_rotated_structure(*back);
  EXPECT_TRUE(back->config.qk_hadamard);
  io::load_model(*back, path);
  EXPECT_TRUE(back->config.kv_cache.quantized());
  EXPECT_TRUE(at::equal(back->forward(ids()), want));
  RotateOptions old;
  old.online_qk = false;
  LlamaForCausalLM stale = random_llama(c, 1);
  prepare_rotated_structure(*stale, old);
  io::load_model(*stale, path);
  const double stale_error = relative_max_error(stale->forward(ids()), want);
  EXPECT_GT(stale_error, 5e-3) << stale_error;  // 0.020 on this machine; 0 when restored
  fs::remove(path);
}

TEST(RotateLlama, GgufExportRefusesARotatedModel) {
  LlamaForCausalLM m = random_llama(config(64, 112, false, false), 9);
  models::GgufExportOptions o;
  for (int i = 0; i < 61; ++i) o.tokens.push_back("t" + std::to_string(i));
  EXPECT_NO_THROW(models::gguf_of(m, o));
  rotate(*m);
  try {
    models::gguf_of(m, o);
    FAIL() << "a rotated model exported to GGUF";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Hadamard-rotated"), std::string::npos) << e.what();
  }
}

TEST(RotateLlama, RefusesGpt2LayerNormAndLeavesItUntouched) {
  models::Gpt2Config c;
  c.vocab_size = 40, c.n_positions = 16, c.n_embd = 32, c.n_layer = 1, c.n_head = 2;
  models::Gpt2LMHeadModel gpt2(c);
  const auto before = snapshot(*gpt2);
  try {
    rotate(*gpt2);
    FAIL() << "GPT-2 rotated";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LayerNorm"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ln_1"), std::string::npos) << e.what();
  }
  expect_unchanged(*gpt2, before);
}

TEST(RotateLlama, RefusesASecondRotationAndUnsupportedSizesUntouched) {
  LlamaForCausalLM m = random_llama(config(64, 112, true, false), 4);
  rotate(*m);
  const auto rotated = snapshot(*m);
  EXPECT_THROW(rotate(*m), Error);
  expect_unchanged(*m, rotated);

  LlamaForCausalLM odd = random_llama(config(64, 100, true, false), 4);  // 100: no Hadamard matrix
  const auto before = snapshot(*odd);
  try {
    rotate(*odd);
    FAIL() << "intermediate_size 100 rotated";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("intermediate_size 100"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("96 and 104"), std::string::npos) << e.what();
  }
  expect_unchanged(*odd, before);
  EXPECT_TRUE(odd->config.tie_word_embeddings);  // not untied either
}

// Static KV-cache scales measured before the rotation would describe keys and values the rotated
// model no longer caches: refused, nothing changed.
TEST(RotateLlama, RefusesCalibratedStaticKvCacheScalesUntouched) {
  LlamaForCausalLM m = random_llama(config(64, 112, true, false), 4);
  KvCacheScheme kv;
  kv.qtype = qint8;
  kv.scales = KvScales::kStaticHead;
  m->set_kv_cache_scheme(kv);
  m->eval();
  {
    Calibration c(*m);
    at::NoGradGuard ng;
    m->forward(at::randint(0, m->config.vocab_size, {1, 8}, at::kLong));
  }
  const auto before = snapshot(*m);
  try {
    rotate(*m);
    FAIL() << "rotated a model with calibrated KV-cache scales";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("apply it first, then calibrate the cache"), std::string::npos) << e.what();
  }
  expect_unchanged(*m, before);
}

TEST(ActivationStats, EqualTheMomentsComputedInTorch) {
  nn::Linear lin(torch::nn::LinearOptions(16, 4));
  at::manual_seed(8);
  const std::vector<at::Tensor> xs = {at::randn({5, 16}) * 3 + 1, at::randn({2, 3, 16}).pow(3)};
  const std::vector<ActivationStats> s =
      activation_stats(*lin, 2, [&](int64_t b) { return lin->forward(xs[static_cast<size_t>(b)]); });
  ASSERT_EQ(s.size(), 1u);
  const at::Tensor x = at::cat({xs[0].reshape(-1), xs[1].reshape(-1)}).to(at::kDouble);
  const at::Tensor c = x - x.mean();
  const double kurtosis = (c.pow(4).mean() / c.pow(2).mean().pow(2)).item<double>();
  const double rms = x.pow(2).mean().sqrt().item<double>();
  EXPECT_EQ(s[0].count, x.numel());
  EXPECT_NEAR(s[0].kurtosis, kurtosis, 1e-9 * kurtosis);
  EXPECT_NEAR(s[0].max_over_rms, x.abs().max().item<double>() / rms, 1e-9);
}

// The papers' picture: an outlier channel (here a norm weight of 30 on one channel) gives q/k/v's
// input a heavy tail; after the rotation it is spread over every channel and the tail is gone.
TEST(RotateLlama, RotationFlattensAPlantedOutlierChannel) {
  LlamaForCausalLM m = random_llama(config(64, 112, false, false), 13);
  {
    at::NoGradGuard g;
    m->model->layers[0]->as<models::LlamaDecoderLayerImpl>()->input_layernorm->weight[5] = 30.0;
  }
  at::manual_seed(2);
  const at::Tensor batch = at::randint(0, 61, {4, 16}, at::kLong);
  const RunBatch run = [&](int64_t) { return m->forward(batch); };
  const ActivationStats before = activation_stats(*m, 1, run)[0];
  const at::Tensor logits = run(0).detach();
  rotate(*m);
  const ActivationStats after = activation_stats(*m, 1, run)[0];
  EXPECT_EQ(before.path, "model.layers.0.self_attn.q_proj");
  EXPECT_GT(before.kurtosis, 20.0);
  EXPECT_LT(after.kurtosis, 6.0);
  EXPECT_LT(after.max_over_rms, before.max_over_rms / 2);
  at::NoGradGuard g;
  EXPECT_LT(relative_max_error(run(0), logits), 1e-5);
}


// report.json pairs the statistics by path: the head a tied model gets untied is measured after
// only, so it has null before and every other row keeps its own layer's figures.
TEST(RotateLlama, ReportPairsTheStatisticsByPathWithTheUntiedHeadAfterOnly) {
  LlamaForCausalLM m = random_llama(config(64, 112, /*tied=*/true, false), 17);
  at::manual_seed(3);
  const at::Tensor batch = at::randint(0, 61, {2, 8}, at::kLong);
  const RotateReport rr = rotate_measured(*m, 1, [&](int64_t) { return m->forward(batch); });
  ASSERT_EQ(rr.after.size(), rr.before.size() + 1);
  const nlohmann::json layers = report::rotate_json(rr)["layers"];
  ASSERT_EQ(layers.size(), rr.after.size());
  std::map<std::string, const ActivationStats*> before;
  for (const ActivationStats& b : rr.before) before[b.path] = &b;
  int heads = 0;
  for (size_t i = 0; i < rr.after.size(); ++i) {
    const nlohmann::json& l = layers[i];
    EXPECT_EQ(l["path"], rr.after[i].path);
    EXPECT_EQ(l["kurtosis_after"].get<double>(), rr.after[i].kurtosis);
    if (rr.after[i].path == "lm_head") {
      ++heads;
      EXPECT_TRUE(l["kurtosis_before"].is_null()) << l;
      EXPECT_TRUE(l["max_over_rms_before"].is_null()) << l;
    } else {
      ASSERT_EQ(before.count(rr.after[i].path), 1u) << rr.after[i].path;
      EXPECT_EQ(l["kurtosis_before"].get<double>(), before[rr.after[i].path]->kurtosis);
      EXPECT_EQ(l["max_over_rms_before"].get<double>(), before[rr.after[i].path]->max_over_rms);
    }
  }
  EXPECT_EQ(heads, 1);
}

}  // namespace
}  // namespace qforge::ptq
