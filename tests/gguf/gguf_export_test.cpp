// GGUF export of GPT-2 and Llama: llama.cpp's metadata and tensor names, weights read back equal
// to the model's (float), codes kept with fp16 scales (frozen W8 -> Q8_0, W4 g32 -> Q4_0), Llama's
// q/k rows in llama.cpp's interleaved RoPE order, and the refusals.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "framework/api/quantize.h"
#include "framework/core/error.h"
#include "framework/format/gguf_blocks.h"
#include "framework/models/gguf_export.h"
#include "tests/gguf/gguf_models.h"

namespace qforge::models {
namespace {

using io::GgmlType;

at::Tensor read(const io::GgufFile& f, const std::string& name) {
  const io::GgufTensor* t = f.tensor(name);
  if (!t) throw Error("no tensor " + name);
  return io::decode_gguf_tensor(*t);
}

TEST(GgufExport, Gpt2FloatWritesLlamaCppNamesMetadataAndExactWeights) {
  Gpt2LMHeadModel m = tiny_gguf_gpt2();
  const io::GgufFile f = io::parse_gguf(io::serialize_gguf(gguf_of(m)), "gpt2");
  EXPECT_EQ(f.at("general.architecture").as_string("a"), "gpt2");
  EXPECT_EQ(f.at("gpt2.block_count").as_uint("b"), 2u);
  EXPECT_EQ(f.at("gpt2.embedding_length").as_uint("e"), 64u);
  EXPECT_EQ(f.at("gpt2.feed_forward_length").as_uint("f"), 256u);
  EXPECT_EQ(f.at("gpt2.attention.head_count").as_uint("h"), 4u);
  EXPECT_EQ(f.at("gpt2.context_length").as_uint("c"), 64u);
  EXPECT_FLOAT_EQ(f.at("gpt2.attention.layer_norm_epsilon").as_float("eps"), 1e-5f);
  EXPECT_EQ(f.at("tokenizer.ggml.tokens").as_array("t").size(), 256u);
  EXPECT_EQ(f.tensors.size(), 2u + 2 * 12 + 2);  // embeddings, 12 per block, output norm (tied head)
  const auto& t = *m->transformer;
  EXPECT_TRUE(at::equal(read(f, "token_embd.weight"), t.wte->weight));
  EXPECT_TRUE(at::equal(read(f, "position_embd.weight"), t.wpe->weight));
  const auto& blk = *t.h->ptr(1)->as<Gpt2BlockImpl>();
  EXPECT_TRUE(at::equal(read(f, "blk.1.attn_qkv.weight"), blk.attn->c_attn->weight));
  EXPECT_TRUE(at::equal(read(f, "blk.1.attn_qkv.bias"), blk.attn->c_attn->bias));
  EXPECT_TRUE(at::equal(read(f, "blk.1.ffn_down.weight"), blk.mlp->c_proj->weight));
  EXPECT_TRUE(at::equal(read(f, "blk.1.ffn_norm.bias"), blk.ln_2->bias));
  EXPECT_TRUE(at::equal(read(f, "output_norm.weight"), t.ln_f->weight));
  EXPECT_EQ(f.tensor("blk.1.attn_qkv.weight")->ne, (std::vector<uint64_t>{64, 192}));
}

TEST(GgufExport, ByteTokensFollowGpt2sByteToUnicodeMap) {
  EXPECT_EQ(gpt2_byte_token('A'), "A");
  EXPECT_EQ(gpt2_byte_token(' '), "\xc4\xa0");   // U+0120 'Ġ'
  EXPECT_EQ(gpt2_byte_token('\n'), "\xc4\x8a");  // U+010A 'Ċ'
  EXPECT_EQ(gpt2_byte_token(0), "\xc4\x80");     // U+0100
  EXPECT_EQ(gpt2_byte_token(0xAD), "\xc5\x83");  // U+0143, the last remapped byte
  EXPECT_EQ(gpt2_byte_token(0xFF), "\xc3\xbf");
}

TEST(GgufExport, LlamaQKRowsAreInLlamaCppsInterleavedRopeOrder) {
  LlamaForCausalLM m = tiny_gguf_llama();
  const io::GgufFile f = gguf_of(m);
  EXPECT_EQ(f.at("general.architecture").as_string("a"), "llama");
  EXPECT_EQ(f.at("llama.attention.head_count_kv").as_uint("kv"), 2u);
  EXPECT_EQ(f.at("llama.rope.dimension_count").as_uint("r"), 16u);
  EXPECT_FLOAT_EQ(f.at("llama.rope.freq_base").as_float("r"), 10000.0f);
  const auto& layer = *m->model->layers->ptr(0)->as<LlamaDecoderLayerImpl>();
  const int64_t D = 16;
  for (auto [name, w, heads] : {std::tuple{"blk.0.attn_q.weight", layer.self_attn->q_proj->weight, int64_t{4}},
                                std::tuple{"blk.0.attn_k.weight", layer.self_attn->k_proj->weight, int64_t{2}}}) {
    const at::Tensor g = read(f, name);
    // llama.cpp rotates pairs (2i, 2i + 1); HF rotate-half pairs (i, i + D/2).
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < D / 2; ++i)
        for (int64_t j = 0; j < 2; ++j)
          ASSERT_TRUE(at::equal(g[h * D + 2 * i + j], w[h * D + j * D / 2 + i])) << name << h << i << j;
  }
  EXPECT_TRUE(at::equal(read(f, "blk.0.attn_v.weight"), layer.self_attn->v_proj->weight));
  EXPECT_TRUE(at::equal(read(f, "output.weight"), m->lm_head->weight));
}

TEST(GgufExport, FrozenW8AndW4g32KeepTheirCodesWithFp16Scales) {
  for (auto [scheme, type] : {std::pair{Scheme(qint8), GgmlType::kQ8_0}, std::pair{w4_g32_scheme(), GgmlType::kQ4_0}}) {
    LlamaForCausalLM m = tiny_gguf_llama();
    quantize(m, scheme);
    freeze(m);
    GgufExportReport report;
    const io::GgufFile f = gguf_of(m, {}, &report);
    const auto& layer = *m->model->layers->ptr(1)->as<LlamaDecoderLayerImpl>();
    const QuantizedTensor q = layer.mlp->down_proj->frozen_weight();
    const io::GgufTensor* t = f.tensor("blk.1.ffn_down.weight");
    ASSERT_EQ(t->type, type) << report.str();
    const at::Tensor s = q.spec.granularity == Granularity::kPerGroup
                             ? q.scale.repeat_interleave(q.spec.group_size, 1)
                             : q.scale.reshape({-1, 1});
    const at::Tensor want = q.int_values().to(at::kFloat) * s.to(at::kHalf).to(at::kFloat);
    EXPECT_TRUE(at::equal(io::decode_gguf_tensor(*t), want));
    EXPECT_LE((io::decode_gguf_tensor(*t) - q.dequantize()).abs().max().item<double>(),
              q.dequantize().abs().max().item<double>() * std::ldexp(1.0, -11));
  }
}

TEST(GgufExport, FloatQ8_0AndQ4_0RunGgmlsQuantizers) {
  Gpt2LMHeadModel m = tiny_gguf_gpt2();
  const auto& w = m->transformer->h->ptr(0)->as<Gpt2BlockImpl>()->mlp->c_fc->weight;
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kF16}) {
    GgufExportOptions o;
    o.float_type = type;
    const io::GgufFile f = gguf_of(m, o);
    EXPECT_TRUE(at::equal(read(f, "blk.0.ffn_up.weight"), io::decode_gguf_tensor(io::encode_gguf_tensor("x", w, type))));
    EXPECT_EQ(f.tensor("blk.0.attn_norm.weight")->type, GgmlType::kF32);  // 1-D tensors stay F32
  }
}

TEST(GgufExport, GridsWithoutAGgufFormAreStoredAtF32OrRefused) {
  LlamaForCausalLM m = tiny_gguf_llama();
  Scheme s(qint4);
  s.weight_granularity = Granularity::kPerGroup;
  s.group_size = 16;
  quantize(m, s);
  freeze(m);
  GgufExportReport report;
  const io::GgufFile f = gguf_of(m, {}, &report);
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight")->type, GgmlType::kF32);
  EXPECT_NE(report.str().find("group size 16 is not a multiple of 32"), std::string::npos) << report.str();
  GgufExportOptions strict;
  strict.refuse_wider = true;
  EXPECT_THROW(gguf_of(m, strict), Error);
}

TEST(GgufExport, RefusesWhatLlamaCppsArchitecturesCannotRun) {
  auto message = [](const LlamaConfig& c) {
    try {
      gguf_of(LlamaForCausalLM(c));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("exported");
  };
  LlamaConfig c = tiny_gguf_llama()->config;
  LlamaConfig w = c;
  w.model_type = "mistral", w.sliding_window = 4;
  EXPECT_NE(message(w).find("sliding window"), std::string::npos);
  LlamaConfig q = c;
  q.model_type = "qwen2";
  EXPECT_NE(message(q).find("qwen2"), std::string::npos);
  LlamaConfig v = c;
  v.vocab_size = 300;
  EXPECT_NE(message(v).find("vocab_size is 300"), std::string::npos);
  LlamaConfig r = c;
  r.rope_scaling.rope_type = "llama3";
  EXPECT_NE(message(r).find("llama3"), std::string::npos);
  // A quantized model that is not frozen holds float weights and fake quantizers: refused.
  LlamaForCausalLM m = tiny_gguf_llama();
  quantize(m, Scheme(qint8));
  EXPECT_THROW(gguf_of(m), Error);
}

TEST(GgufExport, WritesAtomicallyAndReadsBack) {
  const std::string dir = ::testing::TempDir() + "gguf_export";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/llama.gguf";
  export_gguf(tiny_gguf_llama(), path);
  const io::GgufFile f = io::read_gguf(path);
  EXPECT_EQ(f.tensors.size(), 1u + 2 * 9 + 2);
  LlamaConfig bad = tiny_gguf_llama()->config;
  bad.model_type = "qwen2";
  EXPECT_THROW(export_gguf(LlamaForCausalLM(bad), path), Error);
  EXPECT_EQ(io::read_gguf(path).tensors.size(), f.tensors.size());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qforge::models
