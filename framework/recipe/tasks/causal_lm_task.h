// The causal LM task on fortunes (bytes, or data.tokenizer's tokens) for any decoder family (GPT-2, Llama): the family's
// config from the recipe with the corpus's vocabulary and enough positions for data.seq_len, its
// logits as the forward, its HF import as import_safetensors, perplexity as the metric.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <memory>
#include <string>

#include "framework/models/hf_folder.h"
#include "framework/models/kv_cache.h"
#include "framework/recipe/recipe.h"
#include "framework/recipe/task.h"
#include "framework/recipe/tasks/task_data.h"

namespace qforge::tasks {

// The first half of `input` [1, T] prefilled into a cache, then one token per call, each call
// starting again from the prefilled cache so every timed call attends to `context` tokens.
template <class Model>
DecodeStep decode_step(Model m, const at::Tensor& input, int64_t positions) {
  const int64_t prompt = std::max<int64_t>(1, std::min(input.size(1) / 2, positions - 1));
  auto cache = std::make_shared<models::KvCache>();
  cache->reserve(prompt + 1);  // the timed token fits: no store grows inside the step
  at::Tensor next;
  {
    at::NoGradGuard g;
    next = m->forward(input.slice(1, 0, prompt), cache.get()).select(1, prompt - 1).argmax(-1, true);
  }
  DecodeStep step;
  step.context = prompt;
  step.run = [m, cache, prompt, next]() mutable {
    cache->truncate(prompt);  // back to the prefilled positions: a view, no copy in the timed step
    at::NoGradGuard g;
    m->forward(next, cache.get());
  };
  step.cache_length = [cache] { return cache->length(); };
  return step;
}

// `positions` is the config's maximum-positions field; load(model, state, source) its HF import,
// fed by read_hf_weights (an HF folder, single-file or sharded, or one .safetensors file).
template <class Config, class Model, class Load>
Task causal_lm_task(const Recipe& r, bool with_data, int64_t Config::*positions, Load load) {
  Task t;
  Config c = model_config<Config>(r);
  c.vocab_size = fortunes_vocab_size(r);
  c.*positions = std::max(c.*positions, r.data.seq_len);
  check_model_fits_memory(r, c.parameter_count());
  Model m(c);
  t.model = m.ptr();
  t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input); };
  t.import_safetensors = [m, load](const std::string& path) mutable {
    models::HfWeights w = models::read_hf_weights(path);
    load(m, std::move(w.tensors), w.source);
  };
  t.decode_step = [m, limit = c.*positions](const at::Tensor& input) mutable {
    return decode_step(m, input, limit);
  };
  t.metric = "perplexity";
  if (with_data) attach_fortunes(t, r, [m](const at::Tensor& ids) mutable { return m->forward(ids); });
  return t;
}

}  // namespace qforge::tasks
