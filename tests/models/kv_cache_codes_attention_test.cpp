// Attention on a quantized KV cache's codes (kernels::attention_kv_codes_f32, docs/kv_cache.md
// "Attention on the codes"): every table entry equals the float attention's reference on the
// dequantized cache bit for bit (int8 and int4, symmetric and asymmetric, groups, grouped-query
// rows, windows, head sizes off the 16-lane vectors, store strides); the models' decode on the
// codes equals their decode through the dequantized cache bit for bit (and dequantizes nothing);
// the conditions under which it declines leave the cache untouched; the kernel refuses what it
// cannot read; a float append writes quantize_kv's codes in one pass.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/models/activation.h"
#include "framework/models/gpt2.h"
#include "framework/models/kv_cache.h"
#include "framework/models/kv_quant.h"
#include "framework/models/llama.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/token_ops.h"
#include "tests/models/kv_cache_test_models.h"

namespace qforge::models {
namespace {

KvCacheScheme scheme(const QType& q, bool symmetric, int64_t group_size = 0) {
  KvCacheScheme s;
  s.qtype = q, s.symmetric = symmetric, s.group_size = group_size;
  return s;
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), a.numel() * sizeof(float)) == 0;
}

struct Case {
  int64_t B, KV, rep, T, S, D, window;
};
// Decode (T = 1) and short prompts, one key, D off the 16-lane vectors (6, 20, 40), D = 128 as
// Llama-3's heads, a window narrower than the cache, a cache past 64 positions (a grown store).
const Case kCases[] = {{1, 2, 4, 1, 37, 32, 0},  {2, 3, 1, 3, 20, 20, 0}, {1, 1, 2, 1, 1, 6, 0},
                       {1, 2, 3, 5, 70, 40, 9},  {1, 8, 4, 1, 130, 128, 0}, {2, 2, 2, 16, 48, 64, 17}};

std::string name_of(const KvCacheScheme& s, const Case& c) {
  return s.to_string() + " B " + std::to_string(c.B) + " KV " + std::to_string(c.KV) + " rep " + std::to_string(c.rep) +
         " T " + std::to_string(c.T) + " S " + std::to_string(c.S) + " D " + std::to_string(c.D);
}

// The codes kernel `run` on a cache holding S random positions (a few channels 20x the rest, as
// keys have), and the float attention's reference on the same cache dequantized.
struct Outputs {
  at::Tensor codes, dequantized;
};
Outputs run_both(const KvCacheScheme& s, const Case& c, void (*run)(const kernels::KvCodesAttentionProblem&)) {
  at::Tensor k = at::randn({c.B, c.KV, c.S, c.D}), v = at::randn({c.B, c.KV, c.S, c.D});
  k.select(3, 0).mul_(20), v.select(3, c.D - 1).mul_(-7);
  const at::Tensor q = at::randn({c.B, c.KV, c.rep * c.T, c.D});
  KvCache cache;
  cache.set_scheme(s);
  // Two appends: a cache past 64 positions has grown its stores once (capacity above length).
  const int64_t first = std::max<int64_t>(1, c.S - 1);
  cache.append_codes(0, k.narrow(2, 0, first), v.narrow(2, 0, first));
  if (first < c.S) cache.append_codes(0, k.narrow(2, first, c.S - first), v.narrow(2, first, c.S - first));
  if (c.S > KvCache::kMinCapacity) {
    EXPECT_GT(cache.capacity(0), c.S);
  }
  const KvCodes kc = cache.codes(0, false), vc = cache.codes(0, true);
  kernels::KvCodesAttentionProblem p;
  at::Tensor out = at::empty({c.B, c.KV, c.rep * c.T, c.D}), w = at::empty({c.B, c.KV, c.rep * c.T, c.S});
  p.q = q.data_ptr<float>(), p.scores = w.data_ptr<float>(), p.out = out.data_ptr<float>();
  for (auto [side, codes] : {std::pair{&p.k, &kc}, std::pair{&p.v, &vc}}) {
    side->codes = codes->codes.data_ptr(), side->scale = codes->scale.data_ptr<float>();
    side->zero_point = codes->zero_point.defined() ? static_cast<const int8_t*>(codes->zero_point.data_ptr()) : nullptr;
    side->batch_stride = codes->codes.stride(0), side->head_stride = codes->codes.stride(1);
    side->row_stride = codes->codes.stride(2), side->scale_batch_stride = codes->scale.stride(0);
    side->scale_head_stride = codes->scale.stride(1), side->scale_row_stride = codes->scale.stride(2);
  }
  p.bits = s.qtype->bits, p.group = s.group(c.D);
  p.groups = c.B * c.KV, p.heads = c.KV, p.rows = c.rep * c.T, p.T = c.T, p.S = c.S, p.D = c.D;
  p.past = c.S - c.T, p.window = c.window, p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.D)));
  run(p);
  // The float reference on the dequantized cache (contiguous copies: the float op's own layout).
  const at::Tensor kd = dequantize_kv(kc, s, at::kFloat).contiguous(), vd = dequantize_kv(vc, s, at::kFloat).contiguous();
  kernels::AttentionProblem f;
  at::Tensor ref = at::empty_like(out), wf = at::empty_like(w);
  f.q = p.q, f.k = kd.data_ptr<float>(), f.v = vd.data_ptr<float>(), f.scores = wf.data_ptr<float>();
  f.out = ref.data_ptr<float>();
  f.groups = p.groups, f.heads = p.heads, f.rows = p.rows, f.T = p.T, f.S = p.S, f.D = p.D, f.past = p.past;
  f.window = p.window, f.scale = p.scale;
  f.k_batch_stride = f.v_batch_stride = kd.stride(0), f.k_head_stride = f.v_head_stride = kd.stride(1);
  f.k_row_stride = f.v_row_stride = kd.stride(2);
  kernels::attention_reference(f);
  return {out, ref};
}

TEST(KvCacheCodesAttention, EveryEntryEqualsTheFloatReferenceOnTheDequantizedCacheBitForBit) {
  const std::vector<KvCacheScheme> schemes = {scheme(qint8, true),     scheme(qint8, false),   scheme(qint4, true),
                                              scheme(qint4, false),    scheme(qint4, false, 2), scheme(qint8, true, 4),
                                              scheme(qint4, true, 32), scheme(qint4, false, 4), scheme(qint4, true, 6)};
  int runs = 0;
  for (const auto& e : kernels::attention_kv_codes_kernels()) {
    std::string why;
    if (!e.run || !kernels::isa_usable(e.isa, &why)) continue;
    for (const KvCacheScheme& s : schemes)
      for (const Case& c : kCases) {
        if (c.D % s.group(c.D) != 0) continue;
        at::manual_seed(c.S + c.D);
        const Outputs o = run_both(s, c, e.run);
        EXPECT_FALSE(o.codes.isnan().any().item<bool>());
        EXPECT_TRUE(same_bits(o.codes, o.dequantized)) << e.name << " " << name_of(s, c) << ": max |diff| "
                                                       << (o.codes - o.dequantized).abs().max().item<double>();
        ++runs;
      }
  }
  EXPECT_GT(runs, 30);  // the reference entry runs everywhere
}

// A float CPU append writes its codes in one pass (kernels::quantize_kv_rows): the codes, scales
// and zero points quantize_kv's ATen ops give, bit for bit, NaN, ±inf and ±3e38 included, into a
// store that already holds positions (and grows); other dtypes keep the ATen path.
TEST(KvCacheCodesAttention, TheOnePassAppendEqualsQuantizeKvBitForBit) {
  at::manual_seed(14);
  auto clipped = [](KvCacheScheme s, float ratio) {
    s.clip_ratio = ratio;
    return s;
  };
  for (const KvCacheScheme& s : {scheme(qint8, true), scheme(qint8, false), scheme(qint4, true), scheme(qint4, false),
                                 scheme(qint4, false, 2), scheme(qint8, true, 4), clipped(scheme(qint4, false), 0.95f),
                                 clipped(scheme(qint4, true, 4), 0.9f)}) {
    at::Tensor first = at::randn({2, 3, 5, 8}), x = at::randn({2, 3, 70, 8}) * 3;
    x.select(3, 1).mul_(40);
    x[0][0][0][0] = NAN, x[0][1][2][3] = INFINITY, x[1][2][3][4] = -INFINITY;
    x[1][0][4][0] = 3e38f, x[1][0][4][1] = -3e38f;
    KvQuantStore store;
    store.push(first, s, 8);
    store.push(x, s, 8);  // grows from 8 to 75 positions
    const KvCodes got = store.codes();
    for (const auto& [part, want] : {std::pair{first, quantize_kv(first, s)}, std::pair{x, quantize_kv(x, s)}}) {
      const int64_t at = part.size(2) == 5 ? 0 : 5;
      EXPECT_TRUE(at::equal(got.codes.narrow(2, at, part.size(2)), want.codes)) << s.to_string();
      EXPECT_TRUE(at::equal(got.scale.narrow(2, at, part.size(2)), want.scale)) << s.to_string();
      if (!s.symmetric) {
        EXPECT_TRUE(at::equal(got.zero_point.narrow(2, at, part.size(2)), want.zero_point)) << s.to_string();
      }
    }
    EXPECT_FALSE(dequantize_kv(got, s, at::kFloat).isnan().any().item<bool>()) << s.to_string();
    KvQuantStore doubles;  // not float: the ATen path, the same codes
    doubles.push(x.to(at::kDouble), s, 8);
    EXPECT_TRUE(at::equal(doubles.codes().codes, quantize_kv(x, s).codes)) << s.to_string();
  }
}

TEST(KvCacheCodesAttention, TheKernelRefusesWhatItCannotRead) {
  float buf[64] = {};
  int8_t codes[64] = {};
  kernels::KvCodesAttentionProblem p;
  p.q = p.scores = p.out = buf;
  for (kernels::KvCodesOperand* o : {&p.k, &p.v}) o->codes = codes, o->scale = buf, o->row_stride = 8, o->scale_row_stride = 1;
  p.groups = 1, p.rows = 1, p.T = 1, p.S = 2, p.D = 8, p.past = 1, p.group = 8;
  EXPECT_NO_THROW(kernels::attention_kv_codes_f32(p));
  for (auto bad : std::vector<void (*)(kernels::KvCodesAttentionProblem&)>{
           [](kernels::KvCodesAttentionProblem& b) { b.bits = 3; },
           [](kernels::KvCodesAttentionProblem& b) { b.group = 3; },
           [](kernels::KvCodesAttentionProblem& b) { b.D = 7, b.bits = 4, b.group = 7; },
           [](kernels::KvCodesAttentionProblem& b) { b.D = kernels::kKvCodesMaxHeadDim + 8, b.group = b.D; },
           [](kernels::KvCodesAttentionProblem& b) { b.v.scale = nullptr; },
           [](kernels::KvCodesAttentionProblem& b) { b.past = 2; }}) {
    kernels::KvCodesAttentionProblem b = p;
    bad(b);
    EXPECT_THROW(kernels::attention_kv_codes_f32(b), Error);
  }
}

// A prompt of 5, then one token at a time, with attend_on_codes on and off: the logits of every
// step and the cached codes equal bit for bit (the projections are the same calls; the attention
// on the codes is the float attention on the dequantized cache).
template <class Model>
void expect_codes_decode_equals_dequantized_decode(Model& m, const KvCacheScheme& s, int64_t vocab) {
  m->set_kv_cache_scheme(s);
  m->eval();
  at::NoGradGuard ng;
  const at::Tensor ids = at::randint(0, vocab, {2, 24}, at::kLong);
  KvCache on, off;
  off.attend_on_codes = false;
  for (KvCache* cache : {&on, &off}) cache->reserve(8);  // decoding crosses two store growths
  for (int64_t t = 0; t < 24; t += t == 0 ? 5 : 1) {
    const int64_t n = t == 0 ? 5 : 1;
    const at::Tensor a = m->forward(ids.narrow(1, t, n), &on), b = m->forward(ids.narrow(1, t, n), &off);
    ASSERT_TRUE(same_bits(a, b)) << s.to_string() << " step " << t;
  }
  for (bool values : {false, true})
    EXPECT_TRUE(at::equal(on.codes(1, values).codes, off.codes(1, values).codes)) << s.to_string();
  // The codes path ran on every call; the other dequantized each layer's keys and values on every
  // step: 2 layers x (K + V) x the cached positions after each step (5, then 6 .. 24).
  EXPECT_EQ(on.dequantized_positions(), 0) << s.to_string();
  EXPECT_EQ(off.dequantized_positions(), 2 * 2 * (5 + 24) * 20 / 2) << s.to_string();
  const KvCache copy = off;
  EXPECT_EQ(copy.dequantized_positions(), off.dequantized_positions());
  off.clear();
  EXPECT_EQ(off.dequantized_positions(), 0);
}

TEST(KvCacheCodesAttention, LlamaAndGpt2DecodeOnTheCodesEqualsDecodeThroughTheDequantizedCache) {
  for (const KvCacheScheme& s : {scheme(qint8, true), scheme(qint4, false), scheme(qint4, true, 8)}) {
    at::manual_seed(11);
    LlamaForCausalLM m(kv_test_llama());
    expect_codes_decode_equals_dequantized_decode(m, s, 61);
  }
  for (const KvCacheScheme& s : {scheme(qint8, false), scheme(qint4, true)}) {
    at::manual_seed(12);
    Gpt2LMHeadModel m(kv_test_gpt2());
    expect_codes_decode_equals_dequantized_decode(m, s, 53);
  }
}

// Where the kernel does not take the call, the model function returns undefined and appends
// nothing (the caller appends and attends as before); where it does, the cache grows by T.
TEST(KvCacheCodesAttention, DeclinesWithoutTouchingTheCacheOutsideItsConditions) {
  at::manual_seed(13);
  const at::Tensor q = at::randn({1, 2, 4, 16}), k = at::randn({1, 2, 1, 16}), v = at::randn({1, 2, 1, 16});
  KvCache float_cache;
  EXPECT_FALSE(fused_decode_attention_on_codes(q, float_cache, 0, k, v, 1, 0, 0.25).defined());
  EXPECT_EQ(float_cache.length(), 0);
  KvCache cache;
  cache.set_scheme(scheme(qint8, true));
  cache.attend_on_codes = false;
  EXPECT_FALSE(fused_decode_attention_on_codes(q, cache, 0, k, v, 1, 0, 0.25).defined());
  cache.attend_on_codes = true;
  const at::Tensor long_q = at::randn({1, 2, 17, 16}), long_k = at::randn({1, 2, 17, 16});
  EXPECT_FALSE(fused_decode_attention_on_codes(long_q, cache, 0, long_k, long_k, 17, 0, 0.25).defined());
  EXPECT_FALSE(fused_decode_attention_on_codes(q.to(at::kDouble), cache, 0, k.to(at::kDouble), v.to(at::kDouble), 1, 0,
                                               0.25)
                   .defined());
  EXPECT_EQ(cache.length(), 0);
  const at::Tensor ctx = fused_decode_attention_on_codes(q, cache, 0, k, v, 1, 0, 0.25);
  ASSERT_TRUE(ctx.defined());
  EXPECT_EQ(ctx.sizes(), q.sizes());
  EXPECT_EQ(cache.length(), 1);
  // One cached position: every query's context is that position's dequantized value.
  const at::Tensor vd = dequantize_kv(cache.codes(0, true), cache.scheme(), at::kFloat);
  EXPECT_TRUE(at::allclose(ctx, vd.expand({1, 2, 4, 16}), 0, 0));
  EXPECT_THROW(float_cache.append_codes(0, k, v), Error);
}

}  // namespace
}  // namespace qforge::models
