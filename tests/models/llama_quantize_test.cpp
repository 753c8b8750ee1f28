// A tiny Llama through quantize() and freeze(): W8, W8A8 (dynamic per-token, Q·K^T in int8 too)
// and W4 g32 weights land on the integer kernels, and KV-cache decoding of the frozen model equals
// its full forward; the same with block-32 int8 decode activations.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "framework/api/quantize.h"
#include "framework/core/isa.h"
#include "framework/models/llama.h"
#include "framework/nn/linear.h"

namespace qforge::models {
namespace {

struct QuantCase {
  const char* name;
  Scheme scheme;
  const char* kernel_part;  // every frozen Linear's kernel names this operand pair
};

Scheme w4_g32() {
  Scheme s(qint4);
  s.weight_granularity = Granularity::kPerGroup;
  s.group_size = 32;
  return s;
}

// P·V stays float: its second operand's dynamic scales run over the value positions, so a
// position's output would depend on later tokens and cached decoding could not equal the full
// forward (recipes/llama_w8a8.yaml does the same).
Scheme w8a8_dynamic() {
  Scheme s(qint8);
  s.activations = ActivationMode::kDynamicPerToken;
  LayerRule keep;
  keep.pattern = "*.av_matmul";
  keep.keep_float = true;
  s.rules.push_back(keep);
  return s;
}

class LlamaQuantized : public ::testing::TestWithParam<QuantCase> {};

TEST_P(LlamaQuantized, FreezesOnIntegerKernelsAndCachedDecodingEqualsTheFrozenForward) {
  LlamaConfig c;
  c.vocab_size = 64, c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.tie_word_embeddings = true;
  at::manual_seed(21);
  LlamaForCausalLM m(c);
  m->untie_lm_head();  // so the head quantizes apart from the embedding
  m->eval();
  at::NoGradGuard ng;
  const at::Tensor ids = at::randint(0, c.vocab_size, {2, 10}, at::kLong);
  const at::Tensor float_logits = m->forward(ids);
  quantize(m, GetParam().scheme);
  freeze(m);
  int linears = 0;
  for (const LayerReport& r : layer_reports(m)) {
    if (r.type != "Linear") continue;
    ++linears;
    EXPECT_NE(r.kernel.find(GetParam().kernel_part), std::string::npos) << r.name << ": " << r.kernel;
    EXPECT_TRUE(r.fallback_reason.empty()) << r.name << ": " << r.fallback_reason;
  }
  EXPECT_EQ(linears, 2 * 7 + 1) << describe(m);
  const at::Tensor full = m->forward(ids);
  KvCache cache;
  std::vector<at::Tensor> steps = {m->forward(ids.narrow(1, 0, 4), &cache)};
  for (int64_t t = 4; t < 10; ++t) steps.push_back(m->forward(ids.narrow(1, t, 1), &cache));
  const double scale = full.abs().max().item<double>();
  EXPECT_LT((at::cat(steps, 1) - full).abs().max().item<double>(), 1e-4 * scale);
  // Quantized, not broken: close to the float model.
  EXPECT_LT((full - float_logits).abs().max().item<double>(), 0.25 * float_logits.abs().max().item<double>());
}

INSTANTIATE_TEST_SUITE_P(Llama, LlamaQuantized,
                         ::testing::Values(QuantCase{"W8", Scheme(qint8), "s8"},
                                           QuantCase{"W8A8", w8a8_dynamic(), "s8s32"},
                                           QuantCase{"W4g32", w4_g32(), "s4"}),
                         [](const auto& info) { return std::string(info.param.name); });

// The 2-layer Llama of the decode tests (hidden 64, random weights of `seed`) and a prompt of
// `tokens` ids in *ids.
LlamaForCausalLM tiny_llama(uint64_t seed, int64_t tokens, at::Tensor* ids) {
  LlamaConfig c;
  c.vocab_size = 64, c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.tie_word_embeddings = false;
  at::manual_seed(seed);
  LlamaForCausalLM m(c);
  m->eval();
  *ids = at::randint(0, c.vocab_size, {1, tokens}, at::kLong);
  return m;
}

// The logits of every position with the KV cache: 4 prompt tokens, then one token per call.
at::Tensor cache_decode(LlamaForCausalLM& m, const at::Tensor& ids) {
  KvCache cache;
  std::vector<at::Tensor> steps = {m->forward(ids.narrow(1, 0, 4), &cache)};
  for (int64_t t = 4; t < ids.size(1); ++t) steps.push_back(m->forward(ids.narrow(1, t, 1), &cache));
  return at::cat(steps, 1);
}

// Block-32 int8 decode activations (DecodeActivations::kQ8Block32): every weight-only Linear plans
// the q8 kernels and says so in describe(), KV-cache decoding equals the full forward, the logits
// stay within the measured activation-rounding cost of the exact weight-only model
// (docs/kernels.md, "Decode activations"), and switching back is exact again.
class LlamaDecodeQ8 : public ::testing::TestWithParam<int> {};

TEST_P(LlamaDecodeQ8, PlansQ8KernelsDecodesLikeTheFullForwardAndStaysNearTheExactLogits) {
  at::NoGradGuard ng;
  at::Tensor ids;
  LlamaForCausalLM m = tiny_llama(23, 12, &ids);  // 12 rows: decode-sized calls
  quantize(m, GetParam() == 8 ? Scheme(qint8) : w4_g32());
  freeze(m);
  const at::Tensor exact = m->forward(ids);

  EXPECT_EQ(nn::set_decode_activations(*m, DecodeActivations::kQ8Block32), 2 * 7 + 1);
  for (const LayerReport& r : layer_reports(m)) {
    if (r.type != "Linear") continue;
    EXPECT_NE(r.kernel.find(GetParam() == 8 ? "q8s8" : "q8s4"), std::string::npos) << r.name << ": " << r.kernel;
    EXPECT_NE(r.activations.find("q8_block32"), std::string::npos) << r.name << ": " << r.activations;
  }
  const at::Tensor full = m->forward(ids);
  const double scale = exact.abs().max().item<double>();
  EXPECT_LT((cache_decode(m, ids) - full).abs().max().item<double>(), 1e-4 * scale);

  // The accuracy cost of rounding the activations (measured value printed for docs/kernels.md).
  const double cost = (full - exact).abs().max().item<double>() / scale;
  const double top1 = (full.argmax(-1) == exact.argmax(-1)).to(at::kFloat).mean().item<double>();
  std::printf("q8_block32 on W%d: max |logit change| / max |logit| = %.3g, top-1 agreement %.3f\n", GetParam(), cost,
              top1);
  EXPECT_GT(cost, 0.0) << "the activations were not quantized";
  EXPECT_LT(cost, 0.02);
  EXPECT_GE(top1, 0.9);

  nn::set_decode_activations(*m, DecodeActivations::kExact);
  EXPECT_TRUE(at::equal(m->forward(ids), exact));
}

// A prompt longer than a decode-sized call: on AVX-512 VNNI its Linears quantize every row too
// (the block-32 GEMMs), so the full forward matches the token-by-token decode as closely as at 12
// rows, describe() says "every call", and it is not the exact model's result.
TEST_P(LlamaDecodeQ8, APromptBeyondDecodeSizeQuantizesItsRowsAsTheDecodeDoes) {
  if (usable_isa() < Isa::kAvx512Vnni) GTEST_SKIP() << "calls of more than 16 rows run the exact path here";
  at::NoGradGuard ng;
  at::Tensor ids;
  LlamaForCausalLM m = tiny_llama(29, 40, &ids);
  quantize(m, GetParam() == 8 ? Scheme(qint8) : w4_g32());
  freeze(m);
  const at::Tensor exact = m->forward(ids);
  nn::set_decode_activations(*m, DecodeActivations::kQ8Block32);
  for (const LayerReport& r : layer_reports(m)) {
    if (r.type != "Linear") continue;
    EXPECT_NE(r.activations.find("every call: int8 blocks of 32"), std::string::npos) << r.name << ": " << r.activations;
  }
  const at::Tensor full = m->forward(ids);
  const double scale = exact.abs().max().item<double>();
  EXPECT_LT((cache_decode(m, ids) - full).abs().max().item<double>(), 1e-4 * scale);
  EXPECT_GT((full - exact).abs().max().item<double>(), 1e-3 * scale) << "the prompt's rows were not quantized";
}

// int4 groups of 16 cannot be split into 32-blocks: the exact weight-only GEMV runs with float
// activations, and neither the plan, describe() nor the count claims block-32 activations.
TEST(LinearDecodeQ8, GroupsOf16KeepFloatActivationsAndSaySo) {
  at::manual_seed(5);
  nn::Linear lin(64, 24);
  lin->eval();
  Scheme s = w4_g32();
  s.group_size = 16;
  quantize(lin, s);
  freeze(lin);
  EXPECT_EQ(nn::set_decode_activations(*lin, DecodeActivations::kQ8Block32), 0);
  const KernelPlan plan = lin->plan();
  EXPECT_FALSE(plan.decode_q8);
  EXPECT_EQ(plan.kernel, "linear_f32s4f32");
  for (const LayerReport& r : layer_reports(lin))
    EXPECT_EQ(r.activations.find("q8_block32"), std::string::npos) << r.name << ": " << r.activations;
  const at::Tensor x = at::randn({2, 64});
  const at::Tensor q8 = lin->forward(x);
  nn::set_decode_activations(*lin, DecodeActivations::kExact);
  EXPECT_TRUE(at::equal(lin->forward(x), q8));

  s.group_size = 32;  // the contrast: a g32 layer does quantize its decode activations
  nn::Linear lin32(64, 24);
  quantize(lin32, s);
  freeze(lin32);
  EXPECT_EQ(nn::set_decode_activations(*lin32, DecodeActivations::kQ8Block32), 1);
  EXPECT_TRUE(lin32->plan().decode_q8);
}

INSTANTIATE_TEST_SUITE_P(Llama, LlamaDecodeQ8, ::testing::Values(8, 4),
                         [](const auto& info) { return "W" + std::to_string(info.param); });

}  // namespace
}  // namespace qforge::models
