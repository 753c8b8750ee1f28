// The LM head of an HF causal LM (GPT-2, Llama): tied to the token embedding's table
// (tie_word_embeddings) or a Linear of its own that quantize() treats like any other layer.
#pragma once

#include <string>

#include "framework/models/state_dict.h"
#include "framework/nn/embedding.h"
#include "framework/nn/linear.h"

namespace qforge::models {

// A bias-free Linear holding a copy of the embedding's float table: logits stay bit for bit the
// same, and the head can be quantized apart from the embedding. Before quantize() only; `who`
// ("models/llama") starts the messages.
nn::Linear untied_lm_head(const nn::EmbeddingImpl& table, const std::string& who);

// Logits of the last hidden state h: `head` when untied (defined), else the embedding's table.
at::Tensor lm_head_logits(const at::Tensor& h, nn::Linear head, const nn::EmbeddingImpl& table,
                          const std::string& who, const std::string& table_name);

// A tied model's checkpoint may carry the head too (HF saves it for some models): it must equal
// the table, and is dropped. Refuses a differing head, naming `source`.
void drop_tied_lm_head(StateDict& state, const std::string& table_key, const std::string& who,
                       const std::string& source);

}  // namespace qforge::models
