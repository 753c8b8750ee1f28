// A model loaded from GGUF Q4_0 / Q8_0 codes decodes as llama.cpp runs the file: block-32 int8
// activations (DecodeActivations::kQ8Block32) by default, said by describe(); its logits stay
// within the activation-rounding cost of the exact path (one call away), and one Linear's decode
// output equals a scalar reference of the q8 block math written here from docs/kernels.md §2.5a.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "framework/api/quantize.h"
#include "framework/models/gguf_export.h"
#include "framework/models/gguf_load.h"
#include "framework/models/kv_cache.h"
#include "framework/nn/linear.h"
#include "tests/gguf/gguf_models.h"

namespace qforge::models {
namespace {

LlamaForCausalLM loaded_w4_g32() {
  LlamaForCausalLM m = tiny_gguf_llama();
  quantize(m, w4_g32_scheme());
  freeze(m);
  return model_of_gguf(io::parse_gguf(io::serialize_gguf(gguf_of(m)), "mem"), "mem").llama;
}

std::vector<nn::LinearImpl*> frozen_linears(torch::nn::Module& m) {
  std::vector<nn::LinearImpl*> out;
  for (const auto& mod : m.modules(/*include_self=*/false))
    if (auto* lin = dynamic_cast<nn::LinearImpl*>(mod.get()); lin && lin->frozen()) out.push_back(lin);
  return out;
}

// Prompt of 4 tokens, then 8 decoded one at a time with the KV cache: the logits of every position.
at::Tensor decode_logits(LlamaForCausalLM& m, const at::Tensor& ids) {
  at::NoGradGuard ng;
  KvCache cache;
  std::vector<at::Tensor> steps = {m->forward(ids.narrow(1, 0, 4), &cache)};
  for (int64_t t = 4; t < ids.size(1); ++t) steps.push_back(m->forward(ids.narrow(1, t, 1), &cache));
  return at::cat(steps, 1);
}

TEST(GgufDecode, LoadedQ4CodesDecodeWithQ8ActivationsByDefaultAndDescribeSaysWhy) {
  LlamaForCausalLM l = loaded_w4_g32();
  const std::vector<nn::LinearImpl*> linears = frozen_linears(*l);
  ASSERT_EQ(linears.size(), 2u * 7 + 1);
  for (nn::LinearImpl* lin : linears) {
    EXPECT_EQ(lin->decode_activations(), DecodeActivations::kQ8Block32) << lin->path();
    EXPECT_TRUE(lin->plan().decode_q8) << lin->path();
  }
  for (const LayerReport& r : layer_reports(l)) {
    if (r.type != "Linear") continue;
    EXPECT_NE(r.kernel.find("q8s4"), std::string::npos) << r.name << ": " << r.kernel;
    EXPECT_NE(r.activations.find("q8_block32"), std::string::npos) << r.name << ": " << r.activations;
    EXPECT_NE(r.fallback_reason.find("q8_block32 by default, as llama.cpp runs this file"), std::string::npos)
        << r.name << ": " << r.fallback_reason;
  }
}

TEST(GgufDecode, DefaultLogitsStayNearTheExactPathOneCallAway) {
  LlamaForCausalLM l = loaded_w4_g32();
  at::manual_seed(3);
  const at::Tensor ids = at::randint(0, 256, {1, 12}, at::kLong);
  const at::Tensor q8 = decode_logits(l, ids);
  EXPECT_EQ(nn::set_decode_activations(*l, DecodeActivations::kExact), 0);
  const at::Tensor exact = decode_logits(l, ids);
  const double scale = exact.abs().max().item<double>();
  const double cost = (q8 - exact).abs().max().item<double>() / scale;
  const double top1 = (q8.argmax(-1) == exact.argmax(-1)).to(at::kFloat).mean().item<double>();
  std::printf("GGUF Q4_0 loaded, q8_block32 against exact: max |logit change| / max |logit| = %.3g, top-1 %.3f\n",
              cost, top1);
  // Bound: 2 % of the largest logit (the activation-rounding cost docs/kernels.md §2.5a measures).
  EXPECT_GT(cost, 0.0) << "the default did not quantize the activations";
  EXPECT_LT(cost, 0.02);
  EXPECT_GE(top1, 0.9);
}

// One decode row through a loaded Q4_0 Linear against the q8 block math computed here in scalars:
// per block of 32, d = amax / 127, q = clamp(nearbyint(x / d)) via x * (1 / d); i_b = Σ q·w;
// per group g (one block): t = fmaf(float(i_b) · d_b, scale[n, g], t). Equal to the bit.
TEST(GgufDecode, OneLoadedLinearEqualsAScalarQ8BlockReference) {
  LlamaForCausalLM l = loaded_w4_g32();
  auto& lin = *l->model->layers->ptr(1)->as<LlamaDecoderLayerImpl>()->mlp->down_proj;
  const QuantizedTensor w = lin.frozen_weight();
  ASSERT_EQ(w.spec.group_size, 32);
  const at::Tensor codes = w.int_values().to(at::kInt).contiguous(), scale = w.scale.to(at::kFloat).contiguous();
  ASSERT_TRUE(w.zero_point.eq(0).all().item<bool>());
  const int64_t N = codes.size(0), K = codes.size(1);
  at::manual_seed(4);
  const at::Tensor x = at::randn({1, K});
  at::Tensor y;
  {
    at::NoGradGuard ng;
    y = lin.forward(x).contiguous();
  }
  const float* xs = x.data_ptr<float>();
  std::vector<int32_t> q(static_cast<size_t>(K));
  std::vector<float> d(static_cast<size_t>(K / 32));
  for (int64_t b = 0; b < K / 32; ++b) {
    float amax = 0;
    for (int64_t k = b * 32; k < b * 32 + 32; ++k) amax = std::fmax(amax, std::fabs(xs[k]));
    const float step = amax / 127.0f, inv = 1.0f / step;
    d[b] = step;
    for (int64_t k = b * 32; k < b * 32 + 32; ++k)
      q[k] = static_cast<int32_t>(std::fmin(127.0f, std::fmax(-127.0f, std::nearbyint(xs[k] * inv))));
  }
  const int32_t* c = codes.data_ptr<int32_t>();
  const float* s = scale.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) {
    float t = 0;
    for (int64_t b = 0; b < K / 32; ++b) {
      int32_t i = 0;
      for (int64_t k = b * 32; k < b * 32 + 32; ++k) i += q[k] * c[n * K + k];
      t = std::fmaf(std::fmaf(static_cast<float>(i), d[b], 0.0f), s[n * (K / 32) + b], t);
    }
    EXPECT_EQ(y[0][n].item<float>(), t) << "column " << n;
  }
}

}  // namespace
}  // namespace qforge::models
