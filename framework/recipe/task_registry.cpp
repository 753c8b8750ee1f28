// The task registry: every architecture qtrain runs, in the order the schema lists them. A new
// task is a file in framework/recipe/tasks/ and one entry here.
#include "framework/recipe/task.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <sstream>

#include "framework/core/error.h"
#include "framework/format/safetensors.h"

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
  auto add = [&](const std::string& d) {
    if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  };
  for (const TaskKind& k : task_kinds()) add(k.dataset);
  for (const TaskKind& k : task_kinds())
    for (const std::string& d : k.other_datasets) add(d);
  return out;
}

Task make_task(const Recipe& r, bool with_data) {
  if (const TaskKind* k = find_task_kind(r.model.arch)) return k->make(r, with_data);
  throw Error("qtrain: no task for model.arch '" + r.model.arch + "'");
}

std::vector<std::string> export_task_data(const Recipe& r, const std::string& path) {
  const Task t = make_task(r, /*with_data=*/true);
  std::map<std::string, at::Tensor> tensors;
  std::vector<std::string> lines;
  const std::pair<const char*, const std::shared_ptr<train::BatchSource>*> splits[] = {
      {"train", &t.train}, {"validation", &t.validation}, {"test", &t.test}};
  for (const auto& [name, source] : splits) {
    if (!*source) continue;
    const int64_t n = (*source)->size();
    const train::Batch b = (*source)->get(at::arange(n, at::kLong));
    const std::string s(name);
    tensors[s + ".inputs"] = b.input;
    tensors[s + ".labels"] = b.target;
    if (b.mask.defined()) tensors[s + ".mask"] = b.mask;
    std::ostringstream line;
    line << s << ": " << n << " examples, inputs " << b.input.scalar_type() << " " << b.input.sizes() << ", labels "
         << b.target.scalar_type() << " " << b.target.sizes();
    lines.push_back(line.str());
  }
  QF_REQUIRE(!tensors.empty(), "qtrain: the ", r.model.arch, " task has no data to export");
  std::string classes;
  for (const std::string& c : t.class_names) classes += (classes.empty() ? "" : ",") + c;
  io::write_safetensors(path, tensors,
                        {{"arch", r.model.arch}, {"dataset", r.data.dataset}, {"metric", t.metric},
                         {"class_names", classes}, {"seed", std::to_string(r.seed)}});
  return lines;
}

}  // namespace qforge
