// The small Llama (grouped-query: 4 query / 2 key-value heads of 16) and GPT-2 the KV-cache tests
// decode with (kv_cache_quant_test.cpp, kv_cache_codes_attention_test.cpp, kv_static_scales_test.cpp),
// and the check that decoding with a quantized cache equals the model's fake-quantized forward.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "framework/models/gpt2.h"
#include "framework/models/kv_cache.h"
#include "framework/models/kv_quant.h"
#include "framework/models/llama.h"
#include "framework/recipe/recipe.h"

namespace qforge::models {

inline LlamaConfig kv_test_llama() {
  LlamaConfig c;
  c.vocab_size = 61, c.hidden_size = 64, c.intermediate_size = 96, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 64;
  return c;
}

// The start of a Llama recipe whose quantize section a test extends (its line 6 comes next).
inline constexpr const char* kKvRecipeLlama =
    "model: {arch: llama}\ndata: {dataset: fortunes}\nfreeze: {enabled: false}\nquantize:\n  weights: {qtype: none}\n";

// Writes `text` to `path` and loads it as a recipe: its issues, one per line ("" when it loads).
inline std::string kv_recipe_issues(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  std::string out;
  try {
    load_recipe(path);
  } catch (const RecipeError& e) {
    for (const RecipeIssue& i : e.issues()) out += i.to_string() + "\n";
  }
  return out;
}

inline Gpt2Config kv_test_gpt2() {
  Gpt2Config c;
  c.vocab_size = 53, c.n_positions = 32, c.n_embd = 32, c.n_layer = 2, c.n_head = 4;
  return c;
}

// Prefill of the whole sequence equals the fake-quantized full forward bit for bit (the same keys
// and values, quantized alike). Token-by-token decoding cannot be bitwise: its one-token
// projections round differently from the full forward's, so a value on a rounding boundary of its
// grid lands one code away. The symmetric grid puts one on every group whose largest magnitude is
// negative: it maps to -(qmax - qmin) / 2 = -7.5 (int4) or -127.5 (int8), a tie. So the first
// layer's codes (inputs equal up to rounding) are checked against the whole-sequence prefill's: at
// most one step apart, in at most one code per group, scales within float rounding. Later layers
// see those steps in their inputs, and which ties flip depends on the CPU's GEMM rounding (int4 in
// groups of 8: a tie on every other group, one step = 1/7.5 of its largest magnitude), so the
// logits are bounded by the quantization's own effect: decoding stays closer to the fake-quant
// forward than that forward is to the float one (a decode that misplaced or dropped cached
// positions moves them by a good part of their range).
template <class Model>
void expect_decode_equals_fake_quant(Model& m, const KvCacheScheme& s, int64_t vocab) {
  m->set_kv_cache_scheme(s);
  m->eval();
  at::NoGradGuard ng;
  const at::Tensor ids = at::randint(0, vocab, {1, 16}, at::kLong);
  const at::Tensor full = m->forward(ids);
  KvCache whole;
  EXPECT_TRUE(at::equal(m->forward(ids, &whole), full)) << s.to_string();
  EXPECT_EQ(whole.scheme(), s);
  KvCache cache;
  std::vector<at::Tensor> steps = {m->forward(ids.narrow(1, 0, 5), &cache)};
  for (int64_t t = 5; t < 16; ++t) steps.push_back(m->forward(ids.narrow(1, t, 1), &cache));
  for (bool values : {false, true}) {
    const KvCodes a = whole.codes(0, values), b = cache.codes(0, values);
    auto ints = [&](const KvCodes& c) { return (s.qtype->bits == 4 ? unpack_int4_pairs(c.codes) : c.codes).to(at::kInt); };
    const at::Tensor step = (ints(a) - ints(b)).abs();
    EXPECT_LE(step.max().item<int>(), 1) << s.to_string();
    const int64_t g = s.group(step.size(-1));
    const at::Tensor per_group = step.gt(0).view({step.size(0), step.size(1), step.size(2), -1, g}).sum(-1);
    EXPECT_LE(per_group.max().item<int64_t>(), 1) << s.to_string() << ": at most one code per group";
    if (!s.symmetric) {
      EXPECT_LE((a.zero_point.to(at::kInt) - b.zero_point.to(at::kInt)).abs().max().item<int>(), 1) << s.to_string();
    }
    EXPECT_LT(((a.scale - b.scale).abs() / a.scale).max().item<double>(), 1e-5) << s.to_string();
  }
  const double diff = (at::cat(steps, 1) - full).abs().max().item<double>();
  m->set_kv_cache_scheme(KvCacheScheme{});
  const double quantization = (m->forward(ids) - full).abs().max().template item<double>();
  m->set_kv_cache_scheme(s);
  EXPECT_LT(diff, quantization) << s.to_string() << ": decoding moved the logits further than quantizing the cache did";
  EXPECT_EQ(cache.bytes(), 16 * m->kv_cache_bytes_per_token(s)) << s.to_string();
}

}  // namespace qforge::models
