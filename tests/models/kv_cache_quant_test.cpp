// Quantized KV caches (docs/kv_cache.md): codes and scales against a scalar reference written from
// the documented formulas, the int4 packing against kernels::pack_s4_reference, stores that grow,
// truncate and copy with their codes, the non-finite rule, the real bytes, and decoding of GPT-2
// and Llama with a quantized cache against the same models' fake-quantized full forward.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "framework/api/quantize.h"
#include "framework/core/error.h"
#include "framework/io/model_io.h"
#include "framework/models/generation.h"
#include "framework/models/gpt2.h"
#include "framework/models/kv_cache.h"
#include "framework/models/kv_quant.h"
#include "framework/models/llama.h"
#include "framework/recipe/recipe.h"
#include "kernels/cpu/reference.h"
#include "tests/error_of.h"
#include "tests/models/kv_cache_test_models.h"

namespace qforge::models {
namespace {

using qforge::testing::error_of;

KvCacheScheme scheme(const QType& q, bool symmetric, int64_t group_size = 0) {
  KvCacheScheme s;
  s.qtype = q;
  s.symmetric = symmetric;
  s.group_size = group_size;
  return s;
}

KvCacheScheme clipped(KvCacheScheme s, float ratio) {
  s.clip_ratio = ratio;
  return s;
}

const std::vector<KvCacheScheme>& all_schemes() {
  static const std::vector<KvCacheScheme> k = {scheme(qint8, true),          scheme(qint8, false),
                                               scheme(qint4, true),          scheme(qint4, false),
                                               scheme(qint8, false, 8),      scheme(qint4, true, 4),
                                               clipped(scheme(qint4, false), 0.95f), clipped(scheme(qint8, true, 8), 0.9f)};
  return k;
}

// The documented formulas, one group at a time in float (kv_quant.h): scale, zero point, codes.
struct RefGroup {
  float scale;
  int zero;
  std::vector<int> codes;
};

RefGroup reference_group(const float* x, int64_t n, const QType& q, bool symmetric, float clip = 1.0f) {
  float mn = 0, mx = 0;  // the range always holds 0
  const float half_max = std::numeric_limits<float>::max() / 2;  // asymmetric: max - min stays finite
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(x[i])) {
      const float v = symmetric ? x[i] : std::clamp(x[i], -half_max, half_max);
      mn = std::min(mn, v), mx = std::max(mx, v);
    }
  mn *= clip, mx *= clip;  // clip_ratio: the range shrinks, values beyond it saturate
  const int qmin = static_cast<int>(q.quant_min), qmax = static_cast<int>(q.quant_max);
  const float eps = std::numeric_limits<float>::epsilon();
  RefGroup g;
  if (symmetric) {
    g.scale = std::max(std::max(-mn, mx) / (static_cast<float>(qmax - qmin) / 2), eps);
    g.zero = 0;
  } else {
    g.scale = std::max((mx - mn) / static_cast<float>(qmax - qmin), eps);
    g.zero = std::clamp(qmin - static_cast<int>(std::nearbyint(mn / g.scale)), qmin, qmax);
  }
  const float inv = 1.0f / g.scale;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) {
      g.codes.push_back(g.zero);
      continue;
    }
    const float v = std::nearbyint(x[i] * inv) + static_cast<float>(g.zero);
    g.codes.push_back(v >= qmax ? qmax : v <= qmin ? qmin : static_cast<int>(v));
  }
  return g;
}

std::string name_of(const KvCacheScheme& s) { return s.to_string(); }

TEST(KvCacheQuant, CodesAndScalesMatchAScalarReference) {
  at::manual_seed(3);
  at::Tensor x = at::randn({2, 3, 5, 16});
  x.select(3, 5).mul_(40);  // an outlier channel, as keys have
  x[0][1][2].fill_(0);      // an all-zero group: the smallest scale
  x[1][0][4].abs_();        // all positive: the asymmetric zero point at qmin
  x[1][2][1].copy_(at::linspace(-3e38, 3e38, 16));  // finite, but max - min overflows float32
  for (const KvCacheScheme& s : all_schemes()) {
    const KvCodes c = quantize_kv(x, s);
    const at::Tensor q = s.qtype->bits == 4 ? unpack_int4_pairs(c.codes) : c.codes;
    ASSERT_EQ(q.sizes(), x.sizes()) << name_of(s);
    const int64_t g = s.group(16), groups = 16 / g;
    ASSERT_EQ(c.scale.sizes(), at::IntArrayRef({2, 3, 5, groups})) << name_of(s);
    EXPECT_EQ(c.zero_point.defined(), !s.symmetric);
    const at::Tensor xc = x.contiguous(), qc = q.contiguous(), sc = c.scale.contiguous();
    const at::Tensor zc = s.symmetric ? at::zeros_like(sc, at::kChar) : c.zero_point.contiguous();
    for (int64_t r = 0; r < 2 * 3 * 5; ++r)
      for (int64_t j = 0; j < groups; ++j) {
        const RefGroup ref =
            reference_group(xc.data_ptr<float>() + r * 16 + j * g, g, *s.qtype, s.symmetric, s.clip_ratio);
        ASSERT_EQ(sc.data_ptr<float>()[r * groups + j], ref.scale) << name_of(s) << " row " << r << " group " << j;
        ASSERT_EQ(zc.data_ptr<int8_t>()[r * groups + j], ref.zero) << name_of(s) << " row " << r;
        for (int64_t i = 0; i < g; ++i)
          ASSERT_EQ(qc.data_ptr<int8_t>()[r * 16 + j * g + i], ref.codes[i]) << name_of(s) << " row " << r << " i " << i;
      }
    // (q - z) * s, and the fake-quant kernels' values, bit for bit.
    const at::Tensor deq = dequantize_kv(c, s, at::kFloat);
    const at::Tensor expect = (q.to(at::kFloat).view({2, 3, 5, groups, g}) -
                               zc.to(at::kFloat).unsqueeze(-1)) * sc.unsqueeze(-1);
    EXPECT_TRUE(at::equal(deq, expect.view({2, 3, 5, 16}))) << name_of(s);
    EXPECT_TRUE(at::equal(fake_quantize_kv(x, s), deq)) << name_of(s);
    EXPECT_TRUE(at::isfinite(deq).all().item<bool>()) << name_of(s) << ": finite input, finite values";
  }
}

TEST(KvCacheQuant, Int4PairsMatchTheKernelPackingAndRoundTrip) {
  at::manual_seed(4);
  const at::Tensor codes = at::randint(-8, 8, {3, 2, 7, 10}, at::kLong).to(at::kChar);
  const at::Tensor packed = pack_int4_pairs(codes);
  ASSERT_EQ(packed.sizes(), at::IntArrayRef({3, 2, 7, 5}));
  ASSERT_EQ(packed.scalar_type(), at::kByte);
  std::vector<uint8_t> ref(static_cast<size_t>(codes.numel() / 2));
  kernels::pack_s4_reference(codes.contiguous().data_ptr<int8_t>(), codes.numel(), ref.data());
  EXPECT_TRUE(std::equal(ref.begin(), ref.end(), packed.contiguous().data_ptr<uint8_t>()));
  EXPECT_TRUE(at::equal(unpack_int4_pairs(packed), codes));
  EXPECT_THROW(pack_int4_pairs(at::zeros({2, 3}, at::kChar)), Error) << "odd last dimension";
}

TEST(KvCacheQuant, StoresGrowWithTheirCodesAndReportTheirRealBytes) {
  at::manual_seed(5);
  for (const KvCacheScheme& s : all_schemes()) {
    KvCache cache;
    cache.set_scheme(s);
    cache.reserve(4);
    std::vector<at::Tensor> ks, vs;
    for (int64_t T : {3, 1, 1, 4, 40}) {
      ks.push_back(at::randn({2, 3, T, 16})), vs.push_back(at::randn({2, 3, T, 16}) * 3);
      const auto [k, v] = cache.append(1, ks.back(), vs.back());
      // Per-token codes: the chunks quantize as the concatenation does.
      ASSERT_TRUE(at::equal(k, fake_quantize_kv(at::cat(ks, 2), s))) << name_of(s);
      ASSERT_TRUE(at::equal(v, fake_quantize_kv(at::cat(vs, 2), s))) << name_of(s);
    }
    EXPECT_EQ(cache.capacity(1), 49) << "4, 8, 16, then what 49 positions need";
    EXPECT_EQ(cache.length(), 0) << "layer 0 was never appended to";
    EXPECT_FALSE(cache.keys[1].defined()) << "a quantized cache keeps no float keys";
    const int64_t per_position = 2 * 3 * s.bytes_per_head(16, 4);
    EXPECT_EQ(cache.bytes(), 2 * 49 * per_position) << name_of(s);
    EXPECT_EQ(cache.capacity_bytes(), 2 * 49 * per_position);
    const int64_t groups = 16 / s.group(16);
    EXPECT_EQ(s.bytes_per_head(16, 4), 16 * s.qtype->bits / 8 + 4 * groups + (s.symmetric ? 0 : groups));
  }
  // The stores' own sizes, independent of bytes_per_head: int4 asymmetric, whole head.
  KvCache c;
  c.set_scheme(scheme(qint4, false));
  c.reserve(10);
  c.append(0, at::randn({1, 2, 3, 16}), at::randn({1, 2, 3, 16}));
  EXPECT_EQ(c.capacity_bytes(), 2 * (1 * 2 * 10 * 8 + 1 * 2 * 10 * 4 + 1 * 2 * 10 * 1));
  EXPECT_EQ(c.bytes(), 2 * (1 * 2 * 3 * 8 + 1 * 2 * 3 * 4 + 1 * 2 * 3 * 1));
}

TEST(KvCacheQuant, TruncateAndDeepCopiesKeepCodesAndScales) {
  at::manual_seed(6);
  KvCache prefilled;
  prefilled.set_scheme(scheme(qint4, false));
  prefilled.reserve(8);
  const at::Tensor k = at::randn({1, 2, 5, 8}), v = at::randn({1, 2, 5, 8});
  prefilled.append(0, k, v);
  KvCache a = prefilled, b = prefilled;
  EXPECT_EQ(a.scheme(), prefilled.scheme());
  EXPECT_EQ(a.capacity(0), 8);
  const at::Tensor xa = at::full({1, 2, 1, 8}, 2.0), xb = at::full({1, 2, 1, 8}, -3.0);
  const at::Tensor xp = at::full({1, 2, 1, 8}, 0.5);
  a.append(0, xa, xa), b.append(0, xb, xb);
  prefilled.append(0, xp, xp);  // position 5 of the original's store, after both copies wrote theirs
  // Each re-read after all three wrote position 5: shared stores would show the last write.
  auto keys_of = [](const KvCache& c) { return dequantize_kv(c.codes(0, false), c.scheme(), at::kFloat); };
  EXPECT_TRUE(at::equal(keys_of(a), fake_quantize_kv(at::cat({k, xa}, 2), a.scheme())));
  EXPECT_TRUE(at::equal(keys_of(b), fake_quantize_kv(at::cat({k, xb}, 2), b.scheme())));
  EXPECT_TRUE(at::equal(keys_of(prefilled), fake_quantize_kv(at::cat({k, xp}, 2), a.scheme())));
  for (const KvCache* c : {&a, &b})
    for (bool values : {false, true}) {
      const KvCodes mine = c->codes(0, values), original = prefilled.codes(0, values);
      EXPECT_NE(mine.codes.data_ptr(), original.codes.data_ptr());
      EXPECT_NE(mine.scale.data_ptr(), original.scale.data_ptr());
      EXPECT_NE(mine.zero_point.data_ptr(), original.zero_point.data_ptr());
    }
  EXPECT_EQ(prefilled.bytes(), a.bytes());
  prefilled.truncate(5);
  // Back to three positions, then one more written in place of the fourth.
  a.truncate(3);
  EXPECT_EQ(a.length(), 3);
  EXPECT_EQ(a.capacity_bytes(), prefilled.capacity_bytes()) << "truncation keeps the stores";
  const auto [k4, v4] = a.append(0, xb, xa);
  EXPECT_TRUE(at::equal(k4, fake_quantize_kv(at::cat({k.narrow(2, 0, 3), xb}, 2), a.scheme())));
  EXPECT_TRUE(at::equal(v4, fake_quantize_kv(at::cat({v.narrow(2, 0, 3), xa}, 2), a.scheme())));
  EXPECT_THROW(a.truncate(5), Error);
  // A layer shorter than the first: a refused truncate changes no layer.
  KvCache two = prefilled;
  two.append(1, k.narrow(2, 0, 3), v.narrow(2, 0, 3));
  EXPECT_THROW(two.truncate(4), Error);
  EXPECT_EQ(two.length(), 5) << "layer 0 kept its positions";
  EXPECT_EQ(two.codes(1, true).codes.size(2), 3);
  // keys is public: a copy of a quantized cache whose keys were resized still copies every layer.
  two.keys.clear();
  const KvCache copied = two;
  ASSERT_TRUE(copied.codes(1, false).codes.defined());
  EXPECT_TRUE(at::equal(copied.codes(1, false).codes, two.codes(1, false).codes));
  // The stores are switched only while empty.
  EXPECT_THROW(a.set_scheme(KvCacheScheme{}), Error);
  a.truncate(0);
  a.set_scheme(KvCacheScheme{});
  a.append(0, xa, xa);
  EXPECT_TRUE(at::equal(a.keys[0], xa)) << "a float cache again";
}

TEST(KvCacheQuant, NonFiniteValuesSaturateOrStoreZeroAndLeaveTheScaleToFiniteOnes) {
  at::Tensor x = at::tensor({1.0f, -2.0f, 0.5f, 4.0f, 0.25f, -1.0f, 3.0f, 2.0f}).view({1, 1, 1, 8});
  x[0][0][0][1] = std::numeric_limits<float>::quiet_NaN();
  x[0][0][0][3] = std::numeric_limits<float>::infinity();
  x[0][0][0][5] = -std::numeric_limits<float>::infinity();
  for (const KvCacheScheme& s : {scheme(qint8, true), scheme(qint4, false)}) {
    const KvCodes c = quantize_kv(x, s);
    const at::Tensor q = s.qtype->bits == 4 ? unpack_int4_pairs(c.codes) : c.codes;
    const float smax = std::max({1.0f, 0.5f, 0.25f, 3.0f, 2.0f});
    const float expect_scale = s.symmetric ? smax / 127.5f : (3.0f - 0.0f) / 15.0f;
    EXPECT_EQ(c.scale.item<float>(), expect_scale) << name_of(s) << ": from the finite values only";
    const int zero = s.symmetric ? 0 : c.zero_point.item<int>();
    EXPECT_EQ(q[0][0][0][1].item<int>(), zero) << "NaN: the zero point";
    EXPECT_EQ(q[0][0][0][3].item<int>(), s.qtype->quant_max) << "+inf saturates";
    EXPECT_EQ(q[0][0][0][5].item<int>(), s.qtype->quant_min) << "-inf saturates";
    const at::Tensor deq = dequantize_kv(c, s, at::kFloat);
    EXPECT_TRUE(at::isfinite(deq).all().item<bool>());
    EXPECT_EQ(deq[0][0][0][1].item<float>(), 0.0f);
    EXPECT_TRUE(at::equal(fake_quantize_kv(x, s), deq));
  }
}

TEST(KvCacheQuant, SchemesAreCheckedAndQuantizedCachesRefuseGradients) {
  EXPECT_THROW(scheme(qint8, true, 3).validate(16, "test"), Error) << "3 does not divide 16";
  EXPECT_THROW(scheme(qint4, true, 1).validate(16, "test"), Error) << "odd int4 group";
  EXPECT_THROW(scheme(quint8, true).validate(16, "test"), Error);
  EXPECT_THROW(kv_cache_qtype_from_name("int2"), Error);
  nlohmann::json bad_qtype = {{"qtype", "int2"}};
  const std::string e = error_of([&] { kv_cache_scheme_from_json(bad_qtype, "model.h5"); });
  EXPECT_NE(e.find("model.h5: KV-cache qtype 'int2'"), std::string::npos) << e;
  EXPECT_EQ(kv_cache_qtype_from_name("int4"), qint4);
  KvCache cache;
  cache.set_scheme(scheme(qint8, true));
  const at::Tensor k = at::randn({1, 1, 1, 4}).requires_grad_();
  EXPECT_THROW(cache.append(0, k, k), Error);
  EXPECT_THROW(cache.append(0, at::randn({1, 1, 1, 4}), at::randn({1, 1, 2, 4})), Error) << "keys != values";
  {
    at::NoGradGuard g;
    cache.append(0, k, k);
  }
  EXPECT_THROW(cache.append(0, at::randn({1, 2, 1, 4}), at::randn({1, 2, 1, 4})), Error) << "other kv_heads";
  EXPECT_THROW(cache.append(0, at::randn({1, 1, 1, 4}, at::kDouble), at::randn({1, 1, 1, 4}, at::kDouble)), Error);
}

TEST(KvCacheQuant, LlamaDecodeWithAQuantizedCacheEqualsItsFakeQuantForward) {
  for (const KvCacheScheme& s : {scheme(qint8, true), scheme(qint4, false), scheme(qint4, true, 8)}) {
    at::manual_seed(7);
    LlamaForCausalLM m(kv_test_llama());
    expect_decode_equals_fake_quant(m, s, 61);
  }
}

TEST(KvCacheQuant, Gpt2DecodeWithAQuantizedCacheEqualsItsFakeQuantForward) {
  for (const KvCacheScheme& s : {scheme(qint8, false), scheme(qint4, true)}) {
    at::manual_seed(8);
    Gpt2LMHeadModel m(kv_test_gpt2());
    expect_decode_equals_fake_quant(m, s, 53);
  }
}

TEST(KvCacheQuant, TheSchemeTravelsInConfigJsonAndThroughGenerate) {
  LlamaConfig c = kv_test_llama();
  EXPECT_FALSE(c.to_json().contains("qforge_kv_cache")) << "float: the key is not written";
  c.kv_cache = scheme(qint4, false, 8);
  const nlohmann::json j = c.to_json();
  EXPECT_EQ(j["qforge_kv_cache"], nlohmann::json({{"qtype", "qint4"}, {"symmetric", false}, {"group_size", 8}}));
  EXPECT_EQ(LlamaConfig::from_json(j).kv_cache, c.kv_cache);
  nlohmann::json bad = j;
  bad["qforge_kv_cache"]["bits"] = 4;
  EXPECT_THROW(LlamaConfig::from_json(bad), Error) << "unknown key";
  bad = j;
  bad["qforge_kv_cache"]["group_size"] = 5;
  EXPECT_THROW(LlamaConfig::from_json(bad), Error) << "5 does not divide head_dim 16";
  Gpt2Config g;
  g.kv_cache = scheme(qint8, true);
  EXPECT_EQ(Gpt2Config::from_json(g.to_json()).kv_cache, g.kv_cache);
  g.kv_cache.clip_ratio = 0.95f;  // written only when it clips, read back to the same float
  EXPECT_EQ(g.to_json()["qforge_kv_cache"]["clip_ratio"].get<double>(), static_cast<double>(0.95f));
  EXPECT_EQ(Gpt2Config::from_json(nlohmann::json::parse(g.to_json().dump())).kv_cache, g.kv_cache);
  nlohmann::json over = g.to_json();
  over["qforge_kv_cache"]["clip_ratio"] = 1.5;
  EXPECT_NE(error_of([&] { Gpt2Config::from_json(over); }).find("clip_ratio must be in (0, 1]"), std::string::npos);

  at::manual_seed(9);
  LlamaForCausalLM m(kv_test_llama());
  m->eval();
  const CachedLmForward forward = [&](const at::Tensor& ids, KvCache* cache) { return m->forward(ids, cache); };
  const at::Tensor prompt = at::randint(0, 61, {1, 6}, at::kLong);
  const GenerationResult f = greedy_generate(forward, prompt, 10);
  m->set_kv_cache_scheme(scheme(qint8, true));
  const GenerationResult q = greedy_generate(forward, prompt, 10);
  EXPECT_EQ(f.cache_bytes, 15 * 2 * 2 * 2 * 16 * 4) << "15 cached positions, 2 layers, K and V, 2 heads, float32";
  EXPECT_EQ(q.cache_bytes, 15 * 2 * 2 * 2 * (16 + 4)) << "int8 codes and a float32 scale per head";
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("qforge_kvq_" + std::to_string(::getpid()) + "_" + name)).string();
}

TEST(KvCacheQuant, CheckpointsCarryTheSchemeAndOlderFilesKeepTheFloatCache) {
  at::manual_seed(10);
  LlamaForCausalLM saved(kv_test_llama());
  const std::string with = temp_path("with.h5"), without = temp_path("without.h5");
  io::save_model(saved, without);  // float cache: no kv_cache attribute, as files before it
  saved->set_kv_cache_scheme(scheme(qint4, false, 16));
  io::save_model(saved, with);
  LlamaForCausalLM loaded(kv_test_llama());
  io::load_model(loaded, without);
  EXPECT_FALSE(loaded->kv_cache_scheme().quantized());
  io::load_model(loaded, with);
  EXPECT_EQ(loaded->kv_cache_scheme(), saved->kv_cache_scheme());
  EXPECT_EQ(loaded->model->layers[1]->as<LlamaDecoderLayerImpl>()->self_attn->config.kv_cache, saved->kv_cache_scheme())
      << "every attention layer";
  // Same tensors, heads of 8: the saved groups of 16 do not divide them; the load changes nothing.
  LlamaConfig other = kv_test_llama();
  other.num_attention_heads = 8, other.num_key_value_heads = 4;
  LlamaForCausalLM wrong(other);
  const at::Tensor before = wrong->model->embed_tokens->weight.clone();
  EXPECT_THROW(io::load_model(wrong, with), Error);
  EXPECT_FALSE(wrong->kv_cache_scheme().quantized());
  EXPECT_TRUE(at::equal(wrong->model->embed_tokens->weight, before));
  io::LoadModelOptions dequantize;
  dequantize.dequantize = true;
  LlamaForCausalLM as_float(kv_test_llama());
  as_float->set_kv_cache_scheme(scheme(qint8, true));
  io::load_model(as_float, with, dequantize);
  EXPECT_FALSE(as_float->kv_cache_scheme().quantized()) << "a dequantizing load sets the cache float";
  // A file without the attribute (a float cache) sets a quantized model's cache float.
  io::load_model(loaded, without);
  EXPECT_FALSE(loaded->kv_cache_scheme().quantized()) << "the file's float cache wins over the model's";
  std::filesystem::remove(with), std::filesystem::remove(without);
}

TEST(KvCacheQuant, DescribeNamesTheQuantizedCache) {
  at::manual_seed(11);
  LlamaForCausalLM m(kv_test_llama());
  EXPECT_EQ(describe(*m).find("KvCacheQuant"), std::string::npos);
  m->set_kv_cache_scheme(scheme(qint8, true));
  // 2 layers x K and V x 2 heads x (16 codes + a 4-byte scale); float32: x 16 x 4.
  EXPECT_NE(describe(*m).find("KvCacheQuant: qint8 symmetric per token and head, 160 bytes per cached token "
                              "(float32: 512)"),
            std::string::npos)
      << describe(*m);
}

TEST(KvCacheQuant, RecipeKeyIsCheckedWithFileLineAndClosestKey) {
  const std::string path = temp_path("kv.yaml");
  auto issues = [&](const std::string& text) { return kv_recipe_issues(path, text); };
  const std::string llama = kKvRecipeLlama;
  EXPECT_EQ(issues(llama + "  kv_cache: {qtype: int4, symmetric: false, group_size: 8}\n"), "");
  const Recipe r = load_recipe(path);
  EXPECT_EQ(r.kv_cache, scheme(qint4, false, 8));
  EXPECT_NE(r.resolved_yaml.find("kv_cache"), std::string::npos);
  std::string e = issues(llama + "  kv_cache: {qtype: int3}\n");
  EXPECT_NE(e.find("kv.yaml:6:21: quantize.kv_cache.qtype: 'int3' is not valid"), std::string::npos) << e;
  e = issues(llama + "  kv_cache: {qtype: int8, symetric: false}\n");
  EXPECT_NE(e.find("kv.yaml:6:27: quantize.kv_cache.symetric: unknown key (did you mean 'symmetric'?)"),
            std::string::npos)
      << e;
  e = issues(llama + "  kv_cache: {symmetric: false}\n");
  EXPECT_NE(e.find("kv.yaml:6:25: quantize.kv_cache.symmetric: has no effect without quantize.kv_cache.qtype"),
            std::string::npos)
      << e;
  e = issues(llama + "  kv_cache: {qtype: int8}\nexport: {onnx: true}\n");
  EXPECT_NE(e.find("quantize.kv_cache.qtype: export.onnx writes a quantized KV cache only as int8 with static scales"),
            std::string::npos)
      << e;
  e = issues(llama + "  kv_cache: {qtype: int8, scales: static_head}\nexport: {onnx: true}\n");
  EXPECT_EQ(e.find("kv_cache"), std::string::npos) << e;
  e = issues(llama + "  kv_cache: {qtype: int4, scales: static_head}\nexport: {onnx: true}\n");
  EXPECT_NE(e.find("has no QDQ form"), std::string::npos) << e;
  e = issues("model: {arch: mlp}\ndata: {dataset: fashion_mnist}\nquantize:\n  kv_cache: {qtype: int8}\n");
  EXPECT_NE(e.find("quantize.kv_cache.qtype: a KV cache belongs to the causal LMs"), std::string::npos) << e;
  // No kv_cache key: float, and the resolved recipe does not name it.
  EXPECT_EQ(issues(llama), "");
  EXPECT_EQ(load_recipe(path).resolved_yaml.find("kv_cache"), std::string::npos);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace qforge::models
