// The causal LM task on fortunes (bytes, or data.tokenizer's tokens) for any decoder family (GPT-2, Llama): the family's
// config from the recipe with the corpus's vocabulary and enough positions for data.seq_len, its
// logits as the forward, its HF import as import_safetensors, perplexity as the metric.
#pragma once

#include <algorithm>
#include <string>

#include "framework/models/hf_folder.h"
#include "framework/recipe/recipe.h"
#include "framework/recipe/task.h"
#include "framework/recipe/tasks/task_data.h"

namespace qforge::tasks {

// `positions` is the config's maximum-positions field; load(model, state, source) its HF import,
// fed by read_hf_weights (an HF folder, single-file or sharded, or one .safetensors file).
template <class Config, class Model, class Load>
Task causal_lm_task(const Recipe& r, bool with_data, int64_t Config::*positions, Load load) {
  Task t;
  Config c = model_config<Config>(r);
  c.vocab_size = fortunes_vocab_size(r);
  c.*positions = std::max(c.*positions, r.data.seq_len);
  Model m(c);
  t.model = m.ptr();
  t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input); };
  t.import_safetensors = [m, load](const std::string& path) mutable {
    models::HfWeights w = models::read_hf_weights(path);
    load(m, std::move(w.tensors), w.source);
  };
  t.metric = "perplexity";
  if (with_data) attach_fortunes(t, r, [m](const at::Tensor& ids) mutable { return m->forward(ids); });
  return t;
}

}  // namespace qforge::tasks
