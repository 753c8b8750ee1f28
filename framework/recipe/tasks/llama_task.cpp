// Language model on fortunes: a Llama-family decoder (model.config holds HF LlamaConfig keys;
// model.config_file an HF config.json) over bytes or data.tokenizer's tokens.
#include "framework/models/llama.h"
#include "framework/recipe/task.h"
#include "framework/recipe/tasks/causal_lm_task.h"

namespace qforge {

namespace {

Task make_llama_task(const Recipe& r, bool with_data) {
  return tasks::causal_lm_task<models::LlamaConfig, models::LlamaForCausalLM>(
      r, with_data, &models::LlamaConfig::max_position_embeddings,
      [](models::LlamaForCausalLM& m, models::StateDict s, const std::string& source) {
        models::load_hf_llama(m, std::move(s), source);
      });
}

}  // namespace

TaskKind llama_task() { return {"llama", "fortunes", make_llama_task}; }

}  // namespace qforge
