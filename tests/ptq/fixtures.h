// What the AWQ and AutoRound tests share: a small Llama (2 blocks, hidden 64) whose RMSNorm weights
// carry planted outlier channels (as LLM hidden states have), token batches for it, integer specs.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "framework/core/qparams.h"
#include "framework/models/llama.h"

namespace qforge::ptq::testing {

inline models::LlamaForCausalLM outlier_llama(int64_t kv_heads) {
  models::LlamaConfig c;
  c.vocab_size = 128, c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = kv_heads, c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5, c.tie_word_embeddings = false;
  at::manual_seed(7);
  models::LlamaForCausalLM m(c);
  m->init_weights();
  at::NoGradGuard g;
  m->model->embed_tokens->weight.mul_(20);  // hidden states large enough for the int4 error to show in the logits
  for (const auto& l : *m->model->layers) {
    auto* d = l->as<models::LlamaDecoderLayerImpl>();
    d->input_layernorm->weight.index_put_({3}, 25.0);
    d->post_attention_layernorm->weight.index_put_({11}, 25.0);
  }
  m->model->norm->weight.index_put_({17}, 25.0);
  m->eval();
  return m;
}

// n batches of [2, 32] token ids below vocab.
inline std::vector<at::Tensor> token_batches(int64_t n, int64_t vocab, uint64_t seed) {
  at::manual_seed(seed);
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(at::randint(vocab, {2, 32}, at::kLong));
  return out;
}

// Weights on q, per output row (group 0) or per group of `group` columns.
inline QSpec int_group_spec(QType q, int64_t group, bool symmetric = false) {
  QSpec s;
  s.qtype = q;
  s.granularity = group > 0 ? Granularity::kPerGroup : Granularity::kPerChannel;
  s.axis = 0;
  s.group_size = group;
  s.symmetric = symmetric;
  return s;
}

}  // namespace qforge::ptq::testing
