#include "framework/models/gguf_export.h"

#include <ATen/ATen.h>

#include <functional>
#include <sstream>

#include "framework/core/error.h"
#include "framework/format/gguf_blocks.h"

namespace qforge::models {
namespace {

using io::GgmlType;
using io::GgufValue;
using io::GgufValueType;
using RowMap = std::function<at::Tensor(const at::Tensor&)>;  // reorders dim 0 (identity when empty)

// Why a frozen weight has no GGUF form with its codes kept (empty: it has one, `*type` set).
std::string ggml_form(const QuantizedTensor& q, GgmlType* type) {
  const QSpec& s = q.spec;
  if (s.qtype.kind != QKind::kInteger || !s.qtype.is_signed || (s.qtype.bits != 8 && s.qtype.bits != 4))
    return std::string("grid ") + s.qtype.name + " is not qint8 / qint4 (Q8_0 / Q4_0)";
  if (q.shape.size() != 2 || q.shape[1] % io::kGgmlBlock != 0) return "rows are not a multiple of 32";
  // Zero point -1 is a negative block scale (gguf load's form of a d < 0 block): (q + 1) s = -(q + 1) * -s.
  if (q.zero_point.defined() && q.zero_point.ne(0).logical_and(q.zero_point.ne(-1)).any().item<bool>())
    return "zero points are not 0 or -1 (Q8_0 / Q4_0 are symmetric)";
  if (s.granularity == Granularity::kPerChannel && s.axis != 0) return "per-channel scales are not per row";
  if (s.granularity == Granularity::kPerGroup && s.group_size % io::kGgmlBlock != 0)
    return "group size " + std::to_string(s.group_size) + " is not a multiple of 32";
  *type = s.qtype.bits == 8 ? GgmlType::kQ8_0 : GgmlType::kQ4_0;
  return "";
}

// One value per 32-block, [N, K / 32], from per-tensor, per-row or per-group values (scales, zero points).
at::Tensor per_block(const QuantizedTensor& q, const at::Tensor& s) {
  const int64_t N = q.shape[0], nb = q.shape[1] / io::kGgmlBlock;
  switch (q.spec.granularity) {
    case Granularity::kPerTensor: return s.reshape({1, 1}).expand({N, nb}).contiguous();
    case Granularity::kPerChannel: return s.reshape({N, 1}).expand({N, nb}).contiguous();
    default: return s.reshape({N, -1}).repeat_interleave(q.spec.group_size / io::kGgmlBlock, 1).contiguous();
  }
}

// The file's codes [N, K] and block scales [N, K / 32]: a block of zero point -1 as codes -(q + 1), d = -s;
// an all-zero block with ggml's own d (Q4_0: 0 / -8 = -0.0, Q8_0: 0 / 127 = +0.0), so such files re-export as they were.
void ggml_codes(const QuantizedTensor& q, GgmlType type, at::Tensor* codes, at::Tensor* scales) {
  *codes = q.int_values();
  *scales = per_block(q, q.scale.to(at::kFloat));
  if (q.zero_point.defined() && q.zero_point.ne(0).any().item<bool>()) {
    const at::Tensor flip = per_block(q, q.zero_point.to(at::kInt)).eq(-1);
    *codes = at::where(flip.repeat_interleave(io::kGgmlBlock, 1), codes->bitwise_not(), *codes);  // ~q = -(q + 1)
    *scales = at::where(flip, scales->neg(), *scales);
  }
  const at::Tensor zero = codes->reshape({scales->size(0), scales->size(1), io::kGgmlBlock}).eq(0).all(-1);
  *scales = scales->masked_fill(zero, type == GgmlType::kQ4_0 ? -0.0 : 0.0);
}

class Builder {
 public:
  explicit Builder(const GgufExportOptions& o) : options_(o) {
    file.metadata.emplace_back("general.alignment", GgufValue::u32(static_cast<uint32_t>(io::kGgufDefaultAlignment)));
  }
  io::GgufFile file;
  GgufExportReport report;

  void meta(const std::string& key, GgufValue v) { file.metadata.emplace_back(key, std::move(v)); }
  void u32(const std::string& key, int64_t v) { meta(key, GgufValue::u32(static_cast<uint32_t>(v))); }
  void f32(const std::string& key, double v) { meta(key, GgufValue::f32(static_cast<float>(v))); }

  void vector(const std::string& name, const at::Tensor& t, const RowMap& rows = {}) {
    add(io::encode_gguf_tensor(name, rows ? rows(t) : t, GgmlType::kF32), "float");
  }
  void float_matrix(const std::string& name, const at::Tensor& w, const RowMap& rows = {}) {
    GgmlType type = options_.float_type;
    std::string note = "float";
    const auto block = static_cast<int64_t>(io::ggml_block_elements(type));
    if (w.size(-1) % block != 0)
      type = GgmlType::kF32, note = "float, rows not a multiple of " + std::to_string(block) + ": F32 instead of " +
                                    std::string(io::ggml_type_name(options_.float_type));
    add(io::encode_gguf_tensor(name, rows ? rows(w) : w, type), note);
  }
  void layer(const std::string& name, const QuantizableLayer& l, const at::Tensor& float_w, const RowMap& rows = {});
  void linear(const std::string& base, const nn::LinearImpl& l, const RowMap& rows = {});
  void byte_vocabulary(int64_t vocab_size);

 private:
  void add(io::GgufTensor t, const std::string& note) {
    std::ostringstream line;
    line << t.name << " " << io::ggml_type_name(t.type) << " [";
    for (size_t d = t.ne.size(); d-- > 0;) line << t.ne[d] << (d ? ", " : "]");
    line << " <- " << note;
    report.lines.push_back(line.str());
    file.tensors.push_back(std::move(t));
  }
  GgufExportOptions options_;
};

void Builder::layer(const std::string& name, const QuantizableLayer& l, const at::Tensor& float_w, const RowMap& rows) {
  QF_REQUIRE(!l.quantized() || l.frozen() || !l.weight_quantizer(), "gguf export: ", l.path(), " (", l.layer_type(),
             ") is quantized but not frozen: freeze() it (the file holds frozen codes) or export the float model");
  if (!l.frozen() || !l.frozen_weight().defined()) return float_matrix(name, float_w, rows);
  const QuantizedTensor q = l.frozen_weight();
  GgmlType type = GgmlType::kF32;
  const std::string why = ggml_form(q, &type);
  const std::string grid = std::string("frozen ") + q.spec.to_string();
  if (!why.empty()) {
    QF_REQUIRE(!options_.refuse_wider, "gguf export: ", l.path(), ": ", grid, " has no GGUF form: ", why);
    return add(io::encode_gguf_tensor(name, rows ? rows(q.dequantize()) : q.dequantize(), GgmlType::kF32),
               grid + ", no GGUF form (" + why + "): dequantized to F32");
  }
  at::Tensor codes, scales;
  ggml_codes(q, type, &codes, &scales);
  if (rows) codes = rows(codes), scales = rows(scales);
  add(io::encode_gguf_codes(name, codes, scales, type), grid + " (codes kept, scales rounded to fp16)");
}

void Builder::linear(const std::string& base, const nn::LinearImpl& l, const RowMap& rows) {
  QF_REQUIRE(!l.pre_quant_scale().defined(), "gguf export: ", l.path(),
             " has a pre_quant_scale (SmoothQuant, or AWQ where no exact home took its scale), which llama.cpp's "
             "graph has no place for");
  if (l.input_quantizer())
    report.lines.push_back(base + ": input quantizer not carried (llama.cpp quantizes activations its own way)");
  layer(base + ".weight", l, l.frozen() ? at::Tensor() : l.weight, rows);
  const at::Tensor b = l.frozen() ? l.frozen_bias() : l.bias;
  if (b.defined()) vector(base + ".bias", b, rows);
}

void Builder::byte_vocabulary(int64_t vocab_size) {
  std::vector<std::string> tokens = options_.tokens;
  if (tokens.empty()) {
    QF_REQUIRE(vocab_size == 256, "gguf export: vocab_size is ", vocab_size,
               ": pass GgufExportOptions::tokens (qforge writes a tokenizer itself only for the 256-byte vocabulary)");
    for (int b = 0; b < 256; ++b) tokens.push_back(gpt2_byte_token(static_cast<uint8_t>(b)));
  }
  QF_REQUIRE(static_cast<int64_t>(tokens.size()) == vocab_size, "gguf export: ", tokens.size(),
             " tokens for vocab_size ", vocab_size);
  std::vector<GgufValue> strings, types;
  for (const std::string& t : tokens) strings.push_back(GgufValue::str(t)), types.push_back(GgufValue::i32(1));
  // "gpt2" (byte-level BPE) with no merges: every id is one byte token; llama.cpp needs the merges key.
  meta("tokenizer.ggml.model", GgufValue::str("gpt2"));
  meta("tokenizer.ggml.pre", GgufValue::str("default"));
  meta("tokenizer.ggml.tokens", GgufValue::array(GgufValueType::kString, std::move(strings)));
  meta("tokenizer.ggml.token_type", GgufValue::array(GgufValueType::kInt32, std::move(types)));
  meta("tokenizer.ggml.merges", GgufValue::array(GgufValueType::kString, {}));
  u32("tokenizer.ggml.bos_token_id", 0);
  u32("tokenizer.ggml.eos_token_id", 0);
  meta("tokenizer.ggml.add_bos_token", GgufValue::boolean(false));
}

// HF's rotate-half rows of each head -> llama.cpp's interleaved pairs (convert_hf_to_gguf.py's permute).
RowMap rope_permutation(int64_t heads) {
  return [heads](const at::Tensor& t) { return gguf_rope_rows(t, heads, /*to_gguf=*/true); };
}

// "model.layers.3.self_attn.q_proj" -> {"3", "self_attn.q_proj"}: the block number and what follows.
bool split_block(const std::string& path, std::string* block, std::string* rest) {
  static const char* const kBlocks[] = {"model.layers.", "transformer.h."};
  for (const char* prefix : kBlocks) {
    const std::string pre = prefix;
    if (path.compare(0, pre.size(), pre) != 0) continue;
    const std::string tail = path.substr(pre.size());
    const size_t dot = tail.find('.');
    if (dot == std::string::npos || dot == 0 || tail.find_first_not_of("0123456789") != dot) return false;
    *block = tail.substr(0, dot), *rest = tail.substr(dot + 1);
    return true;
  }
  return false;
}

}  // namespace

void check_gguf_exportable(const Gpt2Config& c) {
  QF_REQUIRE(c.activation_function == "gelu_new" || c.activation_function == "gelu_pytorch_tanh",
             "gguf export: activation_function '", c.activation_function, "' (llama.cpp's gpt2 uses tanh GELU)");
}

void check_gguf_exportable(const LlamaConfig& c) {
  QF_REQUIRE(c.model_type == "llama" || c.model_type == "mistral", "gguf export: model_type '", c.model_type,
             "' is not exported (llama and mistral are, as llama.cpp's 'llama' architecture)");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    QF_REQUIRE(c.attention_window(i) == 0, "gguf export: layer ", i, " has a sliding window (",
               c.attention_window(i), "), which llama.cpp's 'llama' architecture does not apply");
  QF_REQUIRE(c.hidden_act == "silu", "gguf export: hidden_act '", c.hidden_act, "' (llama.cpp's llama uses silu)");
  QF_REQUIRE(!c.mlp_bias && !c.qkv_bias() && !c.o_bias(), "gguf export: attention_bias / mlp_bias are not exported");
  QF_REQUIRE(!c.down_proj_hadamard, "gguf export: the model is Hadamard-rotated (down_proj's input is rotated at run time, ",
             "which llama.cpp does not do); export it before ptq.rotate or keep it in qforge's formats");
  QF_REQUIRE(!c.qk_hadamard, "gguf export: the model's queries and keys are Hadamard-rotated after RoPE at run time, ",
             "which llama.cpp does not do; export it before ptq.rotate or keep it in qforge's formats");
  QF_REQUIRE(c.rope_scaling.rope_type == "default" || c.rope_scaling.rope_type == "linear", "gguf export: rope_scaling '",
             c.rope_scaling.rope_type, "' is not exported (default and linear are)");
}

std::string GgufExportReport::str() const {
  std::string s;
  for (const std::string& l : lines) s += l + "\n";
  return s;
}

std::string gpt2_byte_token(uint8_t b) {
  // Printable Latin-1 bytes stand for themselves; the others map to 256, 257, ... in byte order.
  auto printable = [](int c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF); };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int c = 0; c < b; ++c) cp += printable(c) ? 0 : 1;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

io::GgufFile gguf_of(const Gpt2LMHeadModel& model, const GgufExportOptions& options, GgufExportReport* report) {
  const Gpt2Config& c = model->config;
  check_gguf_exportable(c);
  Builder b(options);
  b.meta("general.architecture", GgufValue::str("gpt2"));
  if (!options.name.empty()) b.meta("general.name", GgufValue::str(options.name));
  b.u32("gpt2.context_length", c.n_positions);
  b.u32("gpt2.embedding_length", c.n_embd);
  b.u32("gpt2.feed_forward_length", c.inner());
  b.u32("gpt2.block_count", c.n_layer);
  b.u32("gpt2.attention.head_count", c.n_head);
  b.f32("gpt2.attention.layer_norm_epsilon", c.layer_norm_epsilon);
  b.byte_vocabulary(c.vocab_size);
  const Gpt2ModelImpl& t = *model->transformer;
  b.layer("token_embd.weight", *t.wte, t.wte->weight);
  b.layer("position_embd.weight", *t.wpe, t.wpe->weight);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const auto& blk = *t.h->ptr(i)->as<Gpt2BlockImpl>();
    const std::string p = "blk." + std::to_string(i) + ".";
    b.vector(p + "attn_norm.weight", blk.ln_1->weight), b.vector(p + "attn_norm.bias", blk.ln_1->bias);
    b.linear(p + "attn_qkv", *blk.attn->c_attn);
    b.linear(p + "attn_output", *blk.attn->c_proj);
    b.vector(p + "ffn_norm.weight", blk.ln_2->weight), b.vector(p + "ffn_norm.bias", blk.ln_2->bias);
    b.linear(p + "ffn_up", *blk.mlp->c_fc);
    b.linear(p + "ffn_down", *blk.mlp->c_proj);
  }
  b.vector("output_norm.weight", t.ln_f->weight), b.vector("output_norm.bias", t.ln_f->bias);
  if (model->lm_head) b.linear("output", *model->lm_head);  // tied: llama.cpp reuses token_embd
  if (report) *report = b.report;
  return std::move(b.file);
}

io::GgufFile gguf_of(const LlamaForCausalLM& model, const GgufExportOptions& options, GgufExportReport* report) {
  const LlamaConfig& c = model->config;
  check_gguf_exportable(c);
  Builder b(options);
  b.meta("general.architecture", GgufValue::str("llama"));
  if (!options.name.empty()) b.meta("general.name", GgufValue::str(options.name));
  b.u32("llama.context_length", c.max_position_embeddings);
  b.u32("llama.embedding_length", c.hidden_size);
  b.u32("llama.feed_forward_length", c.intermediate_size);
  b.u32("llama.block_count", c.num_hidden_layers);
  b.u32("llama.attention.head_count", c.num_attention_heads);
  b.u32("llama.attention.head_count_kv", c.kv_heads());
  b.u32("llama.attention.key_length", c.head_size());
  b.u32("llama.attention.value_length", c.head_size());
  b.u32("llama.rope.dimension_count", c.head_size());
  b.f32("llama.rope.freq_base", c.rope_theta);
  if (c.rope_scaling.rope_type == "linear") {
    b.meta("llama.rope.scaling.type", GgufValue::str("linear"));
    b.f32("llama.rope.scaling.factor", c.rope_scaling.factor);
  }
  b.f32("llama.attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  b.u32("llama.vocab_size", c.vocab_size);
  b.byte_vocabulary(c.vocab_size);
  const LlamaModelImpl& m = *model->model;
  b.layer("token_embd.weight", *m.embed_tokens, m.embed_tokens->weight);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const auto& layer = *m.layers->ptr(i)->as<LlamaDecoderLayerImpl>();
    const std::string p = "blk." + std::to_string(i) + ".";
    b.vector(p + "attn_norm.weight", layer.input_layernorm->weight);
    b.linear(p + "attn_q", *layer.self_attn->q_proj, rope_permutation(c.num_attention_heads));
    b.linear(p + "attn_k", *layer.self_attn->k_proj, rope_permutation(c.kv_heads()));
    b.linear(p + "attn_v", *layer.self_attn->v_proj);
    b.linear(p + "attn_output", *layer.self_attn->o_proj);
    b.vector(p + "ffn_norm.weight", layer.post_attention_layernorm->weight);
    b.linear(p + "ffn_gate", *layer.mlp->gate_proj);
    b.linear(p + "ffn_up", *layer.mlp->up_proj);
    b.linear(p + "ffn_down", *layer.mlp->down_proj);
  }
  b.vector("output_norm.weight", m.norm->weight);
  if (model->lm_head) b.linear("output", *model->lm_head);  // tied: llama.cpp reuses token_embd
  if (report) *report = b.report;
  return std::move(b.file);
}

std::string gguf_weight_name(const std::string& module_path) {
  // The per-block Linear names gguf_of uses (a test checks they agree).
  static const std::pair<const char*, const char*> kLinears[] = {
      {"self_attn.q_proj", "attn_q"},  {"self_attn.k_proj", "attn_k"}, {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"}, {"mlp.gate_proj", "ffn_gate"}, {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"},   {"attn.c_attn", "attn_qkv"},  {"attn.c_proj", "attn_output"},
      {"mlp.c_fc", "ffn_up"},          {"mlp.c_proj", "ffn_down"}};
  if (module_path == "lm_head") return "output.weight";
  std::string block, rest;
  if (!split_block(module_path, &block, &rest)) return "";
  for (const auto& [suffix, name] : kLinears)
    if (rest == suffix) return "blk." + block + "." + name + ".weight";
  return "";
}

std::string gguf_tensor_name(const std::string& parameter_path) {
  static const std::pair<const char*, const char*> kModules[] = {
      {"transformer.wte", "token_embd"}, {"transformer.wpe", "position_embd"}, {"transformer.ln_f", "output_norm"},
      {"model.embed_tokens", "token_embd"}, {"model.norm", "output_norm"}};
  static const std::pair<const char*, const char*> kNorms[] = {
      {"ln_1", "attn_norm"}, {"ln_2", "ffn_norm"}, {"input_layernorm", "attn_norm"}, {"post_attention_layernorm", "ffn_norm"}};
  const size_t dot = parameter_path.rfind('.');
  if (dot == std::string::npos) return "";
  const std::string module = parameter_path.substr(0, dot), leaf = parameter_path.substr(dot + 1);
  if (leaf != "weight" && leaf != "bias") return "";
  const std::string linear = gguf_weight_name(module);
  if (!linear.empty()) return linear.substr(0, linear.size() - std::string("weight").size()) + leaf;
  for (const auto& [path, name] : kModules)
    if (module == path) return std::string(name) + "." + leaf;
  std::string block, rest;
  if (split_block(module, &block, &rest))
    for (const auto& [norm, name] : kNorms)
      if (rest == norm) return "blk." + block + "." + name + "." + leaf;
  return "";
}

at::Tensor gguf_rope_rows(const at::Tensor& t, int64_t heads, bool to_gguf) {
  QF_REQUIRE(heads > 0 && t.dim() >= 1 && t.size(0) % (2 * heads) == 0, "gguf: ", t.size(0),
             " rows are not ", heads, " heads of an even size");
  std::vector<int64_t> shape = t.sizes().vec();
  const int64_t half = t.size(0) / heads / 2;
  std::vector<int64_t> split = to_gguf ? std::vector<int64_t>{heads, 2, half} : std::vector<int64_t>{heads, half, 2};
  split.insert(split.end(), shape.begin() + 1, shape.end());
  return t.reshape(split).transpose(1, 2).reshape(shape).contiguous();
}

GgufExportReport export_gguf(const Gpt2LMHeadModel& model, const std::string& path, const GgufExportOptions& options) {
  GgufExportReport report;
  io::write_gguf(path, gguf_of(model, options, &report));
  return report;
}

GgufExportReport export_gguf(const LlamaForCausalLM& model, const std::string& path,
                             const GgufExportOptions& options) {
  GgufExportReport report;
  io::write_gguf(path, gguf_of(model, options, &report));
  return report;
}

}  // namespace qforge::models
