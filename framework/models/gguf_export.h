// GGUF export of qforge's GPT-2 and Llama models (float or frozen) for llama.cpp: its architecture
// metadata (general.architecture gpt2 / llama), its tensor names (token_embd, blk.N.attn_q, ...,
// output_norm, output) and the byte vocabulary as a "gpt2" tokenizer. docs/formats.md, "GGUF",
// states the type rule per tensor:
//   - 1-D tensors (norms, biases): F32;
//   - float matrices: options.float_type (F32, F16, Q8_0 or Q4_0 by ggml's own quantizers, Q4_K and
//     Q6_K by qforge's quantizers of the formats, gguf_blocks.h);
//   - frozen matrices keep their integer codes where ggml has the grid: symmetric qint8 (per
//     tensor, per output channel or per group of a multiple of 32) -> Q8_0, symmetric qint4 the
//     same way -> Q4_0; only the scales change, rounded to fp16 (relative <= 2^-11);
//   - any other frozen grid (zero points, float8, codebooks, groups not a multiple of 32) is
//     stored dequantized at F32, named in the report, or refused with options.refuse_wider.
// Llama's q/k rows are permuted from HF's rotate-half order to llama.cpp's interleaved RoPE pairs,
// as convert_hf_to_gguf.py does.
#pragma once

#include <string>
#include <vector>

#include "framework/format/gguf.h"
#include "framework/models/gpt2.h"
#include "framework/models/llama.h"

namespace qforge::models {

struct GgufExportOptions {
  io::GgmlType float_type = io::GgmlType::kF32;  // for float matrices
  bool refuse_wider = false;  // throw instead of storing a frozen grid without a GGUF form at F32
  std::string name;           // general.name (empty: not written)
  // Token strings, one per id. Empty: a 256-entry vocabulary is written as bytes (GPT-2's
  // byte-to-unicode map); any other vocab_size without tokens is refused.
  std::vector<std::string> tokens;
};

// One line per tensor: "blk.0.attn_q.weight Q8_0 <- frozen qint8 ... (codes kept, fp16 scales)".
struct GgufExportReport {
  std::vector<std::string> lines;
  std::string str() const;
};

// The GGUF file of a model, in memory. Throws qforge::Error naming the layer or config key for
// what llama.cpp's architecture cannot express (Llama: sliding windows, qwen2, llama3 RoPE
// scaling, MLP biases, activations other than silu; both: quantized layers not frozen, SmoothQuant
// pre_quant_scale). The model is not changed.
io::GgufFile gguf_of(const Gpt2LMHeadModel& model, const GgufExportOptions& options = {},
                     GgufExportReport* report = nullptr);
io::GgufFile gguf_of(const LlamaForCausalLM& model, const GgufExportOptions& options = {},
                     GgufExportReport* report = nullptr);

// The config checks gguf_of runs first, on a config alone (a recipe's, before any training).
void check_gguf_exportable(const Gpt2Config& config);
void check_gguf_exportable(const LlamaConfig& config);

// gguf_of, written through an AtomicFile (a failed export leaves an existing file intact).
GgufExportReport export_gguf(const Gpt2LMHeadModel& model, const std::string& path,
                             const GgufExportOptions& options = {});
GgufExportReport export_gguf(const LlamaForCausalLM& model, const std::string& path,
                             const GgufExportOptions& options = {});

// The GGUF name of the weight of the Linear at `module_path` in a qforge GPT-2 or Llama
// ("model.layers.3.mlp.down_proj" -> "blk.3.ffn_down.weight", "lm_head" -> "output.weight"), as
// gguf_of writes it; empty for paths it has no name for.
std::string gguf_weight_name(const std::string& module_path);

// The GGUF name of a GPT-2 or Llama parameter ("transformer.h.0.ln_1.bias" -> "blk.0.attn_norm.bias",
// "model.embed_tokens.weight" -> "token_embd.weight"), as gguf_of writes it; empty for others.
std::string gguf_tensor_name(const std::string& parameter_path);

// Llama's q/k rows of each of `heads` heads between HF's rotate-half order and llama.cpp's
// interleaved RoPE pairs (to_gguf: row 2i + j of the result = row j * d/2 + i of `t`; false: the
// inverse). Any tensor whose dim 0 is the rows (weights, codes, per-row or per-block scales).
at::Tensor gguf_rope_rows(const at::Tensor& t, int64_t heads, bool to_gguf);

// GPT-2's byte-to-unicode map: the UTF-8 string that stands for byte b in byte-level BPE vocabularies.
std::string gpt2_byte_token(uint8_t b);

}  // namespace qforge::models
