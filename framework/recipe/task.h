// The tasks qtrain runs: one per architecture (a model, its data, how to call it, its metric),
// registered once in task_registry.cpp with the name and dataset the recipe schema offers.
#pragma once

#include <torch/nn/module.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/models/perplexity.h"
#include "framework/recipe/recipe.h"
#include "framework/train/batches.h"
#include "framework/train/trainer.h"

namespace qforge {

// One decode step of a causal LM as generation runs it: `run` feeds one token through the KV
// cache a prompt of `context` tokens filled (and appends it).
struct DecodeStep {
  std::function<void()> run;
  int64_t context = 0;
  std::function<int64_t()> cache_length;  // positions cached after the last call: context + 1
};

// A model, its data and how to call it.
struct Task {
  std::shared_ptr<torch::nn::Module> model;
  std::shared_ptr<train::BatchSource> train, validation, test;
  train::ForwardFn forward;
  std::string metric;  // "accuracy" or "perplexity"
  std::vector<std::string> class_names;
  std::function<void()> before_quantize;  // e.g. fold BatchNorm into the convolutions
  std::map<std::string, double> baselines;
  // Loads float weights from a safetensors file (model.safetensors in the recipe): HF names for
  // BERT, GPT-2 and Llama (these two also read an HF folder, single-file or sharded), qforge's own
  // names for the MLP and CNN. Shape mismatches are listed.
  std::function<void(const std::string& path)> import_safetensors;
  // Causal LMs: prefills part of `input` [1, T] into a KV cache and returns the decode step that
  // follows it (report.json's latency_ms.decode_step); empty for other tasks.
  std::function<DecodeStep(const at::Tensor& input)> decode_step;
  // Causal LMs: perplexity of the test text with overlapping windows (sliding_window_perplexity),
  // recorded beside the metric of every evaluated stage.
  std::function<models::PerplexityResult()> sliding_perplexity;
  // A tokenizer the task trained or read (data.tokenizer): the export stage writes it beside the
  // model as tokenizer_name (tokenizer.json or tokenizer.model).
  std::string tokenizer_name;
  std::function<void(const std::string& path)> save_tokenizer;
  // Set when the float weights come with the model (a TorchScript file): the float stage neither
  // trains nor loads them then.
  std::string float_weights_from;
  // TorchScript models: writes model.pt (export stage), and the graph's folded and float calls.
  std::function<void(const std::string& path)> save_torchscript;
  std::function<std::string()> graph_notes;
};

// An architecture qtrain runs: the recipe's model.arch, the data.dataset it is trained on, and
// its factory (with_data = false builds the model only, for the dry run).
struct TaskKind {
  const char* arch;
  const char* dataset;
  Task (*make)(const Recipe& r, bool with_data);
  std::vector<std::string> other_datasets = {};  // more data.dataset it reads (torchscript: fashion_mnist, fortunes)
  bool reads(const std::string& d) const {
    return d == dataset || std::find(other_datasets.begin(), other_datasets.end(), d) != other_datasets.end();
  }
};

// Every task, in registry order: the recipe schema's model.arch and data.dataset choices.
const std::vector<TaskKind>& task_kinds();

// The task of `arch`, or null.
const TaskKind* find_task_kind(const std::string& arch);

// Builds the task of r.model.arch; with_data = false builds the model only (the dry run).
// Throws qforge::Error naming the architectures it knows.
Task make_task(const Recipe& r, bool with_data);

// Writes the recipe's data as its task batches them, for a model trained elsewhere on the same
// examples (qtrain --export-data): for each split (train, validation, test) `<split>.inputs`
// (images float [N, ...], token ids int64 [N, L] padded to the split's longest example),
// `<split>.labels` (int64 [N], or next tokens [N, T]) and, where the task masks padding,
// `<split>.mask` (int64 [N, L], 1 = real token); metadata: arch, dataset, metric, the class
// names (comma-separated) and the seed. Written through write_safetensors (a temporary file and
// a rename). Returns one line per split,
// "train: 64000 examples, inputs Long [64000, 32], labels Long [64000]".
std::vector<std::string> export_task_data(const Recipe& r, const std::string& path);

// The architectures make_task knows, in registry order.
std::vector<std::string> task_architectures();

// The datasets of the registered tasks, each once, in registry order.
std::vector<std::string> task_datasets();

// The tasks, one file each in framework/recipe/tasks/.
TaskKind mlp_task();
TaskKind cnn_task();
TaskKind bert_task();
TaskKind gpt2_task();
TaskKind llama_task();
TaskKind torchscript_task();

}  // namespace qforge
