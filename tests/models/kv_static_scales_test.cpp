// Static KV-cache scales (kv_static_scales.h, docs/kv_cache.md "Static scales"): the observer's
// ranges against a scalar reference, appends with fixed scales against the ATen path (saturating
// beyond the range), a Calibration over Llama and GPT-2 whose decode then equals the fake-quant
// forward, and the calibrated scales through JSON, config.json, checkpoints and the recipe.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "framework/api/kv_static_scales.h"
#include "framework/api/quantize.h"
#include "framework/core/error.h"
#include "framework/io/model_io.h"
#include "framework/models/gpt2.h"
#include "framework/models/kv_cache.h"
#include "framework/models/kv_quant.h"
#include "framework/models/llama.h"
#include "framework/recipe/recipe.h"
#include "tests/error_of.h"
#include "tests/models/kv_cache_test_models.h"

namespace qforge::models {
namespace {

using qforge::testing::error_of;

KvCacheScheme static_scheme(const QType& q, bool symmetric, KvScales scales, int64_t group_size = 0) {
  KvCacheScheme s;
  s.qtype = q;
  s.symmetric = symmetric;
  s.scales = scales;
  s.group_size = group_size;
  return s;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("qforge_kvs_" + std::to_string(::getpid()) + "_" + name)).string();
}

// The documented formula one (head, group) at a time: lo / hi over every observed token's finite
// values (starting at 0), then calculate_qparams' float arithmetic.
std::pair<float, int> reference_scale(const std::vector<at::Tensor>& xs, int64_t head, int64_t g0, int64_t g,
                                      const QType& q, bool symmetric, bool whole_layer) {
  float lo = 0, hi = 0;
  const float half_max = std::numeric_limits<float>::max() / 2;
  for (const at::Tensor& x : xs) {
    const at::Tensor c = x.contiguous();
    const int64_t B = c.size(0), H = c.size(1), T = c.size(2), D = c.size(3);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < D; ++d) {
            if (!whole_layer && (h != head || d < g0 || d >= g0 + g)) continue;
            const float v = c.data_ptr<float>()[((b * H + h) * T + t) * D + d];
            if (!std::isfinite(v)) continue;
            const float w = symmetric ? v : std::clamp(v, -half_max, half_max);
            lo = std::min(lo, w), hi = std::max(hi, w);
          }
  }
  const int qmin = static_cast<int>(q.quant_min), qmax = static_cast<int>(q.quant_max);
  const float eps = std::numeric_limits<float>::epsilon();
  if (symmetric) return {std::max(std::max(-lo, hi) / (static_cast<float>(qmax - qmin) / 2), eps), 0};
  const float s = std::max((hi - lo) / static_cast<float>(qmax - qmin), eps);
  return {s, std::clamp(qmin - static_cast<int>(std::nearbyint(lo / s)), qmin, qmax)};
}

TEST(KvStaticScales, ObservedRangesGiveTheDocumentedScalesPerHeadGroupOrLayer) {
  at::manual_seed(21);
  for (const KvCacheScheme& s : {static_scheme(qint8, true, KvScales::kStaticHead),
                                 static_scheme(qint4, false, KvScales::kStaticHead, 8),
                                 static_scheme(qint8, false, KvScales::kStaticTensor),
                                 static_scheme(qint4, true, KvScales::kStaticTensor, 4)}) {
    const int64_t H = 3, D = 16, g = s.group(D);
    KvRangeObserver obs(s, 2, H, D);
    std::vector<at::Tensor> keys, values;
    for (int i = 0; i < 3; ++i) {
      at::Tensor k = at::randn({2, H, 5, D}) * (i + 1), v = at::randn({1, H, 4, D}) * 0.3 + 0.5;
      k[0][1][2][3] = std::numeric_limits<float>::quiet_NaN();
      k[1][2][0][0] = std::numeric_limits<float>::infinity();
      obs.observe(1, false, k), obs.observe(1, true, v);
      keys.push_back(k), values.push_back(v);
    }
    EXPECT_NE(error_of([&] { obs.compute("test"); }).find("layer(s) 0 saw no token"), std::string::npos)
        << s.to_string();
    obs.observe(0, false, keys[0]), obs.observe(0, true, values[0]);
    const auto scales = obs.compute("test");
    ASSERT_EQ(scales->layers.size(), 2u);
    for (int side = 0; side < 2; ++side) {
      const KvSideScales& got = scales->side(1, side == 1, "test");
      ASSERT_EQ(got.scale.sizes(), (at::IntArrayRef{H, D / g}));
      for (int64_t h = 0; h < H; ++h)
        for (int64_t gi = 0; gi < D / g; ++gi) {
          const auto [scale, zero] = reference_scale(side ? values : keys, h, gi * g, g, *s.qtype, s.symmetric,
                                                     s.scales == KvScales::kStaticTensor);
          EXPECT_EQ(got.scale[h][gi].item<float>(), scale) << s.to_string() << " side " << side << " head " << h;
          EXPECT_EQ(got.zero_point[h][gi].item<int>(), zero) << s.to_string();
        }
    }
    EXPECT_NO_THROW(scales->check(2, H, D / g, s, "test"));
    EXPECT_NE(error_of([&] { scales->check(3, H, D / g, s, "test"); }).find("cover 2 layers; the model has 3"),
              std::string::npos);
  }
}

TEST(KvStaticScales, OnePositionCalibratedEqualsTheDynamicCodesAndLaterValuesSaturate) {
  at::manual_seed(22);
  for (const KvCacheScheme& s : {static_scheme(qint8, true, KvScales::kStaticHead),
                                 static_scheme(qint4, false, KvScales::kStaticHead, 8)}) {
    const at::Tensor x = at::randn({1, 2, 1, 16});
    KvRangeObserver obs(s, 1, 2, 16);
    obs.observe(0, false, x), obs.observe(0, true, x);
    const auto scales = obs.compute("test");
    const KvSideScales& side = scales->side(0, false, "test");
    KvCacheScheme dynamic = s;
    dynamic.scales = KvScales::kDynamic;
    const KvCodes a = quantize_kv(x, s, &side), b = quantize_kv(x, dynamic);
    EXPECT_TRUE(at::equal(a.codes, b.codes)) << s.to_string();
    EXPECT_TRUE(at::equal(a.scale, b.scale)) << s.to_string();
    // Appending through the one-pass kernel (float CPU) writes what the ATen path computes; values
    // beyond the calibrated range saturate, NaN stores the zero point.
    at::Tensor later = at::randn({1, 2, 7, 16}) * 3;
    later[0][0][1][2] = std::numeric_limits<float>::quiet_NaN();
    later[0][1][3][5] = -std::numeric_limits<float>::infinity();
    KvQuantStore store;
    store.push(x, s, 4, &side);
    store.push(later, s, 4, &side);
    const KvCodes stored = store.codes();
    const KvCodes aten = quantize_kv(at::cat({x, later}, 2), s, &side);  // the ATen path
    EXPECT_TRUE(at::equal(stored.codes, aten.codes)) << s.to_string();
    EXPECT_TRUE(at::equal(stored.scale, aten.scale)) << s.to_string();
    if (!s.symmetric) {
      EXPECT_TRUE(at::equal(stored.zero_point, aten.zero_point)) << s.to_string();
    }
    const at::Tensor q = s.qtype->bits == 4 ? unpack_int4_pairs(stored.codes) : stored.codes;
    EXPECT_EQ(q.max().item<int>(), s.qtype->quant_max) << "3x the calibrated range saturates";
    EXPECT_EQ(q.min().item<int>(), s.qtype->quant_min);
    EXPECT_TRUE(at::equal(store.values(s), fake_quantize_kv(at::cat({x, later}, 2), s, &side))) << s.to_string();
  }
}

template <class Model>
void calibrate_then_decode(Model& m, const KvCacheScheme& s, int64_t vocab) {
  m->eval();
  at::NoGradGuard ng;
  const at::Tensor ids = at::randint(0, vocab, {2, 12}, at::kLong);
  m->set_kv_cache_scheme(s);
  EXPECT_NE(error_of([&] { m->forward(ids); }).find("run a Calibration"), std::string::npos) << s.to_string();
  const at::Tensor float_logits = [&] {
    KvCacheScheme f;
    m->set_kv_cache_scheme(f);
    const at::Tensor l = m->forward(ids);
    m->set_kv_cache_scheme(s);
    return l;
  }();
  {
    Calibration calibration(*m);
    EXPECT_NE(m->kv_cache_scheme().to_string().find("(calibrating)"), std::string::npos);
    EXPECT_TRUE(at::equal(m->forward(ids), float_logits)) << "a Calibration's forwards attend to float keys and values";
    KvCache cache;
    EXPECT_NE(error_of([&] { m->forward(ids, &cache); }).find("being calibrated"), std::string::npos);
    calibration.finish();
  }
  const KvCacheScheme calibrated = m->kv_cache_scheme();
  ASSERT_NE(calibrated.calibrated, nullptr);
  EXPECT_EQ(calibrated.observer, nullptr);
  EXPECT_NE(calibrated.to_string().find("(calibrated)"), std::string::npos) << calibrated.to_string();
  expect_decode_equals_fake_quant(m, calibrated, vocab);
  // The scales are the model's data now: another forward does not move them.
  m->forward(at::randint(0, vocab, {1, 5}, at::kLong));
  EXPECT_EQ(m->kv_cache_scheme(), calibrated);
  // A Calibration that sees no token keeps the scales it had and says which cache saw none.
  EXPECT_NE(error_of([&] { Calibration(*m).finish(); }).find("KV cache"), std::string::npos);
  EXPECT_EQ(m->kv_cache_scheme(), calibrated);
  // Transforms that change the cached keys or values refuse calibrated scales.
  EXPECT_NE(error_of([&] { require_no_calibrated_kv_scales(*m, "ptq"); }).find("apply it first, then calibrate"),
            std::string::npos);
  // A guard whose scheme was replaced inside it (here by a nested guard that finished first)
  // leaves the replacement alone.
  {
    Calibration outer(*m);
    {
      Calibration inner(*m);
      m->forward(ids);
    }
    const KvCacheScheme by_inner = m->kv_cache_scheme();
    ASSERT_NE(by_inner.calibrated, nullptr);
    outer.finish();
    EXPECT_EQ(m->kv_cache_scheme(), by_inner);
  }
}

TEST(KvStaticScales, LlamaCalibratedOnceDecodesAsItsFakeQuantForward) {
  for (const KvCacheScheme& s : {static_scheme(qint8, true, KvScales::kStaticHead),
                                 static_scheme(qint4, false, KvScales::kStaticHead, 8),
                                 static_scheme(qint8, false, KvScales::kStaticTensor)}) {
    at::manual_seed(23);
    LlamaForCausalLM m(kv_test_llama());
    calibrate_then_decode(m, s, 61);
  }
}

TEST(KvStaticScales, Gpt2CalibratedOnceDecodesAsItsFakeQuantForward) {
  for (const KvCacheScheme& s : {static_scheme(qint8, false, KvScales::kStaticHead),
                                 static_scheme(qint4, true, KvScales::kStaticTensor)}) {
    at::manual_seed(24);
    Gpt2LMHeadModel m(kv_test_gpt2());
    calibrate_then_decode(m, s, 53);
  }
}

KvCacheScheme calibrated_llama_scheme(LlamaForCausalLM& m, const KvCacheScheme& s) {
  m->eval();
  m->set_kv_cache_scheme(s);
  Calibration c(*m);
  m->forward(at::randint(0, 61, {2, 10}, at::kLong));
  c.finish();
  return m->kv_cache_scheme();
}

TEST(KvStaticScales, CalibratedScalesTravelExactlyThroughJsonConfigAndCheckpoints) {
  at::manual_seed(25);
  LlamaForCausalLM saved(kv_test_llama());
  const KvCacheScheme s = calibrated_llama_scheme(saved, static_scheme(qint4, false, KvScales::kStaticHead, 8));
  const nlohmann::json j = kv_cache_scheme_json(s);
  EXPECT_EQ(j["scales"], "static_head");
  EXPECT_EQ(j["static_scales"]["kv_heads"], 2);
  EXPECT_EQ(j["static_scales"]["groups"], 2);
  EXPECT_EQ(j["static_scales"]["layers"].size(), 2u);
  // Through text and back: every float32 scale to the bit.
  EXPECT_EQ(kv_cache_scheme_from_json(nlohmann::json::parse(j.dump()), "test"), s);
  EXPECT_EQ(LlamaConfig::from_json(nlohmann::json::parse(saved->config.to_json().dump())).kv_cache, s);
  nlohmann::json bad = j;
  bad["static_scales"]["layers"][1]["value_scale"].erase(0);
  EXPECT_NE(error_of([&] { kv_cache_scheme_from_json(bad, "test"); }).find("must be an array of 4 numbers"),
            std::string::npos);
  bad = j;
  bad["static_scales"]["layers"][0]["key_scale"][1] = -1.0;
  LlamaConfig c = kv_test_llama();
  nlohmann::json cj = c.to_json();
  cj["qforge_kv_cache"] = bad;
  EXPECT_NE(error_of([&] { LlamaConfig::from_json(cj); }).find("must be finite and at least"), std::string::npos);
  bad["static_scales"]["layers"][0]["key_scale"][1] = 1e-30;  // below float32 eps: 1 / s would overflow
  cj["qforge_kv_cache"] = bad;
  EXPECT_NE(error_of([&] { LlamaConfig::from_json(cj); }).find("must be finite and at least"), std::string::npos);
  // Calibrated scales on a dynamic scheme are refused where the scheme is set, not when a file is read back.
  KvCacheScheme dynamic = s;
  dynamic.scales = KvScales::kDynamic;
  EXPECT_NE(error_of([&] { saved->set_kv_cache_scheme(dynamic); }).find("belong to a static scheme"),
            std::string::npos);
  bad = j;
  bad["scales"] = "dynamic";
  EXPECT_NE(error_of([&] { kv_cache_scheme_from_json(bad, "test"); }).find("belong to a static scheme"),
            std::string::npos);
  bad = j;
  bad["scales"] = "static";
  EXPECT_NE(error_of([&] { kv_cache_scheme_from_json(bad, "test"); }).find("supported: dynamic, static_head"),
            std::string::npos);

  const std::string path = temp_path("static.h5");
  io::save_model(saved, path);
  LlamaForCausalLM loaded(kv_test_llama());
  io::load_model(loaded, path);
  EXPECT_EQ(loaded->kv_cache_scheme(), s);
  at::NoGradGuard ng;
  loaded->eval();
  const at::Tensor ids = at::randint(0, 61, {1, 9}, at::kLong);
  EXPECT_TRUE(at::equal(loaded->forward(ids), saved->forward(ids))) << "the loaded scales attend alike";
  // The same tensors as 4 key/value heads of 8: the file's scales cover 2 heads of 2 groups of 8;
  // the load is refused and changes nothing.
  LlamaConfig other = kv_test_llama();
  other.num_attention_heads = 8, other.num_key_value_heads = 4;
  LlamaForCausalLM wrong(other);
  const at::Tensor before = wrong->model->embed_tokens->weight.clone();
  const std::string e = error_of([&] { io::load_model(wrong, path); });
  EXPECT_NE(e.find("layer 0 key scales must be [4, 1] (kv_heads x groups), got [2, 2]"), std::string::npos) << e;
  EXPECT_FALSE(wrong->kv_cache_scheme().quantized());
  EXPECT_TRUE(at::equal(wrong->model->embed_tokens->weight, before));
  std::filesystem::remove(path);
}

TEST(KvStaticScales, DescribeAndTheRecipeNameTheStaticScales) {
  at::manual_seed(26);
  LlamaForCausalLM m(kv_test_llama());
  calibrated_llama_scheme(m, static_scheme(qint8, true, KvScales::kStaticTensor));
  EXPECT_NE(describe(*m).find("KvCacheQuant: qint8 symmetric static per tensor (calibrated), 160 bytes per cached "
                              "token"),
            std::string::npos)
      << describe(*m);

  const std::string path = temp_path("kv.yaml");
  auto issues = [&](const std::string& text) { return kv_recipe_issues(path, text); };
  const std::string llama = kKvRecipeLlama;
  EXPECT_EQ(issues(llama + "  kv_cache: {qtype: int8, scales: static_tensor}\n"), "");
  EXPECT_EQ(load_recipe(path).kv_cache.scales, KvScales::kStaticTensor);
  EXPECT_NE(load_recipe(path).resolved_yaml.find("scales: static_tensor"), std::string::npos);
  std::string e = issues(llama + "  kv_cache: {qtype: int8, scales: static}\n");
  EXPECT_NE(e.find("kv.yaml:6:35: quantize.kv_cache.scales: 'static' is not valid"), std::string::npos) << e;
  e = issues(llama + "  kv_cache: {scales: static_head}\n");
  EXPECT_NE(e.find("quantize.kv_cache.scales: has no effect without quantize.kv_cache.qtype"), std::string::npos) << e;
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace qforge::models
