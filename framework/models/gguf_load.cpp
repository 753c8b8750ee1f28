#include "framework/models/gguf_load.h"

#include <ATen/ATen.h>

#include <cmath>
#include <functional>
#include <set>

#include "framework/api/kernel_plan.h"
#include "framework/api/quantized_tensor.h"
#include "framework/core/error.h"
#include "framework/format/gguf_blocks.h"
#include "framework/models/gguf_export.h"
#include "framework/nn/linear.h"

namespace qforge::models {
namespace {

using io::GgmlType;
using io::GgufTensor;

// Bounds that keep crafted metadata from asking for absurd models before the tensors are checked.
constexpr int64_t kMaxWidth = int64_t{1} << 20;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxContext = int64_t{1} << 24;

// The architecture's metadata, every read naming the file and the key.
class Meta {
 public:
  Meta(const io::GgufFile& f, std::string source, std::string arch)
      : f_(f), source_(std::move(source)), arch_(std::move(arch)) {}
  const io::GgufValue* find(const std::string& k) const { return f_.find(arch_ + "." + k); }
  std::string key(const std::string& k) const { return arch_ + "." + k; }
  int64_t count(const std::string& k, int64_t max) const {
    const io::GgufValue* v = find(k);
    QF_REQUIRE(v, "gguf load: ", source_, ": metadata '", key(k), "' is missing (llama.cpp's ", arch_, " needs it)");
    return checked(k, v->as_int(key(k)), max);
  }
  int64_t count_or(const std::string& k, int64_t fallback, int64_t max) const {
    const io::GgufValue* v = find(k);
    return v ? checked(k, v->as_int(key(k)), max) : fallback;
  }
  double real_or(const std::string& k, double fallback, bool required = false) const {
    const io::GgufValue* v = find(k);
    QF_REQUIRE(v || !required, "gguf load: ", source_, ": metadata '", key(k), "' is missing");
    const double x = v ? v->as_float(key(k)) : fallback;
    QF_REQUIRE(std::isfinite(x) && x > 0, "gguf load: ", source_, ": ", key(k), " = ", x, " (a positive number expected)");
    return x;
  }
  const std::string& source() const { return source_; }

 private:
  int64_t checked(const std::string& k, int64_t v, int64_t max) const {
    QF_REQUIRE(v >= 1 && v <= max, "gguf load: ", source_, ": ", key(k), " = ", v, " (1 to ", max, " expected)");
    return v;
  }
  const io::GgufFile& f_;
  std::string source_, arch_;
};

// Rows of token_embd: the vocabulary size (its ne[1]).
int64_t vocab_rows(const io::GgufFile& f, const std::string& source) {
  const GgufTensor* t = f.tensor("token_embd.weight");
  QF_REQUIRE(t, "gguf load: ", source, ": tensor 'token_embd.weight' is missing");
  QF_REQUIRE(t->ne.size() == 2 && t->ne[1] >= 1 && t->ne[1] <= static_cast<uint64_t>(kMaxWidth) * 16, "gguf load: ",
             source, ": token_embd.weight must be [vocab, embedding] with a vocabulary of 1 to ", kMaxWidth * 16);
  return static_cast<int64_t>(t->ne[1]);
}

bool quantized(const GgufTensor* t) { return t && t->type != GgmlType::kF32 && t->type != GgmlType::kF16; }

// The head: an `output` tensor unties it; without one llama.cpp uses token_embd, which qforge's
// tied head does too unless token_embd is quantized (then lm_head gets the same codes).
bool tied_head(const io::GgufFile& f) { return !f.tensor("output.weight") && !quantized(f.tensor("token_embd.weight")); }

// The sizes both architectures' metadata give, in llama.cpp's names.
struct Sizes {
  int64_t vocab, context, width, feed_forward, blocks, heads;
};
Sizes sizes_of(const io::GgufFile& f, const Meta& m) {
  return {vocab_rows(f, m.source()),
          m.count("context_length", kMaxContext),
          m.count("embedding_length", kMaxWidth),
          m.count("feed_forward_length", kMaxWidth * 8),
          m.count("block_count", kMaxLayers),
          m.count("attention.head_count", kMaxWidth)};
}

Gpt2Config gpt2_config(const io::GgufFile& f, const Meta& m) {
  Gpt2Config c;
  const Sizes s = sizes_of(f, m);
  c.vocab_size = s.vocab, c.n_positions = s.context, c.n_embd = s.width, c.n_inner = s.feed_forward;
  c.n_layer = s.blocks, c.n_head = s.heads;
  QF_REQUIRE(m.count_or("attention.head_count_kv", c.n_head, kMaxWidth) == c.n_head, "gguf load: ", m.source(),
             ": gpt2.attention.head_count_kv differs from head_count (GPT-2 has no grouped-query attention)");
  QF_REQUIRE(c.n_embd % c.n_head == 0, "gguf load: ", m.source(), ": embedding_length ", c.n_embd,
             " is not a multiple of head_count ", c.n_head);
  c.layer_norm_epsilon = m.real_or("attention.layer_norm_epsilon", 0, /*required=*/true);
  c.tie_word_embeddings = tied_head(f);
  return c;
}

// RoPE scaling as llama.cpp reads it (llama_model::load_hparams): a missing type is "linear", the
// factor falls back to the older rope.scale_linear key, 0 or none means unscaled, and attn_factor
// multiplies the attention; what qforge's Llama cannot compute the same way is refused.
void rope_scaling(const Meta& m, LlamaConfig* c) {
  const io::GgufValue* t = m.find("rope.scaling.type");
  const std::string type = t ? t->as_string(m.key("rope.scaling.type")) : "linear";
  QF_REQUIRE(type == "none" || type == "linear", "gguf load: ", m.source(), ": llama.rope.scaling.type '", type,
             "' is not loaded (none and linear are)");
  const std::string key = m.find("rope.scaling.factor") ? "rope.scaling.factor" : "rope.scale_linear";
  const io::GgufValue* f = m.find(key);
  const double factor = f ? f->as_float(m.key(key)) : 0.0;
  QF_REQUIRE(std::isfinite(factor) && factor >= 0, "gguf load: ", m.source(), ": ", m.key(key), " = ", factor,
             " (0 or a positive number expected)");
  QF_REQUIRE(type == "linear" || factor == 0 || factor == 1, "gguf load: ", m.source(), ": ", m.key(key), " = ",
             factor, " with rope.scaling.type 'none' (llama.cpp would still scale the positions; not loaded)");
  if (const io::GgufValue* a = m.find("rope.scaling.attn_factor")) {
    const double attn = a->as_float(m.key("rope.scaling.attn_factor"));
    QF_REQUIRE(attn == 1, "gguf load: ", m.source(), ": llama.rope.scaling.attn_factor = ", attn,
               " (qforge's Llama has no attention factor; only 1 is loaded)");
  }
  if (type == "linear" && factor != 0) c->rope_scaling.rope_type = "linear", c->rope_scaling.factor = factor;
}

// The <arch>.* keys the loader reads or knows to change nothing; any other is refused rather than
// ignored, since llama.cpp may compute differently with it.
void require_known_keys(const io::GgufFile& f, const std::string& arch, const std::string& source) {
  static const std::set<std::string> kKnown = {
      "context_length", "embedding_length", "feed_forward_length", "block_count", "attention.head_count",
      "attention.head_count_kv", "attention.key_length", "attention.value_length", "attention.layer_norm_epsilon",
      "attention.layer_norm_rms_epsilon", "rope.dimension_count", "rope.freq_base", "rope.scaling.type",
      "rope.scaling.factor", "rope.scale_linear", "rope.scaling.attn_factor", "rope.scaling.original_context_length",
      "rope.scaling.finetuned", "vocab_size", "expert_count", "expert_used_count"};
  const std::string prefix = arch + ".";
  for (const auto& kv : f.metadata)
    if (kv.first.compare(0, prefix.size(), prefix) == 0)
      QF_REQUIRE(kKnown.count(kv.first.substr(prefix.size())), "gguf load: ", source, ": metadata '", kv.first,
                 "' is not read by qforge's loader (refused rather than ignored: llama.cpp may use it)");
}

LlamaConfig llama_config(const io::GgufFile& f, const Meta& m) {
  LlamaConfig c;
  const Sizes s = sizes_of(f, m);
  c.vocab_size = s.vocab, c.max_position_embeddings = s.context, c.hidden_size = s.width;
  c.intermediate_size = s.feed_forward, c.num_hidden_layers = s.blocks, c.num_attention_heads = s.heads;
  c.num_key_value_heads = m.count_or("attention.head_count_kv", c.num_attention_heads, kMaxWidth);
  QF_REQUIRE(c.num_attention_heads % c.num_key_value_heads == 0, "gguf load: ", m.source(), ": head_count ",
             c.num_attention_heads, " is not a multiple of head_count_kv ", c.num_key_value_heads);
  const int64_t head = m.count_or("attention.key_length", c.hidden_size / c.num_attention_heads, kMaxWidth);
  QF_REQUIRE(m.count_or("attention.value_length", head, kMaxWidth) == head, "gguf load: ", m.source(),
             ": llama.attention.value_length differs from key_length (qforge's Llama has one head size)");
  QF_REQUIRE(m.count_or("rope.dimension_count", head, kMaxWidth) == head, "gguf load: ", m.source(),
             ": llama.rope.dimension_count differs from the head size ", head, " (partial rotary is not supported)");
  if (head * c.num_attention_heads != c.hidden_size) c.head_dim = head;
  if (const io::GgufValue* e = m.find("expert_count"))
    QF_REQUIRE(e->as_int(m.key("expert_count")) <= 1, "gguf load: ", m.source(), ": llama.expert_count ",
               e->as_int(m.key("expert_count")), ": mixture-of-experts models are not loaded");
  c.rope_theta = m.real_or("rope.freq_base", 10000.0);
  c.rms_norm_eps = m.real_or("attention.layer_norm_rms_epsilon", 0, /*required=*/true);
  rope_scaling(m, &c);
  if (const io::GgufValue* v = m.find("vocab_size"))
    QF_REQUIRE(v->as_int(m.key("vocab_size")) == c.vocab_size, "gguf load: ", m.source(), ": llama.vocab_size ",
               v->as_int(m.key("vocab_size")), " differs from token_embd's ", c.vocab_size, " rows");
  c.tie_word_embeddings = tied_head(f);
  c.validate();
  return c;
}

// The model's parameter count against the file's elements: a config far beyond what the tensors
// can fill is refused before it is allocated (within 2x, the per-tensor checks name what is missing).
void require_elements(const io::GgufFile& f, double parameters, const std::string& source) {
  auto count = [](const GgufTensor& t) {
    double n = 1;
    for (uint64_t d : t.ne) n *= static_cast<double>(d);
    return n;
  };
  double elements = 0;
  for (const GgufTensor& t : f.tensors) elements += count(t);
  // An untied lm_head made from a tied file's quantized token_embd holds a second copy of it.
  if (!f.tensor("output.weight") && !tied_head(f)) elements += count(*f.tensor("token_embd.weight"));
  QF_REQUIRE(parameters <= 2 * elements + (1 << 20), "gguf load: ", source, ": the metadata describes a model of ", parameters,
             " parameters, the file's tensors hold ", elements, " values");
}

// qforge's grids have positive scales. A block with d = 0 zeroes its codes and takes d = 1. A block
// with d < 0 (ggml's Q4_0 quantizer divides by -8, so most blocks of llama.cpp's Q4_0 files) keeps its
// bits: code c becomes -c - 1 (a bijection of [-8, 7] and of [-128, 127]) with zero point -1 and scale
// |d|, (-c - 1 + 1) * |d| = c * d exactly. `zeros` is defined only when a zero point is -1.
const QType* positive_scales(GgmlType type, at::Tensor* codes, at::Tensor* scales, at::Tensor* zeros) {
  const at::Tensor zero = scales->eq(0), negative = scales->lt(0);
  auto per_element = [](const at::Tensor& blocks) { return blocks.repeat_interleave(io::kGgmlBlock, 1); };
  if (zero.any().item<bool>()) *codes = codes->masked_fill(per_element(zero), 0), *scales = scales->masked_fill(zero, 1.0);
  const QType* grid = type == GgmlType::kQ8_0 ? &qint8 : &qint4;
  if (!negative.any().item<bool>()) return grid;
  *scales = scales->abs();
  *codes = at::where(per_element(negative), codes->bitwise_not(), *codes);  // ~c = -c - 1, no int8 overflow
  *zeros = negative.to(at::kInt).neg();
  return grid;
}

// llama.cpp multiplies Q8_0 / Q4_0 weights by activations quantized to Q8_0 blocks (its vec_dot_type):
// a Linear loaded from those codes decodes the same way where a q8 kernel serves `spec` (true then).
bool decodes_as_llamacpp(const QuantizableLayer& layer, const QSpec& spec) {
  const auto* lin = dynamic_cast<const nn::LinearImpl*>(&layer);
  return lin && plan_linear(spec, ActivationMode::kNone, QSpec{}, lin->options.in_features(), usable_isa(),
                            DecodeActivations::kQ8Block32).decode_q8;
}

// The scheme of a frozen layer per group of 32 on `grid`; `note` says how its activations decode.
LayerScheme gguf_scheme(const QType& grid, bool symmetric, const std::string& note) {
  QSpec spec;
  spec.qtype = grid;
  spec.granularity = Granularity::kPerGroup;
  spec.group_size = io::kGgmlBlock;
  spec.symmetric = symmetric;
  LayerScheme scheme;
  scheme.weights = QuantizerConfig();
  scheme.weights->spec = spec;
  scheme.note = note;
  return scheme;
}

// A frozen qint8 / qint4 layer per group of 32 from a Q8_0 / Q4_0 matrix, the file's codes and fp16
// scales kept (up to positive_scales); returns the report's words.
std::string install_codes(QuantizableLayer& layer, const std::string& path, const GgufTensor& t, int64_t rope_heads) {
  at::Tensor codes, scales, zeros;
  io::decode_gguf_codes(t, &codes, &scales);
  QF_REQUIRE(at::isfinite(scales).all().item<bool>(), "gguf load: tensor '", t.name, "' has a NaN or inf block scale");
  if (rope_heads > 0) codes = gguf_rope_rows(codes, rope_heads, false), scales = gguf_rope_rows(scales, rope_heads, false);
  const QType* grid = positive_scales(t.type, &codes, &scales, &zeros);
  const bool symmetric = !zeros.defined();
  const std::string kept = std::string("GGUF ") + io::ggml_type_name(t.type) + ": the file's codes and fp16 block scales";
  const bool q8 = decodes_as_llamacpp(layer, gguf_scheme(*grid, symmetric, "").weights->spec);
  const LayerScheme scheme = gguf_scheme(*grid, symmetric, kept + (q8 ? "; decode activations q8_block32 by default, as "
                                                                       "llama.cpp runs this file"
                                                                     : "; exact: no integer kernel for this grid yet"));
  layer.attach(path, scheme);
  QParams qp;
  qp.spec = scheme.weights->spec;
  qp.scale = scales;
  qp.zero_point = symmetric ? at::zeros(scales.sizes(), at::kInt) : zeros;
  layer.install_frozen(pack_quantized(codes, qp));
  if (q8) dynamic_cast<nn::LinearImpl&>(layer).set_decode_activations(DecodeActivations::kQ8Block32);
  const std::string words = std::string("frozen ") + grid->name + " per_group(32), ";
  if (!symmetric) return words + "negative block scales kept as |d| with codes -c - 1 and zero point -1";
  return words + "codes and fp16 scales kept";
}

// Why a tensor without kept codes is float: its report words.
std::string float_words(GgmlType type) {
  if (type == GgmlType::kQ6_K) return " (float: dequantized, qforge has no 6-bit grid)";
  if (type == GgmlType::kQ4_K)
    return " (float: dequantized, qforge's int4 groups have no 6-bit sub-block scales and mins)";
  return " (float)";
}

// Which tensor fills `parameter`: its GGUF name, or token_embd for an untied head the file ties.
const GgufTensor* tensor_for(const io::GgufFile& f, const std::string& parameter, const std::string& source) {
  const std::string name = gguf_tensor_name(parameter);
  QF_CHECK(!name.empty(), "no GGUF name for parameter ", parameter);
  const GgufTensor* t = f.tensor(name);
  if (!t && name == "output.weight") t = f.tensor("token_embd.weight");
  QF_REQUIRE(t, "gguf load: ", source, ": tensor '", name, "' is missing (qforge's ", parameter, ")");
  return t;
}

// Fills every parameter of `model` from the file (float tensors first, then the frozen layers, whose
// packing takes the bias already in place); `rope_heads` gives the heads of a q/k weight (else 0).
void fill(torch::nn::Module& model, const io::GgufFile& f, const std::string& source,
          const std::function<int64_t(const std::string&)>& rope_heads, std::vector<std::string>* lines) {
  at::NoGradGuard ng;
  std::set<std::string> used;
  std::vector<std::pair<std::string, const GgufTensor*>> frozen;
  for (auto& p : model.named_parameters()) {
    const GgufTensor* t = tensor_for(f, p.key(), source);
    used.insert(t->name);
    const std::vector<int64_t> shape(t->ne.rbegin(), t->ne.rend());
    QF_REQUIRE(p.value().sizes() == at::IntArrayRef(shape), "gguf load: ", source, ": tensor '", t->name, "' is ",
               at::IntArrayRef(shape), ", qforge's ", p.key(), " is ", p.value().sizes());
    QF_REQUIRE(!quantized(t) || p.value().dim() == 2, "gguf load: ", source, ": tensor '", t->name, "' is ",
               io::ggml_type_name(t->type), "; vectors are read as F32 / F16 only");
    // Quantized tensors too: a layer whose codes no qforge grid holds stays float with these values.
    at::Tensor v = io::decode_gguf_tensor(*t);
    QF_REQUIRE(at::isfinite(v).all().item<bool>(), "gguf load: ", source, ": tensor '", t->name, "' holds NaN or inf");
    if (const int64_t heads = rope_heads(p.key())) v = gguf_rope_rows(v, heads, false);
    p.value().copy_(v);
    const bool codes = t->type == GgmlType::kQ8_0 || t->type == GgmlType::kQ4_0;
    if (codes) frozen.emplace_back(p.key(), t);
    else lines->push_back(t->name + " " + io::ggml_type_name(t->type) + " -> " + p.key() + float_words(t->type));
  }
  for (const GgufTensor& t : f.tensors)
    QF_REQUIRE(used.count(t.name), "gguf load: ", source, ": tensor '", t.name, "' is not part of qforge's model ",
               "of this architecture and config (not loaded rather than ignored)");
  auto modules = model.named_modules("", /*include_self=*/false);
  for (const auto& [parameter, t] : frozen) {
    const std::string path = parameter.substr(0, parameter.rfind('.'));
    auto* layer = dynamic_cast<QuantizableLayer*>(modules[path].get());
    QF_CHECK(layer, path, " is not a qforge layer");
    const std::string words = install_codes(*layer, path, *t, rope_heads(parameter));
    lines->push_back(t->name + " " + io::ggml_type_name(t->type) + " -> " + parameter + " (" + words + ")");
  }
}

std::vector<std::string> tokens_of(const io::GgufFile& f, int64_t vocab, const std::string& source) {
  std::vector<std::string> out;
  const io::GgufValue* v = f.find("tokenizer.ggml.tokens");
  if (!v) return out;
  for (const io::GgufValue& t : v->as_array("tokenizer.ggml.tokens")) out.push_back(t.as_string("tokenizer.ggml.tokens"));
  QF_REQUIRE(static_cast<int64_t>(out.size()) == vocab, "gguf load: ", source, ": tokenizer.ggml.tokens has ",
             out.size(), " tokens, token_embd has ", vocab, " rows");
  return out;
}

}  // namespace

GgufModel model_of_gguf(const io::GgufFile& file, const std::string& source) {
  GgufModel out;
  const io::GgufValue* arch = file.find("general.architecture");
  QF_REQUIRE(arch, "gguf load: ", source, ": metadata 'general.architecture' is missing");
  out.architecture = arch->as_string("general.architecture");
  QF_REQUIRE(out.architecture == "gpt2" || out.architecture == "llama", "gguf load: ", source, ": architecture '",
             out.architecture, "' is not loaded (gpt2 and llama are)");
  const Meta meta(file, source, out.architecture);
  require_known_keys(file, out.architecture, source);
  RngStateGuard rng;  // construction initialises weights the file then overwrites
  if (out.architecture == "gpt2") {
    const Gpt2Config c = gpt2_config(file, meta);
    out.tokens = tokens_of(file, c.vocab_size, source);
    require_elements(file, c.parameter_count(), source);
    Gpt2LMHeadModel m(c);
    fill(*m, file, source, [](const std::string&) { return int64_t{0}; }, &out.lines);
    m->eval();
    out.gpt2 = m;
  } else {
    const LlamaConfig c = llama_config(file, meta);
    out.tokens = tokens_of(file, c.vocab_size, source);
    require_elements(file, c.parameter_count(), source);
    LlamaForCausalLM m(c);
    auto heads = [&c](const std::string& p) -> int64_t {
      auto ends = [&p](const std::string& s) { return p.size() >= s.size() && p.compare(p.size() - s.size(), s.size(), s) == 0; };
      return ends("self_attn.q_proj.weight") ? c.num_attention_heads : ends("self_attn.k_proj.weight") ? c.kv_heads() : 0;
    };
    fill(*m, file, source, heads, &out.lines);
    m->eval();
    out.llama = m;
  }
  return out;
}

GgufModel load_gguf(const std::string& path) { return model_of_gguf(io::read_gguf(path), path); }

}  // namespace qforge::models
