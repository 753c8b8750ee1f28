// Tied and untied LM heads (see hf_lm_head.h).
#include "framework/models/hf_lm_head.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"

namespace qforge::models {

nn::Linear untied_lm_head(const nn::EmbeddingImpl& table, const std::string& who) {
  QF_REQUIRE(!table.quantized() && table.weight.defined(), who, ": untie_lm_head() before quantize(): the head "
             "copies the token embedding's float table");
  const int64_t vocab = table.options.num_embeddings(), dim = table.options.embedding_dim();
  nn::Linear head(torch::nn::LinearOptions(dim, vocab).bias(false));
  {
    at::NoGradGuard g;
    head->weight.copy_(table.weight.detach());
  }
  head->to(table.weight.device());
  return head;
}

at::Tensor lm_head_logits(const at::Tensor& h, nn::Linear head, const nn::EmbeddingImpl& table,
                          const std::string& who, const std::string& table_name) {
  if (head) return head->forward(h);
  QF_REQUIRE(table.weight.defined(), who, ": the LM head is tied to ", table_name, ", whose float table is gone "
             "(frozen); keep ", table_name, " float, or untie_lm_head() before quantize()");
  return at::linear(h, table.weight);
}

void drop_tied_lm_head(StateDict& state, const std::string& table_key, const std::string& who,
                       const std::string& source) {
  const auto it = state.find("lm_head.weight");
  if (it == state.end()) return;
  const auto table = state.find(table_key);
  QF_REQUIRE(table != state.end() && table->second.sizes() == it->second.sizes() && at::equal(table->second, it->second),
             who, ": ", source, " has an lm_head.weight that differs from ", table_key, "; the config ties them "
             "(tie_word_embeddings), so the head cannot be loaded");
  state.erase(it);
}

}  // namespace qforge::models
