// GGUF load: export -> load gives the same logits (float F32: bit for bit; frozen W8 / W4 and
// ggml-quantized Q8_0 / Q4_0: the file's codes and fp16 scales kept, so the re-export is the same
// file byte for byte), Llama's q/k rows back in rotate-half order, and every refusal is a
// qforge::Error naming what is wrong (truncated, flipped, foreign or incomplete files).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "framework/api/quantize.h"
#include "framework/core/error.h"
#include "framework/format/gguf_blocks.h"
#include "framework/models/gguf_export.h"
#include "framework/models/gguf_load.h"
#include "framework/nn/linear.h"
#include "tests/error_of.h"
#include "tests/gguf/gguf_models.h"

namespace qforge::models {
namespace {

using io::GgmlType;
using qforge::testing::error_of;

const at::Tensor kIds = at::tensor({65, 66, 67, 10, 200, 3, 97, 98}, at::kLong).unsqueeze(0);

GgufModel round_trip(const io::GgufFile& f) { return model_of_gguf(io::parse_gguf(io::serialize_gguf(f), "mem"), "mem"); }

template <typename Model>
at::Tensor logits(Model m) {
  at::NoGradGuard ng;
  return m->forward(kIds);
}

// A re-export of a loaded file is the same file (codes and scales came through untouched), but for
// the untied head a tied file's quantized token_embd gives: an `output` tensor of the same bytes.
template <typename Model>
void expect_same_file(const io::GgufFile& f, const Model& loaded) {
  const io::GgufFile again = gguf_of(loaded);
  EXPECT_TRUE(again.metadata == f.metadata);
  for (const io::GgufTensor& t : f.tensors) {
    const io::GgufTensor* u = again.tensor(t.name);
    ASSERT_TRUE(u) << t.name;
    EXPECT_TRUE(u->type == t.type && u->ne == t.ne && u->data == t.data) << t.name;
  }
  for (const io::GgufTensor& u : again.tensors) {
    if (f.tensor(u.name)) continue;
    EXPECT_EQ(u.name, "output.weight");
    EXPECT_TRUE(u.data == f.tensor("token_embd.weight")->data);
  }
}

TEST(GgufLoad, FloatF32FilesGiveIdenticalLogits) {
  Gpt2LMHeadModel g = tiny_gguf_gpt2();
  const GgufModel lg = round_trip(gguf_of(g));
  ASSERT_EQ(lg.architecture, "gpt2");
  EXPECT_TRUE(lg.gpt2->config.tie_word_embeddings);
  EXPECT_EQ(lg.tokens.size(), 256u);
  EXPECT_TRUE(at::equal(logits(g), logits(lg.gpt2)));
  expect_same_file(gguf_of(g), lg.gpt2);
  for (bool tied : {false, true}) {
    LlamaForCausalLM l = tiny_gguf_llama(12, tied);
    const GgufModel ll = round_trip(gguf_of(l));
    ASSERT_EQ(ll.architecture, "llama");
    EXPECT_EQ(ll.llama->config.kv_heads(), 2);
    EXPECT_EQ(ll.llama->config.tie_word_embeddings, tied);
    EXPECT_TRUE(at::equal(logits(l), logits(ll.llama))) << "tied " << tied;  // q/k rows un-permuted
    expect_same_file(gguf_of(l), ll.llama);
    EXPECT_TRUE(at::equal(ll.llama->model->layers->ptr(1)->as<LlamaDecoderLayerImpl>()->self_attn->k_proj->weight,
                          l->model->layers->ptr(1)->as<LlamaDecoderLayerImpl>()->self_attn->k_proj->weight));
  }
}

TEST(GgufLoad, FrozenW8AndW4KeepTheirCodes) {
  for (auto [label, scheme] : {std::pair{"w8", Scheme(qint8)}, std::pair{"w4g32", w4_g32_scheme()}}) {
    LlamaForCausalLM m = tiny_gguf_llama();
    quantize(m, scheme);
    freeze(m);
    const io::GgufFile f = gguf_of(m);
    const GgufModel l = round_trip(f);
    const auto& q = *m->model->layers->ptr(0)->as<LlamaDecoderLayerImpl>()->self_attn->q_proj;
    const auto& lq = *l.llama->model->layers->ptr(0)->as<LlamaDecoderLayerImpl>()->self_attn->q_proj;
    ASSERT_TRUE(lq.frozen()) << label;
    EXPECT_EQ(lq.frozen_weight().spec.group_size, 32) << label;
    EXPECT_TRUE(at::equal(lq.frozen_weight().int_values(), q.frozen_weight().int_values())) << label;
    expect_same_file(f, l.llama);
    // Only the scales' fp16 rounding separates the two (W4 scales are fp16 already: none), on the
    // exact path (loaded codes decode with q8_block32 activations by default: gguf_decode_test.cpp).
    nn::set_decode_activations(*l.llama.ptr(), DecodeActivations::kExact);
    const at::Tensor a = logits(m), b = logits(l.llama);
    EXPECT_LT((a - b).abs().max().item<double>(), std::string(label) == "w8" ? 2e-2 : 1e-4) << label;
  }
}

TEST(GgufLoad, GgmlQuantizedFloatsBecomeFrozenLayersWithTheFilesValues) {
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    Gpt2LMHeadModel g = tiny_gguf_gpt2();
    {
      at::NoGradGuard ng;
      g->transformer->wte->weight[7].zero_();  // a zero-padded token_embd row: all-zero blocks
    }
    GgufExportOptions o;
    o.float_type = type;
    const io::GgufFile f = gguf_of(g, o);
    // ggml's quantizers give such a block d = 0 / -8 = -0.0 (Q4_0) or 0 / 127 = +0.0 (Q8_0).
    const size_t block = type == GgmlType::kQ4_0 ? 18 : 34, row7 = 7 * (64 / 32) * block;
    EXPECT_EQ(f.tensor("token_embd.weight")->data[row7 + 1], type == GgmlType::kQ4_0 ? 0x80 : 0x00);
    const GgufModel l = round_trip(f);
    // Tied head over a quantized token_embd: lm_head gets the same codes, as llama.cpp's output does.
    ASSERT_TRUE(l.gpt2->lm_head) << io::ggml_type_name(type);
    EXPECT_TRUE(l.gpt2->lm_head->frozen());
    const auto& c_fc = *l.gpt2->transformer->h->ptr(1)->as<Gpt2BlockImpl>()->mlp->c_fc;
    EXPECT_TRUE(at::equal(c_fc.frozen_weight().dequantize(), io::decode_gguf_tensor(*f.tensor("blk.1.ffn_up.weight"))));
    // The file again from the loaded model, byte for byte (Q4_0: its d < 0 and d = -0.0 blocks too).
    expect_same_file(f, l.gpt2);
    if (type == GgmlType::kQ4_0) {
      // ggml's Q4_0 scales are max / -8: the blocks with d < 0 stay 4-bit with zero point -1.
      EXPECT_EQ(c_fc.frozen_weight().spec.qtype, qint4);
      EXPECT_TRUE(c_fc.frozen_weight().zero_point.eq(-1).any().item<bool>());
      EXPECT_TRUE(std::any_of(l.lines.begin(), l.lines.end(), [](const std::string& line) {
        return line.rfind("blk.1.ffn_up.weight Q4_0 -> transformer.h.1.mlp.c_fc.weight (frozen qint4 per_group(32), "
                          "negative block scales kept as |d|", 0) == 0;
      }));
    }
    // The frozen model computes what a float model of the decoded weights computes.
    io::GgufFile dequantized = f;
    for (io::GgufTensor& t : dequantized.tensors) t = io::encode_gguf_tensor(t.name, io::decode_gguf_tensor(t), GgmlType::kF32);
    const GgufModel ref = round_trip(dequantized);
    nn::set_decode_activations(*l.gpt2.ptr(), DecodeActivations::kExact);  // float activations, as the reference's
    EXPECT_LT((logits(l.gpt2) - logits(ref.gpt2)).abs().max().item<double>(), 1e-3) << io::ggml_type_name(type);
  }
}

// A Llama of width 256 exported with a k-quant float_type: `tensor` (qforge's `parameter`) loads as a
// float weight of the file's decoded values with the report line `why`, the logits within `bound`
// of the float model's (logits of magnitude ~1).
void expect_decoded_floats(GgmlType type, uint64_t seed, const std::string& tensor, const std::string& parameter,
                           const std::string& why, double bound) {
  LlamaConfig c = tiny_gguf_llama()->config;
  c.hidden_size = 256, c.intermediate_size = 512;
  at::manual_seed(seed);
  LlamaForCausalLM m(c);
  m->init_weights();
  GgufExportOptions o;
  o.float_type = type;
  const io::GgufFile f = gguf_of(m, o);
  EXPECT_EQ(f.tensor(tensor)->type, type);
  const GgufModel l = round_trip(f);
  const auto* lin = l.llama->named_modules()[parameter.substr(0, parameter.rfind('.'))]->as<nn::LinearImpl>();
  ASSERT_TRUE(lin);
  EXPECT_FALSE(lin->frozen());
  EXPECT_TRUE(at::equal(lin->weight, io::decode_gguf_tensor(*f.tensor(tensor))));
  const std::string line = tensor + " " + io::ggml_type_name(type) + " -> " + parameter + " (float: dequantized, " + why + ")";
  EXPECT_TRUE(std::any_of(l.lines.begin(), l.lines.end(), [&](const std::string& x) { return x == line; })) << line;
  EXPECT_LT((logits(l.llama) - logits(m)).abs().max().item<double>(), bound);
}

TEST(GgufLoad, Q6KMatricesLoadAsTheirDecodedValues) {
  // Six-bit weights against the float model: a few percent.
  expect_decoded_floats(GgmlType::kQ6_K, 5, "blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight",
                        "qforge has no 6-bit grid", 0.15);
}

TEST(GgufLoad, Q4KMatricesLoadAsTheirDecodedValues) {
  expect_decoded_floats(GgmlType::kQ4_K, 6, "blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight",
                        "qforge's int4 groups have no 6-bit sub-block scales and mins", 0.3);
}

// Hand-written blocks for each branch of the positive-scale repacking: the layer's grid or float
// state and its report line, and its values exactly the file's.
TEST(GgufLoad, HandWrittenBlocksTakeEachPositiveScaleBranch) {
  auto edit = [](io::GgufFile& f, const std::string& name, const std::function<void(at::Tensor&, at::Tensor&)>& change) {
    io::GgufTensor& t = *std::find_if(f.tensors.begin(), f.tensors.end(), [&](const io::GgufTensor& x) { return x.name == name; });
    at::Tensor codes, scales;
    io::decode_gguf_codes(t, &codes, &scales);
    change(codes, scales);
    t = io::encode_gguf_codes(t.name, codes, scales, t.type);
  };
  auto line_of = [](const GgufModel& l, const std::string& name) {
    for (const std::string& line : l.lines)
      if (line.rfind(name + " ", 0) == 0) return line;
    return std::string();
  };
  Gpt2LMHeadModel g = tiny_gguf_gpt2();
  GgufExportOptions o;
  o.float_type = GgmlType::kQ8_0;
  io::GgufFile f = gguf_of(g, o);
  // Q8_0, d = 0 in one block: its codes become 0 under d = 1, the layer stays qint8.
  edit(f, "blk.0.ffn_up.weight", [](at::Tensor& codes, at::Tensor& scales) {
    scales[0][0] = 0;
    codes[0].narrow(0, 0, 32).fill_(5);
  });
  // Q8_0, d < 0 over a code -128: -c - 1 = 127 under zero point -1, the layer stays qint8.
  edit(f, "blk.0.ffn_down.weight", [](at::Tensor& codes, at::Tensor& scales) {
    scales[1][0] = -scales[1][0].abs();
    codes[1][0] = -128;
  });
  const GgufModel l = round_trip(f);
  const auto& mlp = *l.gpt2->transformer->h->ptr(0)->as<Gpt2BlockImpl>()->mlp;
  ASSERT_TRUE(mlp.c_fc->frozen());
  EXPECT_EQ(mlp.c_fc->frozen_weight().spec.qtype, qint8);
  EXPECT_TRUE(mlp.c_fc->frozen_weight().int_values()[0].narrow(0, 0, 32).eq(0).all().item<bool>());
  EXPECT_EQ(mlp.c_fc->frozen_weight().scale[0][0].item<float>(), 1.0f);
  EXPECT_TRUE(at::equal(mlp.c_fc->frozen_weight().dequantize(), io::decode_gguf_tensor(*f.tensor("blk.0.ffn_up.weight"))));
  EXPECT_EQ(line_of(l, "blk.0.ffn_up.weight"),
            "blk.0.ffn_up.weight Q8_0 -> transformer.h.0.mlp.c_fc.weight (frozen qint8 per_group(32), codes and fp16 scales kept)");
  ASSERT_TRUE(mlp.c_proj->frozen());
  const QuantizedTensor& down = mlp.c_proj->frozen_weight();
  EXPECT_EQ(down.spec.qtype, qint8);
  EXPECT_EQ(down.int_values()[1][0].item<int>(), 127);
  EXPECT_EQ(down.zero_point[1][0].item<int>(), -1);
  EXPECT_EQ(down.zero_point[1][1].item<int>(), 0);
  EXPECT_TRUE(at::equal(down.dequantize(), io::decode_gguf_tensor(*f.tensor("blk.0.ffn_down.weight"))));
  EXPECT_EQ(line_of(l, "blk.0.ffn_down.weight"), "blk.0.ffn_down.weight Q8_0 -> transformer.h.0.mlp.c_proj.weight (frozen "
                                                 "qint8 per_group(32), negative block scales kept as |d| with codes -c - 1 and zero point -1)");
  EXPECT_TRUE(gguf_of(l.gpt2, o).tensor("blk.0.ffn_down.weight")->data == f.tensor("blk.0.ffn_down.weight")->data);

  // Q4_0 with d < 0 (each block keeps its code -8, now 7), and in row 0: d = -0.0 over nonzero codes,
  // a subnormal fp16 d < 0, d = 0 between two d < 0 blocks (zero points -1, 0, -1, 0, -1).
  o.float_type = GgmlType::kQ4_0;
  io::GgufFile f4 = gguf_of(g, o);
  const float subnormal = -3.0f * std::ldexp(1.0f, -24);
  edit(f4, "blk.1.ffn_down.weight", [&](at::Tensor& codes, at::Tensor& scales) {
    ASSERT_TRUE(codes.eq(-8).any().item<bool>());
    scales = -scales.abs();
    scales[0][1] = -0.0f, scales[0][2] = subnormal, scales[0][3] = 0.0f;
    codes[0].narrow(0, 32, 96).fill_(3);
  });
  const GgufModel l4 = round_trip(f4);
  const auto& c_proj = *l4.gpt2->transformer->h->ptr(1)->as<Gpt2BlockImpl>()->mlp->c_proj;
  ASSERT_TRUE(c_proj.frozen());
  const QuantizedTensor& w = c_proj.frozen_weight();
  EXPECT_EQ(w.spec.qtype, qint4);
  EXPECT_TRUE(at::equal(w.dequantize(), io::decode_gguf_tensor(*f4.tensor("blk.1.ffn_down.weight"))));
  EXPECT_EQ(line_of(l4, "blk.1.ffn_down.weight"), "blk.1.ffn_down.weight Q4_0 -> transformer.h.1.mlp.c_proj.weight (frozen qint4 "
                                                "per_group(32), negative block scales kept as |d| with codes -c - 1 and zero point -1)");
  EXPECT_TRUE(at::equal(w.zero_point[0].narrow(0, 0, 5), at::tensor({-1, 0, -1, 0, -1}, at::kInt)));
  EXPECT_TRUE(w.zero_point.narrow(0, 1, w.zero_point.size(0) - 1).eq(-1).all().item<bool>());
  EXPECT_EQ(w.scale[0][2].item<float>(), -subnormal);
  EXPECT_TRUE(w.int_values()[0].narrow(0, 64, 32).eq(-4).all().item<bool>());  // 3 under d < 0: -3 - 1
  EXPECT_TRUE(w.int_values().eq(7).any().item<bool>());                         // a code -8 under d < 0
}

// RoPE scaling read as llama.cpp reads it, or refused; other llama.* keys are refused by name.
TEST(GgufLoad, RopeScalingFollowsLlamaCppOrIsRefused) {
  const io::GgufFile good = gguf_of(tiny_gguf_llama());
  auto with = [&](const std::vector<std::pair<std::string, io::GgufValue>>& keys) {
    io::GgufFile f = good;
    for (const auto& kv : keys) f.metadata.push_back(kv);
    return f;
  };
  // A factor without a type is linear (llama.cpp's default), from either key name.
  for (const char* key : {"llama.rope.scaling.factor", "llama.rope.scale_linear"}) {
    const GgufModel l = round_trip(with({{key, io::GgufValue::f32(4)}}));
    EXPECT_EQ(l.llama->config.rope_scaling.rope_type, "linear") << key;
    EXPECT_EQ(l.llama->config.rope_scaling.factor, 4.0) << key;
  }
  EXPECT_NE(round_trip(with({{"llama.rope.scaling.factor", io::GgufValue::f32(0)}})).llama->config.rope_scaling.rope_type,
            "linear");
  EXPECT_NE(error_of([&] { round_trip(with({{"llama.rope.scaling.attn_factor", io::GgufValue::f32(2)}})); })
                .find("attn_factor = 2"), std::string::npos);
  EXPECT_NE(error_of([&] {
              round_trip(with({{"llama.rope.scaling.type", io::GgufValue::str("none")}, {"llama.rope.scaling.factor", io::GgufValue::f32(4)}}));
            }).find("with rope.scaling.type 'none'"), std::string::npos);
  EXPECT_NE(error_of([&] { round_trip(with({{"llama.attention.sliding_window", io::GgufValue::u32(8)}})); })
                .find("'llama.attention.sliding_window' is not read"), std::string::npos);
}

TEST(GgufLoad, TruncatedAndFlippedFilesAreErrorsNeverCrashes) {
  const std::vector<uint8_t> bytes = io::serialize_gguf(gguf_of(tiny_gguf_llama()));
  const size_t header = bytes.size() - [&] {
    size_t data = 0;
    for (const io::GgufTensor& t : io::parse_gguf(bytes, "b").tensors) data += (t.data.size() + 31) / 32 * 32;
    return data;
  }();
  for (size_t n = 0; n < bytes.size(); n += n < header ? 1 : 4099) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_NE(error_of([&] { model_of_gguf(io::parse_gguf(cut, "cut"), "cut"); }), "") << n;
  }
  // A flipped byte in the header or metadata: an error, or (where the value stays valid) a model.
  int refused = 0, loaded = 0;
  for (size_t i = 0; i < header; i += 7) {
    std::vector<uint8_t> b = bytes;
    b[i] ^= 0xFF;
    try {
      model_of_gguf(io::parse_gguf(b, "flip"), "flip");
      ++loaded;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(loaded, 0);  // flips inside token strings leave a valid file
}

TEST(GgufLoad, ForeignOrIncompleteFilesAreRefusedByName) {
  const io::GgufFile good = gguf_of(tiny_gguf_llama());
  auto with = [&](const std::function<void(io::GgufFile&)>& edit) {
    io::GgufFile f = good;
    edit(f);
    return error_of([&] { round_trip(f); });
  };
  auto set = [](io::GgufFile& f, const std::string& key, io::GgufValue v) {
    for (auto& [k, old] : f.metadata)
      if (k == key) return void(old = std::move(v));
    f.metadata.emplace_back(key, std::move(v));
  };
  EXPECT_NE(with([&](io::GgufFile& f) { set(f, "general.architecture", io::GgufValue::str("falcon")); })
                .find("architecture 'falcon' is not loaded"), std::string::npos);
  EXPECT_NE(with([](io::GgufFile& f) { f.tensors.erase(f.tensors.begin() + 3); }).find("is missing"), std::string::npos);
  EXPECT_NE(with([](io::GgufFile& f) { f.tensors.push_back(io::encode_gguf_tensor("rope_freqs.weight", at::ones({8}), GgmlType::kF32)); })
                .find("'rope_freqs.weight' is not part of qforge's model"), std::string::npos);
  EXPECT_NE(with([&](io::GgufFile& f) { set(f, "llama.rope.scaling.type", io::GgufValue::str("yarn")); })
                .find("'yarn' is not loaded"), std::string::npos);
  EXPECT_NE(with([&](io::GgufFile& f) { set(f, "llama.rope.dimension_count", io::GgufValue::u32(8)); })
                .find("partial rotary"), std::string::npos);
  EXPECT_NE(with([&](io::GgufFile& f) { set(f, "llama.block_count", io::GgufValue::u32(3)); })
                .find("is missing (qforge's model.layers.2."), std::string::npos);
  EXPECT_NE(with([&](io::GgufFile& f) { set(f, "llama.embedding_length", io::GgufValue::u32(1 << 19)); })
                .find("parameters, the file's tensors hold"), std::string::npos);
  EXPECT_NE(with([&](io::GgufFile& f) { set(f, "llama.attention.head_count", io::GgufValue::str("4")); })
                .find("llama.attention.head_count"), std::string::npos);
  EXPECT_NE(with([](io::GgufFile& f) {
              io::GgufTensor& t = f.tensors.back();
              float nan = std::nanf("");
              std::memcpy(t.data.data(), &nan, 4);
            }).find("NaN"), std::string::npos);
}

}  // namespace
}  // namespace qforge::models
