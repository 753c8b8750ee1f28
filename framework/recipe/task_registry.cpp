// The task registry: every architecture qtrain runs, in the order the schema lists them. A new
// task is a file in framework/recipe/tasks/ and one entry here.
#include "framework/recipe/task.h"

#include <algorithm>

#include "framework/core/error.h"

namespace qforge {

const std::vector<TaskKind>& task_kinds() {
  static const std::vector<TaskKind> kKinds{mlp_task(), cnn_task(), bert_task(), gpt2_task(), llama_task(), torchscript_task()};
  return kKinds;
}

const TaskKind* find_task_kind(const std::string& arch) {
  for (const TaskKind& k : task_kinds())
    if (arch == k.arch) return &k;
  return nullptr;
}

std::vector<std::string> task_architectures() {
  std::vector<std::string> out;
  for (const TaskKind& k : task_kinds()) out.emplace_back(k.arch);
  return out;
}

std::vector<std::string> task_datasets() {
  std::vector<std::string> out;
  for (const TaskKind& k : task_kinds())
    if (std::find(out.begin(), out.end(), k.dataset) == out.end()) out.emplace_back(k.dataset);
  return out;
}

Task make_task(const Recipe& r, bool with_data) {
  if (const TaskKind* k = find_task_kind(r.model.arch)) return k->make(r, with_data);
  throw Error("qtrain: no task for model.arch '" + r.model.arch + "'");
}

}  // namespace qforge
