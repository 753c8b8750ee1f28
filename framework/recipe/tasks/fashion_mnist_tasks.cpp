// Fashion-MNIST classifiers: the MLP and the CNN (whose BatchNorm folds before quantization).
#include <ATen/ATen.h>

#include "framework/data/fashion_mnist.h"
#include "framework/format/safetensors.h"
#include "framework/models/cnn.h"
#include "framework/models/mlp.h"
#include "framework/models/state_dict.h"
#include "framework/recipe/task.h"
#include "framework/recipe/tasks/task_data.h"

namespace qforge {

namespace {

// The splits, the class names and the majority-class baseline (the model is set by the caller).
void add_fashion_mnist(Task& t, const Recipe& r, bool with_data) {
  const auto& d = r.data;
  t.import_safetensors = [m = t.model](const std::string& path) {
    models::LoadStateOptions o;
    o.source = path;
    models::load_model_state(*m, io::read_safetensors(path).tensors, o);
  };
  t.metric = "accuracy";
  for (int64_t c = 0; c < 10; ++c) t.class_names.push_back(data::fashion_mnist_class_name(c));
  if (!with_data) return;
  const data::FashionMnist fm = data::load_fashion_mnist(d.validation_size, r.seed);
  t.train = tasks::capped(std::make_shared<train::TensorBatches>(fm.train.images, fm.train.labels), d.max_train_examples);
  t.validation = tasks::capped(std::make_shared<train::TensorBatches>(fm.validation.images, fm.validation.labels),
                               d.max_eval_examples);
  t.test = tasks::capped(std::make_shared<train::TensorBatches>(fm.test.images, fm.test.labels), d.max_eval_examples);
  t.baselines["majority_class_accuracy"] = at::bincount(fm.test.labels).max().item<double>() / fm.test.size();
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
