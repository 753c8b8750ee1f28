// The random Llama with planted outlier channels that the PTQ tools measure on (as QuaRot /
// SpinQuant / AWQ describe LLM activations: a few residual-stream channels far larger than the rest,
// and RMSNorm weights that scale a few channels up), text sampled from it, and the perplexity and
// KL divergence of a (quantized) copy on that text. Not a test: tests/ptq's tools include it.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>

#include "framework/models/llama.h"

namespace qforge::ptq::tools {

constexpr int64_t kOutliers = 4;  // planted channels of each kind

inline models::LlamaForCausalLM planted_llama(const models::LlamaConfig& c, double scale) {
  at::manual_seed(0);
  models::LlamaForCausalLM m(c);
  at::NoGradGuard g;
  // Heavier head than HF's init, so the sampled text is far from uniform and errors show.
  m->lm_head->weight.normal_(0.0, 0.08);
  for (int64_t k = 0; k < kOutliers; ++k) {
    m->model->embed_tokens->weight.select(1, 7 + 13 * k).mul_(scale);  // residual-stream channels
    for (const auto& l : *m->model->layers) {
      auto* layer = l->as<models::LlamaDecoderLayerImpl>();
      layer->input_layernorm->weight[3 + 17 * k] = scale / 2;  // normalised-input channels
      layer->post_attention_layernorm->weight[5 + 19 * k] = scale / 2;
    }
  }
  m->eval();
  return m;
}

// `sequences` × `length` tokens sampled from the model, the first token uniform.
inline at::Tensor sample_text(models::LlamaForCausalLM& m, int64_t sequences, int64_t length, uint64_t seed = 1) {
  at::NoGradGuard g;
  at::manual_seed(seed);
  at::Tensor ids = at::randint(0, m->config.vocab_size, {sequences, 1}, at::kLong);
  for (int64_t t = 1; t < length; ++t) {
    const at::Tensor p = at::softmax(m->forward(ids).select(1, -1), -1);
    ids = at::cat({ids, at::multinomial(p, 1)}, 1);
  }
  return ids;
}

struct Eval {
  double perplexity, kl;  // on the text; KL(float || model) per token, nats
};

// float_logp: the float model's log-probabilities of the next token on ids, [B, T − 1, vocab].
inline Eval evaluate(models::LlamaForCausalLM& m, const at::Tensor& ids, const at::Tensor& float_logp) {
  at::NoGradGuard g;
  const at::Tensor logp = at::log_softmax(m->forward(ids).narrow(1, 0, ids.size(1) - 1), -1);
  const at::Tensor target = ids.narrow(1, 1, ids.size(1) - 1).unsqueeze(-1);
  const double nll = -logp.gather(-1, target).mean().item<double>();
  const double kl = (float_logp.exp() * (float_logp - logp)).sum(-1).mean().item<double>();
  return {std::exp(nll), kl};
}

}  // namespace qforge::ptq::tools
