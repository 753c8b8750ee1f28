// A model loaded from GGUF Q4_0 / Q8_0 codes decodes as llama.cpp runs the file: block-32 int8
// activations (DecodeActivations::kQ8Block32) by default, said by describe(), on the int4 q8
// kernels (Q4_0) or the int8 group-scale kernels (Q8_0, negative block scales and code -128
// included); its logits stay within the activation-rounding cost of the exact path (one call
// away), and one Linear's decode output equals a scalar reference of the q8 block math written
// here from docs/kernels.md §2.5a, as do its 512-row (prefill) calls on the Q8_0 block-32 GEMM. A
// loaded Q8_0 file exports the same bytes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "framework/api/quantize.h"
#include "framework/core/isa.h"
#include "framework/models/gguf_export.h"
#include "framework/models/gguf_load.h"
#include "framework/models/kv_cache.h"
#include "framework/nn/linear.h"
#include "kernels/cpu/linear_weight_only.h"
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
    // The SIMD q8s4 twins need AVX2; below it the plan names the scalar reference.
    if (usable_isa() >= Isa::kAvx2) {
      EXPECT_NE(r.kernel.find("q8s4"), std::string::npos) << r.name << ": " << r.kernel;
    }
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

// `rows` rows (one: a decode step) through a frozen Linear against the q8 block math computed here
// in scalars: per block of 32, d = amax / 127, q = clamp(nearbyint(x / d)) via x * (1 / d);
// i_b = Σ q·(w - z); per group g (one block): t = fmaf(float(i_b) · d_b, scale[n, g], t). Equal to the bit.
void expect_scalar_q8_reference(nn::LinearImpl& lin, int64_t rows = 1) {
  const QuantizedTensor w = lin.frozen_weight();
  ASSERT_EQ(w.spec.group_size, 32);
  const at::Tensor codes = w.int_values().to(at::kInt).contiguous(), scale = w.scale.to(at::kFloat).contiguous();
  const at::Tensor zero = w.zero_point.to(at::kInt).contiguous();
  const int64_t N = codes.size(0), K = codes.size(1);
  at::manual_seed(4);
  const at::Tensor x = at::randn({rows, K});
  at::Tensor y;
  {
    at::NoGradGuard ng;
    y = lin.forward(x).contiguous();
  }
  const int32_t* c = codes.data_ptr<int32_t>();
  const int32_t* z = zero.data_ptr<int32_t>();
  const float* s = scale.data_ptr<float>();
  int64_t differ = 0;
  for (int64_t m = 0; m < rows; ++m) {
    const float* xs = x.data_ptr<float>() + m * K;
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
    for (int64_t n = 0; n < N; ++n) {
      float t = 0;
      for (int64_t b = 0; b < K / 32; ++b) {
        int32_t i = 0;
        for (int64_t k = b * 32; k < b * 32 + 32; ++k) i += q[k] * (c[n * K + k] - z[n * (K / 32) + b]);
        t = std::fmaf(std::fmaf(static_cast<float>(i), d[b], 0.0f), s[n * (K / 32) + b], t);
      }
      const float got = y.data_ptr<float>()[m * N + n];
      if (got != t && differ++ < 5) {
        ADD_FAILURE() << lin.path() << " row " << m << " column " << n << ": " << got << " != " << t;
      }
    }
  }
  EXPECT_EQ(differ, 0) << lin.path() << " over " << rows << " rows";
}

TEST(GgufDecode, OneLoadedLinearEqualsAScalarQ8BlockReference) {
  LlamaForCausalLM l = loaded_w4_g32();
  auto& lin = *l->model->layers->ptr(1)->as<LlamaDecoderLayerImpl>()->mlp->down_proj;
  ASSERT_TRUE(lin.frozen_weight().zero_point.eq(0).all().item<bool>());
  expect_scalar_q8_reference(lin);
}

// The value of largest magnitude of a block of 32 (the first one on ties), as ggml's quantizers pick it.
float largest_magnitude(const float* v) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j)
    if (amax < std::fabs(v[j])) amax = std::fabs(v[j]), max = v[j];
  return max;
}

// A block scale as ggml stores it: fp16 (RNE), little-endian.
void push_fp16(float d, std::vector<uint8_t>* out) {
  const uint16_t bits = c10::Half(d).x;
  out->push_back(static_cast<uint8_t>(bits & 0xff));
  out->push_back(static_cast<uint8_t>(bits >> 8));
}

LlamaForCausalLM loaded_q8_0() {
  GgufExportOptions o;
  o.float_type = io::GgmlType::kQ8_0;
  return model_of_gguf(io::parse_gguf(io::serialize_gguf(gguf_of(tiny_gguf_llama(), o)), "mem"), "mem").llama;
}

// The int8 group kernel's name where its ISA is usable, else the scalar reference's.
void expect_q8s8g_kernel(const std::string& what, const std::string& kernel) {
  if (usable_isa() >= Isa::kAvx512Vnni) {
    EXPECT_EQ(kernel, "gemv_q8s8gf32_n16k4_avx512vnni") << what;
  } else if (usable_isa() >= Isa::kAvx2) {
    EXPECT_EQ(kernel, "gemv_q8s8gf32_n16k4_avx2") << what;
  } else {
    EXPECT_EQ(kernel, "reference") << what;
  }
}

// Q8_0 codes load as int8 per group of 32 on the int8 group-scale kernels (PackedLinearS8G) and
// decode with q8_block32 activations by default, as llama.cpp runs the file; describe() says so.
TEST(GgufDecode, LoadedQ8CodesDecodeOnTheInt8GroupKernelByDefault) {
  LlamaForCausalLM l = loaded_q8_0();
  const std::vector<nn::LinearImpl*> linears = frozen_linears(*l);
  ASSERT_EQ(linears.size(), 2u * 7 + 1);
  for (nn::LinearImpl* lin : linears) {
    EXPECT_EQ(lin->frozen_weight().spec.qtype, qint8) << lin->path();
    EXPECT_EQ(lin->plan().path, LinearPath::kS8GroupWeightOnly) << lin->path();
    EXPECT_TRUE(lin->plan().decode_q8) << lin->path();
    expect_q8s8g_kernel(lin->path(), lin->plan().kernel);
  }
  int frozen = 0;
  for (const LayerReport& r : layer_reports(l)) {
    if (r.type != "Linear" || r.weights == "float") continue;
    ++frozen;
    EXPECT_NE(r.activations.find("q8_block32"), std::string::npos) << r.name << ": " << r.activations;
    EXPECT_NE(r.fallback_reason.find("q8_block32 by default, as llama.cpp runs this file"), std::string::npos)
        << r.name << ": " << r.fallback_reason;
  }
  EXPECT_EQ(frozen, 2 * 7 + 1);
  EXPECT_EQ(nn::set_decode_activations(*l, DecodeActivations::kExact), 0);
  for (nn::LinearImpl* lin : linears) {
    EXPECT_EQ(lin->plan().kernel, usable_isa() >= Isa::kAvx512 ? "gemv_f32s8gf32_n16k4_avx512"
                                  : usable_isa() >= Isa::kAvx2 ? "gemv_f32s8gf32_n16k4_avx2"
                                                               : "reference");
  }
}

TEST(GgufDecode, LoadedQ8LogitsStayNearTheExactPathAndOneLinearEqualsTheScalarReference) {
  LlamaForCausalLM l = loaded_q8_0();
  at::manual_seed(5);
  const at::Tensor ids = at::randint(0, 256, {1, 12}, at::kLong);
  const at::Tensor q8 = decode_logits(l, ids);
  expect_scalar_q8_reference(*l->model->layers->ptr(1)->as<LlamaDecoderLayerImpl>()->mlp->down_proj);
  expect_scalar_q8_reference(*l->lm_head);
  EXPECT_EQ(nn::set_decode_activations(*l, DecodeActivations::kExact), 0);
  const at::Tensor exact = decode_logits(l, ids);
  const double cost = (q8 - exact).abs().max().item<double>() / exact.abs().max().item<double>();
  const double top1 = (q8.argmax(-1) == exact.argmax(-1)).to(at::kFloat).mean().item<double>();
  std::printf("GGUF Q8_0 loaded, q8_block32 against exact: max |logit change| / max |logit| = %.3g, top-1 %.3f\n",
              cost, top1);
  // Bound: the same 2 % of the largest logit as the Q4_0 file (docs/kernels.md §2.5a).
  EXPECT_GT(cost, 0.0) << "the default did not quantize the activations";
  EXPECT_LT(cost, 0.02);
  EXPECT_GE(top1, 0.9);
}

// A prompt-sized call of a loaded Q8_0 Linear (512 rows) runs the int8-group block-32 GEMM where
// AVX-512 VNNI is usable, which the plan and describe() name, and equals the scalar q8 block
// reference row by row (so q8_block32 holds for prefill as for decode); elsewhere the plan names
// the exact dequantized GEMM.
TEST(GgufDecode, LoadedQ8PrefillCallsRunTheInt8GroupGemmAndEqualTheScalarReference) {
  LlamaForCausalLM l = loaded_q8_0();
  const bool vnni = usable_isa() >= Isa::kAvx512Vnni;
  for (nn::LinearImpl* lin : frozen_linears(*l)) {
    const KernelPlan p = lin->plan();
    EXPECT_EQ(p.large_m, kernels::kWeightOnlyMaxM + 1) << lin->path();
    EXPECT_EQ(p.large_m_kernel, vnni ? "gemm_q8s8gf32_n16k4_avx512vnni" : kernels::kDequantGemmKernel) << lin->path();
  }
  int described = 0;
  for (const LayerReport& r : layer_reports(l)) {
    if (r.type != "Linear" || r.weights == "float") continue;
    const std::string want = vnni ? "every call: int8 blocks of 32 (q8_block32; from 17 rows gemm_q8s8gf32_n16k4_avx512vnni)"
                                  : "calls of <= 16 rows: int8 blocks of 32 (q8_block32)";
    EXPECT_NE(r.activations.find(want), std::string::npos) << r.name << ": " << r.activations;
    ++described;
  }
  EXPECT_EQ(described, 2 * 7 + 1);
  if (!vnni) GTEST_SKIP() << "calls of more than 16 rows run the exact path without AVX-512 VNNI";
  expect_scalar_q8_reference(*l->model->layers->ptr(1)->as<LlamaDecoderLayerImpl>()->mlp->down_proj, 512);
  expect_scalar_q8_reference(*l->model->layers->ptr(0)->as<LlamaDecoderLayerImpl>()->self_attn->q_proj, 512);
  expect_scalar_q8_reference(*l->lm_head, 512);
}

// A Q8_0 quantizer written here in ggml's style, but with the sign of d chosen like ggml's Q4_0
// (d = max / -127, max the value of largest magnitude) in every other block, so about a quarter
// of the blocks have d < 0; one code per such tensor is set to -128 (the grid's end, which ggml's own
// quantizer never writes). Codes q = round(x / d), d stored as fp16 (RNE).
std::vector<uint8_t> q8_0_twin(const float* x, int64_t n) {
  std::vector<uint8_t> out;
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + b * 32;
    const float max = largest_magnitude(v);
    const float d = b % 2 == 0 ? std::fabs(max) / 127 : max / -127, id = d != 0 ? 1.0f / d : 0.0f;
    push_fp16(d, &out);
    for (int j = 0; j < 32; ++j) out.push_back(static_cast<uint8_t>(static_cast<int8_t>(std::round(v[j] * id))));
  }
  out[34 + 2 + 5] = static_cast<uint8_t>(-128);  // block 1, element 5
  return out;
}

TEST(GgufDecode, Q8_0WithNegativeBlockScalesLoadsOnTheInt8GroupKernelAndExportsTheSameBytes) {
  io::GgufFile f = gguf_of(tiny_gguf_llama());
  int64_t negative = 0, blocks = 0;
  for (io::GgufTensor& t : f.tensors) {
    if (t.name.rfind("blk.", 0) != 0 || t.ne.size() != 2) continue;
    const int64_t n = static_cast<int64_t>(t.ne[0] * t.ne[1]);
    t.data = q8_0_twin(reinterpret_cast<const float*>(t.data.data()), n);
    t.type = io::GgmlType::kQ8_0;
    for (int64_t b = 0; b < n / 32; ++b) negative += (t.data[b * 34 + 1] & 0x80) != 0, ++blocks;
  }
  EXPECT_GT(negative, blocks / 8);
  const GgufModel g = model_of_gguf(io::parse_gguf(io::serialize_gguf(f), "mem"), "mem");
  LlamaForCausalLM l = g.llama;
  const std::vector<nn::LinearImpl*> linears = frozen_linears(*l);
  ASSERT_EQ(linears.size(), 2u * 7);
  for (nn::LinearImpl* lin : linears) {
    EXPECT_EQ(lin->frozen_weight().spec.qtype, qint8) << lin->path();
    EXPECT_TRUE(lin->frozen_weight().zero_point.eq(-1).any().item<bool>()) << lin->path();
    EXPECT_TRUE(lin->plan().decode_q8) << lin->path();
    expect_q8s8g_kernel(lin->path(), lin->plan().kernel);
  }
  auto& layer = *l->model->layers->ptr(0)->as<LlamaDecoderLayerImpl>();
  EXPECT_TRUE(at::equal(layer.mlp->up_proj->frozen_weight().dequantize(),
                        io::decode_gguf_tensor(*f.tensor("blk.0.ffn_up.weight"))));
  expect_scalar_q8_reference(*layer.mlp->up_proj);
  expect_scalar_q8_reference(*layer.self_attn->q_proj);
  // The file again from the loaded model: the same bytes, d < 0 blocks and the -128 code included.
  const io::GgufFile again = gguf_of(l);
  for (const io::GgufTensor& t : f.tensors) {
    const io::GgufTensor* u = again.tensor(t.name);
    ASSERT_TRUE(u) << t.name;
    EXPECT_TRUE(u->type == t.type && u->data == t.data) << t.name;
  }
}

// ggml's quantize_row_q4_0_ref written here from the format: per block of 32, max = the value of
// largest magnitude, d = max / -8, q = min(15, (int8)(x / d + 8.5)), d stored as fp16 (RNE).
std::vector<uint8_t> ggml_q4_0_twin(const float* x, int64_t n) {
  std::vector<uint8_t> out;
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + b * 32;
    const float max = largest_magnitude(v);
    const float d = max / -8, id = d != 0 ? 1.0f / d : 0.0f;
    push_fp16(d, &out);
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(v[j] * id + 8.5f)));
      const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(v[16 + j] * id + 8.5f)));
      out.push_back(static_cast<uint8_t>(lo | hi << 4));
    }
  }
  return out;
}

// ggml's dequantize_row_q4_0: (nibble - 8) * d, element j low nibble of qs[j], j + 16 its high nibble.
at::Tensor ggml_q4_0_values(const std::vector<uint8_t>& bytes, int64_t rows, int64_t K) {
  at::Tensor out = at::empty({rows, K});
  float* y = out.data_ptr<float>();
  for (int64_t b = 0; b < rows * K / 32; ++b) {
    const uint8_t* blk = bytes.data() + b * 18;
    c10::Half h;
    h.x = static_cast<uint16_t>(blk[0] | blk[1] << 8);
    const float d = static_cast<float>(h);
    for (int j = 0; j < 16; ++j) {
      y[b * 32 + j] = static_cast<float>((blk[2 + j] & 15) - 8) * d;
      y[b * 32 + 16 + j] = static_cast<float>((blk[2 + j] >> 4) - 8) * d;
    }
  }
  return out;
}

// The tiny Llama's file with its blk.* matrices as llama.cpp's Q4_0 quantizer writes them (d < 0 in
// about half the blocks, each holding a code -8, codes 0 and 15 among them); *expected: ggml's
// dequantized values per tensor.
io::GgufFile ggml_quantized_q4_0_file(std::map<std::string, at::Tensor>* expected) {
  io::GgufFile f = gguf_of(tiny_gguf_llama());
  int64_t negative = 0, blocks = 0, extremes[2] = {0, 0};
  for (io::GgufTensor& t : f.tensors) {
    if (t.name.rfind("blk.", 0) != 0 || t.ne.size() != 2) continue;
    const int64_t K = static_cast<int64_t>(t.ne[0]), rows = static_cast<int64_t>(t.ne[1]);
    t.data = ggml_q4_0_twin(reinterpret_cast<const float*>(t.data.data()), rows * K);
    t.type = io::GgmlType::kQ4_0;
    for (int64_t b = 0; b < rows * K / 32; ++b) {
      const uint8_t* blk = t.data.data() + b * 18;
      if ((blk[1] & 0x80) == 0) continue;
      ++negative;
      for (int j = 2; j < 18; ++j)
        for (int nibble : {blk[j] & 15, blk[j] >> 4}) extremes[0] += nibble == 0, extremes[1] += nibble == 15;
    }
    blocks += rows * K / 32;
    if (expected != nullptr) (*expected)[t.name] = ggml_q4_0_values(t.data, rows, K);
  }
  EXPECT_GT(negative, blocks / 4);
  EXPECT_GT(extremes[0], 0);
  EXPECT_GT(extremes[1], 0);
  return f;
}

// A file whose blk.* matrices llama.cpp's Q4_0 quantizer wrote (d < 0 in about half the blocks, each
// holding a code -8): every Linear loads as qint4, dequantizes to ggml's values (equal up to the sign of
// zero: a code 0 under d < 0 gives +0 where ggml gives -0.0, at::equal takes them as equal), and decodes
// with the q8 kernel (equal to the scalar block reference).
TEST(GgufDecode, GgmlQuantizedQ4_0StaysFourBitAndDecodesWithQ8) {
  std::map<std::string, at::Tensor> expected;
  const io::GgufFile f = ggml_quantized_q4_0_file(&expected);
  const GgufModel g = model_of_gguf(io::parse_gguf(io::serialize_gguf(f), "mem"), "mem");
  LlamaForCausalLM l = g.llama;
  const std::vector<nn::LinearImpl*> linears = frozen_linears(*l);
  ASSERT_EQ(linears.size(), 2u * 7);
  for (nn::LinearImpl* lin : linears) {
    EXPECT_EQ(lin->frozen_weight().spec.qtype, qint4) << lin->path();
    EXPECT_TRUE(lin->plan().decode_q8) << lin->path();
    if (usable_isa() >= Isa::kAvx2) {
      EXPECT_NE(lin->plan().kernel.find("q8s4"), std::string::npos) << lin->path() << ": " << lin->plan().kernel;
    }
  }
  // Zero points -1 (negative block scales) fold into n16b32 where its kernels run, and describe()
  // names it; below AVX2 it says why not.
  for (const LayerReport& r : layer_reports(l)) {
    if (r.kernel.find("q8s4") == std::string::npos) continue;
    if (usable_isa() >= Isa::kAvx2) {
      EXPECT_NE(r.kernel.find("n16b32"), std::string::npos) << r.name << ": " << r.kernel;
      EXPECT_EQ(r.fallback_reason.find("n16b32 (Q4_0's one-stream form) not used"), std::string::npos)
          << r.name << ": " << r.fallback_reason;
    } else {
      EXPECT_NE(r.fallback_reason.find("n16b32 (Q4_0's one-stream form) not used"), std::string::npos)
          << r.name << ": " << r.fallback_reason;
    }
  }
  for (int64_t i = 0; i < 2; ++i) {
    auto& layer = *l->model->layers->ptr(i)->as<LlamaDecoderLayerImpl>();
    const std::string blk = "blk." + std::to_string(i) + ".";
    const std::vector<std::pair<const nn::LinearImpl*, at::Tensor>> pairs = {
        {layer.self_attn->q_proj.get(), gguf_rope_rows(expected[blk + "attn_q.weight"], 4, false)},
        {layer.self_attn->k_proj.get(), gguf_rope_rows(expected[blk + "attn_k.weight"], 2, false)},
        {layer.self_attn->v_proj.get(), expected[blk + "attn_v.weight"]},
        {layer.self_attn->o_proj.get(), expected[blk + "attn_output.weight"]},
        {layer.mlp->gate_proj.get(), expected[blk + "ffn_gate.weight"]},
        {layer.mlp->up_proj.get(), expected[blk + "ffn_up.weight"]},
        {layer.mlp->down_proj.get(), expected[blk + "ffn_down.weight"]}};
    for (const auto& [lin, want] : pairs) EXPECT_TRUE(at::equal(lin->frozen_weight().dequantize(), want)) << lin->path();
  }
  expect_scalar_q8_reference(*l->model->layers->ptr(1)->as<LlamaDecoderLayerImpl>()->mlp->down_proj);
  expect_scalar_q8_reference(*l->model->layers->ptr(0)->as<LlamaDecoderLayerImpl>()->self_attn->q_proj);
}

// A loaded Q4_0 file packs its Linears in the n16b32 form where its decode kernels run (AVX2 and
// up): describe() names them, the layers hold 18 bytes per 32 weights and nothing beside it, the
// logits of both decode modes equal the n16k8 form's (the same file loaded under a reference cap,
// run without it) bit for bit, and the file exported again has the same bytes.
void expect_one_stream_form_same_as_n16k8(const io::GgufFile& f) {
  const std::vector<uint8_t> file = io::serialize_gguf(f);
  LlamaForCausalLM l = model_of_gguf(io::parse_gguf(file, "mem"), "mem").llama;
  LlamaForCausalLM n16k8 = [&] {
    ScopedMaxIsa cap(Isa::kReference);
    return model_of_gguf(io::parse_gguf(file, "mem"), "mem").llama;
  }();
  const bool stream = usable_isa() >= Isa::kAvx2;
  const char* gemv = usable_isa() >= Isa::kAvx512Vnni ? "gemv_q8s4f32_n16b32_avx512vnni" : "gemv_q8s4f32_n16b32_avx2";
  std::map<std::string, int64_t> bytes, n16k8_bytes;
  for (const LayerReport& r : layer_reports(l)) bytes[r.name] = r.bytes;
  for (const LayerReport& r : layer_reports(n16k8)) {
    n16k8_bytes[r.name] = r.bytes;
    EXPECT_EQ(r.kernel.find("n16b32"), std::string::npos) << r.name << ": packed under the cap, " << r.kernel;
  }
  for (nn::LinearImpl* lin : frozen_linears(*l)) {
    const int64_t N = lin->options.out_features(), K = lin->options.in_features();
    ASSERT_FALSE(lin->options.bias()) << lin->path();
    if (stream) {
      EXPECT_NE(lin->plan().kernel.find(gemv), std::string::npos) << lin->plan().kernel;
      // The same layer's other storage (buffers) beside 576 bytes per 16 x 64 pair, where n16k8
      // held Np * Kp / 2 bytes of codes and 3 bytes (fp16 scale, zero code) per column and group.
      const int64_t np = (N + 15) / 16 * 16, groups = (K + 31) / 32;
      EXPECT_EQ(bytes.at(lin->path()) - np / 16 * ((groups + 1) / 2) * 576,
                n16k8_bytes.at(lin->path()) - np * K / 2 - np * groups * 3)
          << lin->path();
    } else {
      EXPECT_EQ(lin->plan().kernel.find("n16b32"), std::string::npos) << lin->plan().kernel;
    }
  }
  at::manual_seed(5);
  const at::Tensor ids = at::randint(0, 256, {1, 12}, at::kLong);
  EXPECT_TRUE(at::equal(decode_logits(l, ids), decode_logits(n16k8, ids)));
  nn::set_decode_activations(*l, DecodeActivations::kExact);
  nn::set_decode_activations(*n16k8, DecodeActivations::kExact);
  EXPECT_TRUE(at::equal(decode_logits(l, ids), decode_logits(n16k8, ids)));
  const io::GgufFile again = gguf_of(l);
  for (const io::GgufTensor& t : f.tensors) {
    const io::GgufTensor* u = again.tensor(t.name);
    ASSERT_TRUE(u) << t.name;
    EXPECT_TRUE(u->type == t.type && u->data == t.data) << t.name;
  }
}

TEST(GgufDecode, GgufQ4_0LoadsOnTheOneStreamFormWithTheSameLogitsAndBytes) {
  LlamaForCausalLM src = tiny_gguf_llama();
  quantize(src, w4_g32_scheme());
  freeze(src);
  expect_one_stream_form_same_as_n16k8(gguf_of(src));
}

// A Q4_0 file from llama.cpp's own quantizer: its negative block scales (loaded as zero point -1)
// fold back into the n16b32 stream's fp16 scales, with the n16k8 form's logits and the file's bytes.
TEST(GgufDecode, GgmlQuantizedQ4_0WithNegativeScalesLoadsOnTheOneStreamFormWithTheSameLogitsAndBytes) {
  expect_one_stream_form_same_as_n16k8(ggml_quantized_q4_0_file(nullptr));
}

}  // namespace
}  // namespace qforge::models
