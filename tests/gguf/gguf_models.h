// The tiny GPT-2 and Llama the GGUF tests export (256-byte vocabulary, rows multiples of 32).
#pragma once

#include <ATen/ATen.h>

#include "framework/api/scheme.h"
#include "framework/models/gpt2.h"
#include "framework/models/llama.h"

namespace qforge::models {

inline Gpt2LMHeadModel tiny_gguf_gpt2(uint64_t seed = 11) {
  Gpt2Config c;
  c.vocab_size = 256, c.n_positions = 64, c.n_embd = 64, c.n_layer = 2, c.n_head = 4;
  at::manual_seed(seed);
  Gpt2LMHeadModel m(c);
  m->init_weights();
  m->eval();
  return m;
}

// Grouped-query attention 4 / 2, head_dim 16, untied head unless `tied`.
inline LlamaForCausalLM tiny_gguf_llama(uint64_t seed = 12, bool tied = false) {
  LlamaConfig c;
  c.vocab_size = 256, c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 128;
  c.rms_norm_eps = 1e-5, c.tie_word_embeddings = tied;
  at::manual_seed(seed);
  LlamaForCausalLM m(c);
  m->init_weights();
  m->eval();
  return m;
}

inline Scheme w4_g32_scheme() {
  Scheme s(qint4);
  s.weight_granularity = Granularity::kPerGroup;
  s.group_size = 32;
  return s;
}

}  // namespace qforge::models
