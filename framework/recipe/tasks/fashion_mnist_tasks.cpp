// Fashion-MNIST classifiers: the MLP and the CNN (whose BatchNorm folds before quantization).
#include <ATen/ATen.h>

#include "framework/format/safetensors.h"
#include "framework/models/cnn.h"
#include "framework/models/mlp.h"
#include "framework/models/state_dict.h"
#include "framework/recipe/task.h"
#include "framework/recipe/tasks/task_data.h"

namespace qforge {

namespace {

// The splits, the class names, the majority-class baseline and the safetensors import (the model
// is set by the caller).
void add_fashion_mnist(Task& t, const Recipe& r, bool with_data) {
  t.import_safetensors = [m = t.model](const std::string& path) {
    models::LoadStateOptions o;
    o.source = path;
    models::load_model_state(*m, io::read_safetensors(path).tensors, o);
  };
  tasks::attach_fashion_mnist(t, r, with_data);
}

Task make_mlp_task(const Recipe& r, bool with_data) {
  Task t;
  auto m = models::Mlp(models::MlpOptions{});
  t.model = m.ptr();
  t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input); };
  add_fashion_mnist(t, r, with_data);
  return t;
}

Task make_cnn_task(const Recipe& r, bool with_data) {
  Task t;
  auto m = models::SmallCnn(models::SmallCnnOptions{});
  t.model = m.ptr();
  t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input); };
  t.before_quantize = [m]() mutable { m->fold_batch_norm(); };
  add_fashion_mnist(t, r, with_data);
  return t;
}

}  // namespace

TaskKind mlp_task() { return {"mlp", "fashion_mnist", make_mlp_task}; }
TaskKind cnn_task() { return {"cnn", "fashion_mnist", make_cnn_task}; }

}  // namespace qforge
