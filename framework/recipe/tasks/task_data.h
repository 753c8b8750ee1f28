// What the task files share: a split capped at the recipe's example limits, the fortunes LM splits,
// and an architecture config from model.config_file and model.config.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>

#include "framework/recipe/recipe.h"
#include "framework/recipe/task.h"
#include "framework/train/batches.h"

namespace qforge::tasks {

// The first n examples of `s` (n = 0: all of them), for quick runs and CI.
std::shared_ptr<train::BatchSource> capped(std::shared_ptr<train::BatchSource> s, int64_t n);

// The fortunes corpus as byte-level language-model splits (windows of data.seq_len) and its
// unigram baseline, for the causal LM tasks (GPT-2, Llama).
void attach_fortunes(Task& t, const Recipe& r);

// The architecture config: model.config_file (HF config.json) if given, else the defaults, with
// the recipe's model.config keys merged over it.
// Memory a new allocation can have now: MemAvailable from /proc/meminfo, else the free physical
// pages (sysconf); -1 when neither is readable.
int64_t available_memory_bytes();

// Refuses, before the model is built, a config whose float32 parameters (its parameter_count())
// exceed available_memory_bytes(), naming model.config / model.config_file and the estimate.
void check_model_fits_memory(const Recipe& r, double parameters);

template <class Config>
Config model_config(const Recipe& r) {
  Config c = r.model.config_file.empty() ? Config{} : Config::from_file(r.model.config_file);
  if (r.model.config.is_null()) return c;
  nlohmann::json merged = c.to_json();
  merged.update(r.model.config);
  return Config::from_json(merged);
}

}  // namespace qforge::tasks
