// Byte-level language model on fortunes: GPT-2.
#include "framework/models/gpt2.h"
#include "framework/recipe/task.h"
#include "framework/recipe/tasks/causal_lm_task.h"

namespace qforge {

namespace {

Task make_gpt2_task(const Recipe& r, bool with_data) {
  return tasks::causal_lm_task<models::Gpt2Config, models::Gpt2LMHeadModel>(
      r, with_data, &models::Gpt2Config::n_positions,
      [](models::Gpt2LMHeadModel& m, models::StateDict s, const std::string& source) {
        models::load_hf_gpt2(m, std::move(s), source);
      });
}

}  // namespace

TaskKind gpt2_task() { return {"gpt2", "fortunes", make_gpt2_task}; }

}  // namespace qforge
