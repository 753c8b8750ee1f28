// AWQ: the scale search against brute-force α sweeps written here (the paper's activation scales
// and AutoAWQ's duo scales), recovering a planted outlier input channel and beating
// round-to-nearest; the block objective against the block run here with its group rounded; the
// clipping search against a per-block brute force; folding leaving float Llama and GPT-2 models unchanged (norms, v→o, up→down,
// pre_quant_scale); a Llama end to end, alone and followed by GPTQ; bad inputs refused.
#include "framework/ptq/awq.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <map>
#include <memory>

#include "fake_quant/fake_quantize.h"
#include "framework/api/quantize.h"
#include "framework/api/quantizer.h"
#include "framework/models/gpt2.h"
#include "framework/models/llama.h"
#include "framework/ptq/float_view.h"
#include "framework/ptq/imatrix.h"
#include "framework/ptq/ptq.h"
#include "tests/ptq/fixtures.h"

namespace qforge::ptq {
namespace {

using testing::int_group_spec;

at::Tensor rtn(const at::Tensor& w, const QSpec& spec) { return fake_quantize(w, weight_minmax_qparams(w, spec, "test")); }

// Activations with one channel far louder than the rest (as LLM hidden states have).
at::Tensor planted_outlier_inputs(int64_t rows, int64_t k, int64_t channel, double gain, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor x = at::randn({rows, k});
  x.select(1, channel).mul_(gain);
  return x;
}

// The α sweep written out: one α at a time, s normalised by sqrt(max · min), output error summed.
std::pair<double, double> brute_force_alpha(const at::Tensor& x, const at::Tensor& w, const QSpec& spec, int grid) {
  const at::Tensor m = x.abs().mean(0).to(at::kDouble);
  const at::Tensor y = at::matmul(x, w.t()).to(at::kDouble);
  double best_e = std::numeric_limits<double>::infinity(), best_a = -1;
  for (int k = 0; k < grid; ++k) {
    const double a = static_cast<double>(k) / grid;
    at::Tensor s = at::ones({x.size(1)}, at::kDouble);
    for (int64_t j = 0; j < x.size(1); ++j) s[j] = std::max(std::pow(m[j].item<double>(), a), 1e-4);
    s = (s / std::sqrt(s.max().item<double>() * s.min().item<double>())).to(at::kFloat);
    const at::Tensor wq = rtn(w * s.unsqueeze(0), spec) / s.unsqueeze(0);
    const double e = (at::matmul(x, wq.t()).to(at::kDouble) - y).pow(2).sum().item<double>() / y.pow(2).sum().item<double>();
    if (e < best_e) best_e = e, best_a = a;
  }
  return {best_a, best_e};
}

TEST(Awq, ScaleSearchRecoversThePlantedOutlierChannelAndBeatsRoundToNearest) {
  const int64_t K = 128, channel = 37;
  const at::Tensor x = planted_outlier_inputs(1024, K, channel, 40, 1);
  at::manual_seed(2);
  const at::Tensor w = at::randn({96, K});
  AwqOptions o;
  o.scales = AwqScales::kActivation;
  for (const QSpec& spec : {int_group_spec(qint4, 32), int_group_spec(qint3, 64), int_group_spec(qint4, 0)}) {
    const AwqScaleSearch r = awq_search_scale(x, x.abs().mean(0), {w}, {spec}, o);
    const auto [ref_alpha, ref_error] = brute_force_alpha(x, w, spec, 20);
    EXPECT_NEAR(r.alpha, ref_alpha, 1e-12) << spec.to_string();
    EXPECT_NEAR(r.error_scaled, ref_error, 1e-6 * ref_error) << spec.to_string();
    EXPECT_GT(r.alpha, 0) << spec.to_string();
    EXPECT_EQ(r.scale.argmax().item<int64_t>(), channel) << spec.to_string();
    // The outlier channel's columns keep far more resolution: the error drops well below RTN's.
    EXPECT_LT(r.error_scaled, 0.7 * r.error_rtn) << spec.to_string();
  }
}

TEST(Awq, ScaleSearchOnEvenInputsKeepsRoundToNearest) {
  at::manual_seed(3);
  const at::Tensor x = at::ones({64, 32});  // every channel alike: s is 1 at every α
  const at::Tensor w = at::randn({8, 32});
  AwqOptions o;
  o.scales = AwqScales::kActivation;
  const AwqScaleSearch r = awq_search_scale(x, x.abs().mean(0), {w}, {int_group_spec(qint4, 16)}, o);
  EXPECT_EQ(r.alpha, 0);
  EXPECT_FALSE(r.duo);
  EXPECT_DOUBLE_EQ(r.error_scaled, r.error_rtn);
  EXPECT_TRUE(at::equal(r.scale, at::ones({32})));
}

// AutoAWQ's duo scales written out: w̄ from each group's |w| / max|w| one group at a time, then the
// identity and c = mean|x|^α / (w̄^(1−α) + 1e-4) for every α, the least output error winning.
TEST(Awq, DuoScalesMatchABruteForceSweepAndBothTakesTheBetterFamily) {
  const int64_t K = 128, channel = 11;
  const at::Tensor x = planted_outlier_inputs(512, K, channel, 20, 21);
  at::manual_seed(22);
  at::Tensor w = at::randn({48, K});
  w.slice(1, 64, 96).mul_(6);  // uneven weight magnitudes: w̄ matters
  const QSpec spec = int_group_spec(qint4, 32);
  const at::Tensor m = x.abs().mean(0).to(at::kDouble);
  const at::Tensor y = at::matmul(x, w.t()).to(at::kDouble);
  at::Tensor w_mean = at::zeros({K}, at::kDouble);
  for (int64_t n = 0; n < w.size(0); ++n)
    for (int64_t g0 = 0; g0 < K; g0 += 32) {
      const at::Tensor blk = w[n].slice(0, g0, g0 + 32).abs().to(at::kDouble);
      w_mean.slice(0, g0, g0 + 32) += blk / (blk.max().item<double>() + 1e-6);
    }
  w_mean /= static_cast<double>(w.size(0));
  EXPECT_TRUE(at::allclose(awq_weight_mean({w}, {spec}).to(at::kDouble), w_mean, 1e-5, 1e-6));
  auto error = [&](const at::Tensor& c) {
    at::Tensor s = c.clamp_min(1e-4);
    s = (s / std::sqrt(s.max().item<double>() * s.min().item<double>())).to(at::kFloat);
    const at::Tensor wq = rtn(w * s.unsqueeze(0), spec) / s.unsqueeze(0);
    return (at::matmul(x, wq.t()).to(at::kDouble) - y).pow(2).sum().item<double>() / y.pow(2).sum().item<double>();
  };
  const double e_identity = error(at::ones({K}, at::kDouble));
  double duo_e = e_identity, duo_a = -1, act_e = e_identity;
  for (int k = 0; k < 20; ++k) {
    const double a = k / 20.0;
    const double e = error(m.pow(a) / (w_mean.pow(1 - a) + 1e-4));
    if (e < duo_e) duo_e = e, duo_a = a;
    if (k > 0) act_e = std::min(act_e, error(m.pow(a)));
  }
  AwqOptions o;
  o.scales = AwqScales::kDuo;
  const AwqScaleSearch duo = awq_search_scale(x, x.abs().mean(0), {w}, {spec}, o);
  ASSERT_GE(duo_a, 0) << "the identity beat every duo candidate: the check below is vacuous";
  EXPECT_TRUE(duo.duo);
  EXPECT_NEAR(duo.alpha, duo_a, 1e-12);
  EXPECT_NEAR(duo.error_scaled, duo_e, 1e-6 * duo_e);
  EXPECT_NEAR(duo.error_rtn, e_identity, 1e-9 * e_identity);
  o.scales = AwqScales::kBoth;
  const AwqScaleSearch both = awq_search_scale(x, x.abs().mean(0), {w}, {spec}, o);
  EXPECT_NEAR(both.error_scaled, std::min(duo_e, act_e), 1e-6 * std::min(duo_e, act_e));
  EXPECT_EQ(both.duo, duo_e < act_e);
  std::printf("duo alpha %.2f error %.5f, activation error %.5f, identity %.5f\n", duo_a, duo_e, act_e, e_identity);
}

TEST(Awq, ClipSearchPicksEachBlocksBestRatioAndNeverRaisesItsError) {
  const int64_t N = 6, K = 64, g = 16;
  at::Tensor x = planted_outlier_inputs(256, K, 5, 8, 4);
  x.select(1, 3).mul_(0.1);
  at::manual_seed(5);
  at::Tensor w = at::randn({N, K});
  w.index_put_({0, 3}, 20.0);  // a weight outlier on a quiet input: clipping its group pays
  const QSpec spec = int_group_spec(qint3, g);
  const at::Tensor ratio = awq_search_clip(x, w, spec, AwqOptions{});
  ASSERT_EQ(ratio.sizes(), (at::IntArrayRef{N, K / g}));
  auto block_error = [&](const at::Tensor& wc, int64_t n, int64_t b) {
    const at::Tensor d = (rtn(wc, spec) - w).slice(1, b * g, (b + 1) * g)[n];
    return at::matmul(x.slice(1, b * g, (b + 1) * g), d).pow(2).sum().item<double>();
  };
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < K / g; ++b) {
      double best = std::numeric_limits<double>::infinity(), best_r = 0;
      for (int i = 0; i < 10; ++i) {
        const double r = 1.0 - i / 20.0;
        const at::Tensor lim = w.abs().reshape({N, K / g, g}).amax(-1, true) * r;
        const at::Tensor wc = at::maximum(at::minimum(w.reshape({N, K / g, g}), lim), -lim).reshape({N, K});
        const double e = block_error(wc, n, b);
        if (e < best * (1 - 1e-6)) best = e, best_r = r;
      }
      EXPECT_NEAR(ratio[n][b].item<double>(), best_r, 1e-6) << "row " << n << " group " << b;
    }
  EXPECT_LT(ratio[0][0].item<double>(), 1.0);  // the outlier's group is clipped
  const at::Tensor wc = awq_apply_clip(w, ratio, spec);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < K / g; ++b) EXPECT_LE(block_error(wc, n, b), block_error(w, n, b) * (1 + 1e-5));
}

TEST(Awq, BadInputsAreErrors) {
  const at::Tensor w = at::randn({4, 32}), x = at::randn({16, 32});
  const QSpec spec = int_group_spec(qint4, 16);
  at::Tensor bad = x.clone();
  bad[0][0] = NAN;
  EXPECT_THROW(awq_search_scale(bad, x.abs().mean(0), {w}, {spec}, AwqOptions{}), Error);
  EXPECT_THROW(awq_search_scale(x.slice(1, 0, 16), x.abs().mean(0), {w}, {spec}, AwqOptions{}), Error);
  EXPECT_THROW(awq_search_scale(x, x.abs().mean(0), {w}, {}, AwqOptions{}), Error);
  QSpec per_tensor = spec;
  per_tensor.granularity = Granularity::kPerTensor;
  EXPECT_THROW(awq_search_clip(x, w, per_tensor, AwqOptions{}), Error);
  EXPECT_THROW(awq_search_clip(x, w, int_group_spec(qint4, 24), AwqOptions{}), Error);
}

using testing::outlier_llama;
using testing::token_batches;

Scheme w4_g32() {
  Scheme s(qint4);
  s.weight_granularity = Granularity::kPerGroup;
  s.group_size = 32;
  s.weight_symmetric = false;
  return s;
}

std::string leaf(const std::string& p) { return p.substr(p.rfind('.') + 1); }

TEST(Awq, FoldingLeavesTheFloatLlamaUnchangedAndPutsEachScaleWhereItIsExact) {
  for (int64_t kv_heads : {4, 2}) {  // 2: grouped-query attention, v_proj narrower than o_proj's input
    models::LlamaForCausalLM m = outlier_llama(kv_heads);
    quantize(*m, w4_g32());
    const std::vector<at::Tensor> ids = token_batches(3, 128, 8);
    const RunBatch run = [&](int64_t b) { return m->forward(ids[static_cast<size_t>(b)]); };
    at::Tensor y0;
    {
      FloatView fv(*m);
      y0 = m->forward(ids[1]).detach().clone();
    }
    AwqOptions o;
    o.clip = false;  // clipping changes the float weights by design; the scales alone must not
    const AwqReport rep = awq(*m, 3, run, o);
    {
      FloatView fv(*m);
      EXPECT_LT(relative_change(m->forward(ids[1]), y0), 1e-5) << "kv_heads " << kv_heads;
    }
    EXPECT_TRUE(rep.skipped.empty());
    ASSERT_EQ(rep.groups.size(), 2u * 4 + 1);  // q/k/v, o, gate/up, down per layer; the head
    const std::map<std::string, std::string> home = {
        {"q_proj", "input_layernorm"}, {"k_proj", "input_layernorm"}, {"v_proj", "input_layernorm"},
        {"gate_proj", "post_attention_layernorm"}, {"up_proj", "post_attention_layernorm"},
        {"o_proj", kv_heads == 4 ? "v_proj" : "pre_quant_scale"}, {"down_proj", "up_proj"},
        {"lm_head", "norm"}};
    for (const AwqGroup& g : rep.groups) {
      const std::string first = leaf(g.layers[0]);
      const std::string& expect_home = home.at(first);
      if (expect_home == "input_layernorm" || expect_home == "post_attention_layernorm") {
        EXPECT_TRUE(g.scaled()) << g.layers[0];  // the planted outliers
      }
      EXPECT_LE(g.error_scaled, g.error_rtn) << g.layers[0];
      if (!g.scaled()) continue;
      EXPECT_EQ(expect_home == "pre_quant_scale" ? g.scale_home : leaf(g.scale_home), expect_home) << g.layers[0];
    }
  }
}

// The block objective: a group's error is the block's output with the group rounded (the rest of the
// block float) against the float block, on the hidden states entering it; written out here for
// block 0's q/k/v (searched first, on the model as it was) and block 1's (after block 0's scales,
// which leave its float function alone). The head, outside any block, keeps the layer objective.
TEST(Awq, BlockObjectiveMeasuresTheBlockOutputWithItsGroupRounded) {
  models::LlamaForCausalLM m = outlier_llama(2);
  quantize(*m, w4_g32());
  const std::vector<at::Tensor> ids = token_batches(3, 128, 8);
  const RunBatch run = [&](int64_t b) { return m->forward(ids[static_cast<size_t>(b)]); };
  double ref[2];
  {
    at::NoGradGuard g;
    const FloatView fv(*m);
    at::Tensor h = m->model->embed_tokens->forward(ids[0]);  // sample_rows 64: batch 0's 2 x 32 tokens
    for (int b = 0; b < 2; ++b) {
      auto* layer = m->model->layers->ptr(b)->as<models::LlamaDecoderLayerImpl>();
      auto block = [&](const at::Tensor& x) { return layer->forward(x, m->model->rope(0, x.size(1), x.device())); };
      const at::Tensor yf = block(h).to(at::kDouble);
      std::vector<std::unique_ptr<ScopedTensorSwap>> swaps;
      for (nn::LinearImpl* l : {layer->self_attn->q_proj.get(), layer->self_attn->k_proj.get(), layer->self_attn->v_proj.get()})
        swaps.push_back(std::make_unique<ScopedTensorSwap>(l->weight, rtn(l->weight.detach(), l->scheme().weights->spec)));
      ref[b] = (block(h).to(at::kDouble) - yf).pow(2).sum().item<double>() / yf.pow(2).sum().item<double>();
      swaps.clear();
      h = block(h);
    }
  }
  AwqOptions o;
  o.clip = false;
  o.sample_rows = 64;
  const AwqReport rep = awq(*m, 3, run, o);
  ASSERT_EQ(rep.groups.size(), 2u * 4 + 1);
  for (int b = 0; b < 2; ++b) {
    const AwqGroup& g = rep.groups[static_cast<size_t>(4 * b)];
    ASSERT_EQ(leaf(g.layers[0]), "q_proj");
    EXPECT_EQ(g.objective, "block model.layers." + std::to_string(b));
    EXPECT_NEAR(g.error_rtn, ref[b], 1e-4 * ref[b]) << g.layers[0];
  }
  for (const AwqGroup& g : rep.groups) {
    EXPECT_LE(g.error_scaled, g.error_rtn) << g.layers[0];
    if (leaf(g.layers[0]) == "lm_head") {
      EXPECT_EQ(g.objective, "layer");
    }
  }
}

// A Linear whose weight grid is already fixed is no home for a scale (after the division its
// weight would leave that grid): down_proj keeps its own pre_quant_scale there instead.
TEST(Awq, AFixedGridIsNoFoldingHome) {
  models::LlamaForCausalLM m = outlier_llama(4);
  quantize(*m, w4_g32());
  auto* up = m->model->layers->ptr(0)->as<models::LlamaDecoderLayerImpl>()->mlp->up_proj.get();
  up->weight_quantizer()->set_qparams(
      weight_minmax_qparams(up->weight.detach(), up->weight_quantizer()->config().spec, "up_proj"));
  const std::vector<at::Tensor> ids = token_batches(3, 128, 8);
  const RunBatch run = [&](int64_t b) { return m->forward(ids[static_cast<size_t>(b)]); };
  AwqOptions o;
  o.clip = false;
  const AwqReport rep = awq(*m, 3, run, o);
  int checked = 0;
  for (const AwqGroup& g : rep.groups) {
    if (leaf(g.layers[0]) != "down_proj" || !g.scaled()) continue;
    const bool fixed = g.layers[0] == "model.layers.0.mlp.down_proj";
    EXPECT_EQ(g.scale_home, fixed ? "pre_quant_scale" : "model.layers.1.mlp.up_proj") << g.layers[0];
    checked += fixed;
  }
  EXPECT_EQ(checked, 1) << "block 0's down_proj was not scaled: the check above is vacuous";
}

// A run that fails part way leaves the model in the mode it was in.
TEST(Awq, AFailedRunKeepsTheTrainingMode) {
  models::LlamaForCausalLM m = outlier_llama(2);
  quantize(*m, w4_g32());
  m->train();
  const std::vector<at::Tensor> ids = token_batches(2, 128, 14);
  int calls = 0;
  const RunBatch run = [&](int64_t b) {
    if (++calls > 1) throw Error("batch source failed");
    return m->forward(ids[static_cast<size_t>(b)]);
  };
  EXPECT_THROW(awq(*m, 2, run, AwqOptions{}), Error);
  EXPECT_TRUE(m->is_training());
  for (const auto& sub : m->modules()) EXPECT_TRUE(sub->is_training());
}

TEST(Awq, FoldingIntoGpt2LayerNormsLeavesTheFloatModelUnchanged) {
  models::Gpt2Config c;
  c.vocab_size = 128, c.n_positions = 64, c.n_embd = 64, c.n_layer = 2, c.n_head = 4;
  at::manual_seed(9);
  models::Gpt2LMHeadModel m(c);
  m->init_weights();
  m->eval();
  {
    at::NoGradGuard g;
    for (const auto& item : m->named_parameters()) {
      at::Tensor p = item.value();
      if (item.key().find("ln_") != std::string::npos && leaf(item.key()) == "weight") p.index_put_({5}, 30.0);
    }
  }
  quantize(*m, w4_g32());
  const std::vector<at::Tensor> ids = token_batches(2, 128, 10);
  const RunBatch run = [&](int64_t b) { return m->forward(ids[static_cast<size_t>(b)]); };
  at::Tensor y0;
  {
    FloatView fv(*m);
    y0 = m->forward(ids[0]).detach().clone();
  }
  AwqOptions o;
  o.clip = false;
  const AwqReport rep = awq(*m, 2, run, o);
  FloatView fv(*m);
  EXPECT_LT(relative_change(m->forward(ids[0]), y0), 1e-5);
  int folded = 0;
  for (const AwqGroup& g : rep.groups)
    if (leaf(g.layers[0]) == "c_attn" || leaf(g.layers[0]) == "c_fc") {
      EXPECT_TRUE(g.scaled()) << g.layers[0];
      folded += leaf(g.scale_home) == "ln_1" || leaf(g.scale_home) == "ln_2";
    }
  EXPECT_EQ(folded, 4);
}

// The float toy Llama's logits on ids.
at::Tensor float_logits(const at::Tensor& ids) {
  models::LlamaForCausalLM m = outlier_llama(2);
  at::NoGradGuard g;
  return m->forward(ids).detach().clone();
}

double logits_error(models::LlamaForCausalLM& m, const at::Tensor& ids, const at::Tensor& y_float) {
  at::NoGradGuard g;
  return relative_change(m->forward(ids), y_float);
}

TEST(Awq, LlamaEndToEndBeatsRoundToNearestAloneAndBeforeGptq) {
  const std::vector<at::Tensor> ids = token_batches(4, 128, 12);
  const at::Tensor held_out = token_batches(1, 128, 13)[0];
  const at::Tensor y_float = float_logits(held_out);
  auto run_method = [&](bool use_awq, bool use_gptq) {
    models::LlamaForCausalLM m = outlier_llama(2);
    quantize(*m, w4_g32());
    const RunBatch run = [&](int64_t b) { return m->forward(ids[static_cast<size_t>(b)]); };
    if (use_awq) awq(*m, 4, run, AwqOptions{});
    if (use_gptq) {
      SolveOptions so;
      so.rounding = Rounding::kGptq;
      solve(*m, 4, run, so);
    }
    return logits_error(m, held_out, y_float);
  };
  const double e_rtn = run_method(false, false), e_awq = run_method(true, false);
  const double e_gptq = run_method(false, true), e_both = run_method(true, true);
  EXPECT_LT(e_awq, 0.9 * e_rtn) << "rtn " << e_rtn << " awq " << e_awq;
  EXPECT_LT(e_both, e_rtn) << "rtn " << e_rtn << " awq+gptq " << e_both;
  EXPECT_LT(e_both, e_gptq * 1.1) << "gptq " << e_gptq << " awq+gptq " << e_both;
  std::printf("logits relative error: rtn %.4f awq %.4f gptq %.4f awq+gptq %.4f\n", e_rtn, e_awq, e_gptq, e_both);
}

// The imatrix grid search after AWQ leaves the layers AWQ clipped (no second clamp on top of the
// first): AWQ + imatrix is never worse than AWQ alone with round-to-nearest after it, and within
// GPTQ's column-order noise with GPTQ after it.
TEST(Awq, ImatrixAfterAwqSkipsTheLayersAwqClippedAndIsNeverWorseThanAwqAlone) {
  const std::vector<at::Tensor> ids = token_batches(4, 128, 12);
  const at::Tensor held_out = token_batches(1, 128, 13)[0];
  const at::Tensor y_float = float_logits(held_out);
  for (QType q : {qint4, qint3}) {
    for (bool gptq : {false, true}) {
      auto run_method = [&](bool use_imatrix) {
        models::LlamaForCausalLM m = outlier_llama(2);
        Scheme s = w4_g32();
        s.weights = q;
        quantize(*m, s);
        const RunBatch run = [&](int64_t b) { return m->forward(ids[static_cast<size_t>(b)]); };
        const std::vector<std::string> clipped = awq_clipped_layers(awq(*m, 4, run, AwqOptions{}));
        EXPECT_EQ(clipped.size(), 2u * 5 + 1);  // v, o, gate, up, down per block; the head
        Imatrix im;
        if (use_imatrix) {
          at::NoGradGuard g;
          const FloatView fv(*m);
          ImatrixCollector collector(*m);
          for (int64_t b = 0; b < 4; ++b) run(b);
          im = collector.take();
          const ImatrixRoundReport ir = imatrix_round(*m, im, clipped);
          EXPECT_EQ(ir.layers.size(), 2u * 2);  // q and k of each block only
          for (const ImatrixRoundLayer& l : ir.layers) EXPECT_TRUE(leaf(l.path) == "q_proj" || leaf(l.path) == "k_proj") << l.path;
        }
        if (gptq) {
          SolveOptions so;
          so.rounding = Rounding::kGptq;
          if (use_imatrix) so.imatrix = &im;
          solve(*m, 4, run, so);
        }
        return logits_error(m, held_out, y_float);
      };
      const double e_awq = run_method(false), e_both = run_method(true);
      std::printf("%s g32%s: logits relative error awq %.5f awq+imatrix %.5f\n", q.name, gptq ? " +gptq" : "", e_awq, e_both);
      // GPTQ's imatrix column order is a heuristic, not a bound: measured -1.1 % at W4 and +1.9 % at
      // W3 after AWQ's default block objective and duo scales (+0.3 % / -0.2 % after the layer
      // objective and activation scales): 2.5 % slack. With round-to-nearest after, never worse.
      EXPECT_LE(e_both, e_awq * (gptq ? 1.025 : 1 + 1e-6)) << q.name << (gptq ? " gptq" : " rtn");
    }
  }
}

TEST(Awq, NonFiniteActivationsAreAnErrorAndLeaveTheModelAsItWas) {
  models::LlamaForCausalLM m = outlier_llama(2);
  quantize(*m, w4_g32());
  const std::vector<at::Tensor> ids = token_batches(2, 128, 14);
  std::map<std::string, at::Tensor> before;
  for (const auto& p : m->named_parameters()) before[p.key()] = p.value().detach().clone();
  // Non-finite activations (a NaN reaches every layer after the embedding): an error, nothing changed.
  {
    at::NoGradGuard g;
    m->model->embed_tokens->weight[ids[0][0][0].item<int64_t>()][0] = NAN;
  }
  const RunBatch run = [&](int64_t b) { return m->forward(ids[static_cast<size_t>(b)]); };
  EXPECT_THROW(awq(*m, 2, run, AwqOptions{}), Error);
  for (const auto& p : m->named_parameters())
    if (p.key() != "model.embed_tokens.weight") {
      EXPECT_TRUE(at::equal(p.value(), before.at(p.key()))) << p.key();
    }
}

}  // namespace
}  // namespace qforge::ptq
