// TorchScript models (framework/jit) in recipes: model.torchscript names the file, whose float
// weights come with it; data.dataset "tensors" reads the examples from data.file, a safetensors
// file holding `inputs` [N, ...] (float examples, or int32 / int64 token ids passed on as int64; the
// model masks its own padding) and `labels` [N] (integer classes); "fashion_mnist" the built-in
// Fashion-MNIST images [1, 28, 28].
#include <ATen/ATen.h>

#include <sstream>

#include "framework/core/error.h"
#include "framework/format/safetensors.h"
#include "framework/jit/scripted_model.h"
#include "framework/recipe/task.h"
#include "framework/recipe/tasks/task_data.h"

namespace qforge {

namespace {

std::string shape_string(at::IntArrayRef s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

// The tensor `name` of the data file, or an error naming the file and what it holds.
at::Tensor data_tensor(const io::SafetensorsFile& f, const std::string& file, const char* name, const char* what) {
  const auto it = f.tensors.find(name);
  if (it != f.tensors.end()) return it->second;
  std::string have;
  for (const auto& [key, t] : f.tensors) have += (have.empty() ? "" : ", ") + key;
  throw Error("qtrain: data.file " + file + " has no tensor '" + name + "' (" + what + "); it holds: " +
              (have.empty() ? "nothing" : have));
}

// Splits data.file: the first N - validation_size examples calibrate (and train), the last
// validation_size are the validation and test split.
void attach_tensor_file(Task& t, const Recipe& r) {
  const std::string& file = r.data.file;
  const io::SafetensorsFile f = io::read_safetensors(file);
  at::Tensor inputs = data_tensor(f, file, "inputs", "float examples or integer token ids [N, ...]");
  const at::Tensor labels = data_tensor(f, file, "labels", "integer classes [N]");
  const bool ids = inputs.scalar_type() == at::kLong || inputs.scalar_type() == at::kInt;
  QF_REQUIRE((inputs.scalar_type() == at::kFloat || ids) && inputs.dim() >= 2, "qtrain: data.file ", file,
             ": 'inputs' must be float32 examples or int32 / int64 token ids of at least 2 dimensions [N, ...], got ",
             inputs.scalar_type(), " ", shape_string(inputs.sizes()));
  if (ids) inputs = inputs.to(at::kLong);  // as nn.Embedding takes them
  QF_REQUIRE(at::isIntegralType(labels.scalar_type(), /*includeBool=*/false) && labels.dim() == 1,
             "qtrain: data.file ", file, ": 'labels' must be integer classes of shape [N], got ", labels.scalar_type(),
             " ", shape_string(labels.sizes()));
  const int64_t n = inputs.size(0);
  QF_REQUIRE(labels.size(0) == n, "qtrain: data.file ", file, ": ", n, " inputs but ", labels.size(0), " labels");
  QF_REQUIRE(ids || at::isfinite(inputs).all().item<bool>(), "qtrain: data.file ", file, ": 'inputs' holds NaN or inf");
  QF_REQUIRE(!ids || inputs.min().item<int64_t>() >= 0, "qtrain: data.file ", file, ": 'inputs' holds negative token ids");
  const auto& shape = r.model.input_shape;
  QF_REQUIRE(shape.empty() || inputs.sizes().slice(1).vec() == shape, "qtrain: data.file ", file,
             ": one example has shape ", shape_string(inputs.sizes().slice(1)), ", model.input_shape is ",
             shape_string(shape));
  const int64_t v = r.data.validation_size;
  QF_REQUIRE(v > 0 && v < n, "qtrain: data.file ", file, " holds ", n,
             " examples: data.validation_size (", v, ") must leave some for calibration and some for evaluation");
  const at::Tensor y = labels.to(at::kLong);
  QF_REQUIRE(y.min().item<int64_t>() >= 0, "qtrain: data.file ", file, ": 'labels' holds negative classes");
  auto split = [&](int64_t begin, int64_t end, int64_t cap) {
    return tasks::capped(std::make_shared<train::TensorBatches>(inputs.slice(0, begin, end), y.slice(0, begin, end)), cap);
  };
  t.train = split(0, n - v, r.data.max_train_examples);
  t.validation = split(n - v, n, r.data.max_eval_examples);
  t.test = t.validation;
  const at::Tensor held_out = y.slice(0, n - v, n);
  t.baselines["majority_class_accuracy"] = at::bincount(held_out).max().item<double>() / static_cast<double>(v);
}

Task make_torchscript_task(const Recipe& r, bool with_data) {
  Task t;
  jit::ScriptedModel m = jit::load_torchscript(r.model.torchscript);
  t.model = m.ptr();
  t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input); };
  t.metric = "accuracy";
  t.float_weights_from = "the TorchScript file " + r.model.torchscript;
  t.save_torchscript = [m](const std::string& path) mutable { m->save(path); };
  t.graph_notes = [m]() { return m->graph_notes(); };
  if (r.data.dataset == "fashion_mnist") {
    const std::vector<int64_t> image{1, 28, 28};
    QF_REQUIRE(r.model.input_shape.empty() || r.model.input_shape == image,
               "qtrain: model.input_shape is ", shape_string(r.model.input_shape),
               " but Fashion-MNIST images are [1, 28, 28]");
    tasks::attach_fashion_mnist(t, r, with_data);
  } else if (with_data) {
    attach_tensor_file(t, r);
  }
  return t;
}

}  // namespace

TaskKind torchscript_task() { return {"torchscript", "tensors", make_torchscript_task, "fashion_mnist"}; }

}  // namespace qforge
