// The small Llama (grouped-query: 4 query / 2 key-value heads of 16) and GPT-2 the KV-cache tests
// decode with (kv_cache_quant_test.cpp, kv_cache_codes_attention_test.cpp).
#pragma once

#include "framework/models/gpt2.h"
#include "framework/models/llama.h"

namespace qforge::models {

inline LlamaConfig kv_test_llama() {
  LlamaConfig c;
  c.vocab_size = 61, c.hidden_size = 64, c.intermediate_size = 96, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 64;
  return c;
}

inline Gpt2Config kv_test_gpt2() {
  Gpt2Config c;
  c.vocab_size = 53, c.n_positions = 32, c.n_embd = 32, c.n_layer = 2, c.n_head = 4;
  return c;
}

}  // namespace qforge::models
