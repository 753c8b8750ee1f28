// What the AWQ, AutoRound and BRECQ tests share: a small Llama (2 blocks, hidden 64) whose RMSNorm
// weights carry planted outlier channels (as LLM hidden states have), token batches for it, integer
// specs, and the blocks' output error after a solver.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fake_quant/fake_quantize.h"
#include "framework/api/quantize.h"
#include "framework/core/qparams.h"
#include "framework/models/llama.h"
#include "framework/nn/linear.h"
#include "framework/ptq/ptq.h"

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

// Only the blocks' Linears are quantized, so the error below is theirs.
inline Scheme blocks_only(QType q, const std::vector<std::string>& keep_float) {
  Scheme s(q);
  s.weight_granularity = Granularity::kPerGroup;
  s.group_size = 32;
  s.weight_symmetric = false;
  for (const std::string& p : keep_float) s.rules.push_back(LayerRule{p, true});
  return s;
}

// Quantizes a fresh model, solves it with `r` (other options from `so`) on 4 batches of token ids and
// returns the relative MSE of its final hidden state (the blocks' output after the final RMSNorm /
// ln_f) against the float model's on held-out tokens.
template <class Make, class Hidden, class Model = decltype(std::declval<Make>()())>
double blocks_error(Make make, Hidden hidden, QType q, const std::vector<std::string>& keep_float, Rounding r,
                    SolveReport* report = nullptr, const std::function<void(Model&, const at::Tensor&)>& after = {},
                    SolveOptions so = {}) {
  const std::vector<at::Tensor> ids = token_batches(4, 128, 12);
  const at::Tensor held_out = token_batches(1, 128, 13)[0];
  auto m = make();
  at::NoGradGuard g;
  const at::Tensor y_float = hidden(m, held_out).detach().clone();
  quantize(*m, blocks_only(q, keep_float));
  const RunBatch run = [&](int64_t b) { return m->forward(ids[static_cast<size_t>(b)]); };
  so.rounding = r;
  const SolveReport rep = solve(*m, 4, run, so);
  if (report) *report = rep;
  const double error = relative_mse(hidden(m, held_out), y_float);
  if (after) after(m, held_out);
  return error;
}

// Every quantized Linear of a solved model holds its weight on a fixed grid, and freeze() (packing
// those codes onto the integer kernels) keeps hidden(m, held_out). Returns how many Linears it checked.
template <class Model, class Hidden>
int expect_on_grid_and_frozen(Model& m, Hidden hidden, const at::Tensor& held_out) {
  int solved = 0;
  for (const auto& [path, layer] : quantizable_layers(*m)) {
    auto* lin = layer->module().template as<nn::LinearImpl>();
    if (!lin || !layer->quantized()) continue;
    Quantizer wq = layer->weight_quantizer();
    EXPECT_TRUE(wq->calibrated()) << path << ": the solved grid is not fixed";
    const at::Tensor w = lin->weight.detach();
    EXPECT_TRUE(at::allclose(fake_quantize(w, wq->qparams(w)), w, 0, 1e-6)) << path << ": the weight left its grid";
    ++solved;
  }
  const at::Tensor y = hidden(m, held_out);
  freeze(*m);
  EXPECT_LE(relative_change(hidden(m, held_out), y), 1e-5);
  return solved;
}

}  // namespace qforge::ptq::testing
