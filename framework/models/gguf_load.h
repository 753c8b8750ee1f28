// GGUF load: a qforge GPT-2 or Llama built from a GGUF file of llama.cpp's `gpt2` / `llama`
// architecture (what gguf_export.h writes, or a file written by llama.cpp's tools within the same
// limits). docs/formats.md, "GGUF", states the rules:
//   - the config comes from the metadata (block count, embedding and feed-forward lengths, head
//     counts, key length, RoPE base and linear scaling, norm epsilon), checked against every
//     tensor's shape; the vocabulary size is token_embd's row count;
//   - F32 / F16 tensors become float weights;
//   - Q6_K and Q4_K matrices become float weights of their decoded values (qforge has no 6-bit
//     grid, and its int4 groups have no 6-bit sub-block scales and mins);
//   - Q8_0 / Q4_0 matrices become frozen qint8 / qint4 layers, per group of 32, symmetric, the
//     file's codes kept and its fp16 block scales taken as they are (no requantization), set to
//     decode with block-32 int8 activations (DecodeActivations::kQ8Block32), llama.cpp's numerics
//     for these types; nn::set_decode_activations(model, DecodeActivations::kExact) for float ones;
//   - Llama's q/k rows go back from llama.cpp's interleaved RoPE pairs to rotate-half order;
//   - no `output` tensor: the head is tied to token_embd (untied with the same codes when
//     token_embd is quantized, as llama.cpp computes the logits with it).
// Anything else is a qforge::Error naming it: other architectures or ggml types, a missing,
// misshapen, extra or non-finite tensor, metadata the model cannot express (RoPE scaling other
// than linear, partial rotary dimensions, experts). The file is read through read_gguf (every
// count, length and offset bounds-checked) and the model is built only after the checks: a failed
// load returns nothing.
#pragma once

#include <string>
#include <vector>

#include "framework/format/gguf.h"
#include "framework/models/gpt2.h"
#include "framework/models/llama.h"

namespace qforge::models {

struct GgufModel {
  std::string architecture;        // "gpt2" or "llama": which of the two below is set
  Gpt2LMHeadModel gpt2{nullptr};
  LlamaForCausalLM llama{nullptr};
  std::vector<std::string> tokens;  // tokenizer.ggml.tokens (empty when the file has none)
  // One line per tensor: "blk.0.attn_q.weight Q4_0 -> model.layers.0.self_attn.q_proj.weight (frozen ...)".
  std::vector<std::string> lines;
};

// The model of a GGUF file (eval mode). `source` names the file in errors.
GgufModel model_of_gguf(const io::GgufFile& file, const std::string& source);
GgufModel load_gguf(const std::string& path);

}  // namespace qforge::models
