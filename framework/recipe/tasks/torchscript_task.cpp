// TorchScript models (framework/jit) in recipes: model.torchscript names the file, whose float
// weights come with it. model.task says what it computes:
//   classification  logits [B, C]; data.dataset "tensors" reads data.file, a safetensors or HDF5
//                   file (tasks::read_data_file) holding `inputs` [N, ...] (float examples, or int32 / int64 token ids passed on
//                   as int64; the model masks its own padding) and `labels` [N] (integer classes);
//                   "fashion_mnist" the built-in Fashion-MNIST images [1, 28, 28]; "images" a
//                   folder of class folders of PNG / JPEG files (tasks::attach_image_folder);
//                   "langid" the built-in language-ID phrases as token ids (tasks::attach_language_id).
//   causal_lm       logits [B, T, V] for token ids [B, T] (V at least the data's vocabulary), scored
//                   by perplexity; "fortunes" the built-in text (bytes, or data.tokenizer's tokens)
//                   cut into windows of data.seq_len, as the gpt2 and llama tasks read it, with the
//                   sliding-window perplexity of the test text; "tensors" data.file's `inputs`
//                   [N, T] token ids and `labels` [N, T] next tokens (qtrain --export-data writes
//                   them from a causal LM recipe), or `inputs` alone: windows of T ids whose next
//                   tokens are their own ids shifted by one (T - 1 positions scored per window).
#include <ATen/ATen.h>

#include <cstdio>
#include <functional>
#include <sstream>

#include "framework/core/error.h"
#include "framework/data/text_corpus.h"
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

// The tensor `name` of the data file, or an error naming the file and what it holds (`held`).
at::Tensor data_tensor(const std::map<std::string, at::Tensor>& f, const std::vector<std::string>& held,
                       const std::string& file, const char* name, const char* what) {
  const auto it = f.find(name);
  if (it != f.end()) return it->second;
  std::string have;
  for (const std::string& key : held) have += (have.empty() ? "" : ", ") + key;
  throw Error("qtrain: data.file " + file + " has no tensor '" + name + "' (" + what + "); it holds: " +
              (have.empty() ? "nothing" : have));
}

// One forward of m on x in eval mode without gradients, m's mode restored after (on a throw too);
// a failing forward becomes qforge::Error(failed(the interpreter's message)).
at::Tensor probe_forward(jit::ScriptedModel& m, const at::Tensor& x,
                         const std::function<std::string(const std::string&)>& failed) {
  at::NoGradGuard no_grad;
  struct RestoreMode {
    jit::ScriptedModel& m;
    bool training;
    ~RestoreMode() { m->train(training); }
  } restore{m, m->is_training()};
  m->eval();
  try {
    return m->forward(x);
  } catch (const std::exception& e) {
    const auto* c10 = dynamic_cast<const c10::Error*>(&e);
    throw Error(failed(c10 != nullptr ? c10->what_without_backtrace() : e.what()));
  }
}

// Causal LMs: one forward on `ids` [B, T] must give logits [B, T, V] with V >= vocab; returns V.
// A failing forward (positions beyond the model's, ids beyond its table) is named with the input.
int64_t check_lm_logits(jit::ScriptedModel& m, const Recipe& r, const at::Tensor& ids, int64_t vocab,
                        const std::string& data) {
  const std::string who = "qtrain: model.torchscript " + r.model.torchscript + " (model.task causal_lm)";
  const at::Tensor logits = probe_forward(m, ids, [&](const std::string& why) {
    return who + ": a forward on token ids " + shape_string(ids.sizes()) + " of " + data + " failed (" + why +
           "); the model must take token ids [B, T] with T = " + std::to_string(ids.size(1)) +
           (r.data.dataset == "fortunes" ? " (data.seq_len)" : "") + " and ids up to " +
           std::to_string(ids.max().item<int64_t>());
  });
  QF_REQUIRE(logits.dim() == 3 && logits.size(0) == ids.size(0) && logits.size(1) == ids.size(1) &&
                 logits.is_floating_point(),
             who, ": token ids ", shape_string(ids.sizes()), " gave ", logits.scalar_type(), " ",
             shape_string(logits.sizes()), "; a causal LM's logits are float [B, T, V] (classification models: "
             "model.task classification)");
  QF_REQUIRE(logits.size(2) >= vocab, who, ": its logits cover ", logits.size(2), " tokens, but ", data, " has ",
             vocab, " (ids 0 .. ", vocab - 1, ")");
  return logits.size(2);
}

// One forward on (up to) two training examples: the model must give a logit per class of the data
// (`what` says what the examples are, `classes` what the classes are, `order` how they are ordered),
// before anything runs on them. A forward that fails is reported with the same words.
void check_class_logits(jit::ScriptedModel& m, const Recipe& r, const Task& t, const std::string& what,
                        const std::string& classes, const std::string& order) {
  const train::Batch probe = t.train->get(at::arange(std::min<int64_t>(2, t.train->size()), at::kLong));
  const at::Tensor logits = probe_forward(m, probe.input, [&](const std::string& why) {
    return "qtrain: model.torchscript " + r.model.torchscript + ": a forward on " + std::to_string(probe.input.size(0)) +
           " " + what + " failed (" + why + ")";
  });
  const auto n = static_cast<int64_t>(t.class_names.size());
  QF_REQUIRE(logits.dim() == 2 && logits.size(1) == n, "qtrain: model.torchscript ", r.model.torchscript,
             " gives logits ", shape_string(logits.sizes()), " on ", probe.input.size(0), " ", what, ", which has ", n,
             " ", classes, " (", t.class_names.front(), " ... ", t.class_names.back(), "): one logit per class, ", order);
}

// data.file of a causal LM: `inputs` [N, T] token ids, `labels` [N, T] the next token at every
// position; split as the classification file (the last validation_size windows evaluate).
// `shifted`: the file held windows alone, cut here into inputs and next tokens (the messages say so).
void attach_token_file(Task& t, const Recipe& r, jit::ScriptedModel m, const at::Tensor& inputs, const at::Tensor& labels,
                       bool shifted = false) {
  const std::string& file = r.data.file;
  auto integral = [](const at::Tensor& x) { return x.scalar_type() == at::kLong || x.scalar_type() == at::kInt; };
  QF_REQUIRE(integral(inputs) && inputs.dim() == 2, "qtrain: data.file ", file,
             ": a causal LM's 'inputs' are int32 / int64 token ids [N, T], got ", inputs.scalar_type(), " ",
             shape_string(inputs.sizes()));
  QF_REQUIRE(integral(labels) && labels.sizes() == inputs.sizes(), "qtrain: data.file ", file,
             ": a causal LM's 'labels' are int32 / int64 next tokens shaped as 'inputs' ", shape_string(inputs.sizes()),
             ", got ", labels.scalar_type(), " ", shape_string(labels.sizes()));
  const at::Tensor x = inputs.to(at::kLong), y = labels.to(at::kLong);
  QF_REQUIRE(x.numel() > 0 && x.min().item<int64_t>() >= 0 && y.min().item<int64_t>() >= 0, "qtrain: data.file ", file,
             ": token ids must be non-negative (and the file non-empty)");
  const auto& shape = r.model.input_shape;
  QF_REQUIRE(shape.empty() || shape == std::vector<int64_t>{x.size(1)}, "qtrain: data.file ", file, ": windows of ",
             x.size(1), " tokens", shifted ? " (its windows of " + std::to_string(x.size(1) + 1) + " ids less the last, which only follows)" : "",
             ", model.input_shape is ", shape_string(shape));
  const int64_t n = x.size(0), v = r.data.validation_size;
  QF_REQUIRE(v > 0 && v < n, "qtrain: data.file ", file, " holds ", n,
             " windows: data.validation_size (", v, ") must leave some for calibration and some for evaluation");
  const int64_t vocab = std::max(x.max().item<int64_t>(), y.max().item<int64_t>()) + 1;
  const int64_t model_vocab = check_lm_logits(m, r, x.slice(0, 0, std::min<int64_t>(2, n)), vocab, file);
  auto split = [&](int64_t begin, int64_t end, int64_t cap) {
    return tasks::capped(std::make_shared<train::TensorBatches>(x.slice(0, begin, end), y.slice(0, begin, end)), cap);
  };
  t.train = split(0, n - v, r.data.max_train_examples);
  t.validation = split(n - v, n, r.data.max_eval_examples);
  t.test = t.validation;
  t.baselines["unigram_perplexity"] = data::unigram_perplexity(y.slice(0, 0, n - v), y.slice(0, n - v, n), model_vocab);
}

// Splits data.file: the first N - validation_size examples calibrate (and train), the last
// validation_size are the validation and test split.
void attach_tensor_file(Task& t, const Recipe& r, jit::ScriptedModel m) {
  const std::string& file = r.data.file;
  std::vector<std::string> held;
  const std::map<std::string, at::Tensor> f = tasks::read_data_file(file, {"inputs", "labels"}, &held);
  at::Tensor inputs = data_tensor(f, held, file, "inputs", "float examples or integer token ids [N, ...]");
  if (r.model.task == "causal_lm" && !f.count("labels")) {
    // Token windows alone, as a user has them: position i's next token is id i + 1 of the window.
    QF_REQUIRE((inputs.scalar_type() == at::kLong || inputs.scalar_type() == at::kInt) && inputs.dim() == 2 &&
                   inputs.size(1) >= 2,
               "qtrain: data.file ", file,
               " has no 'labels': a causal LM's 'inputs' must then be int32 / int64 token windows [N, T] with T >= 2 (each "
               "window's next tokens are its own ids shifted by one), got ",
               inputs.scalar_type(), " ", shape_string(inputs.sizes()));
    const int64_t w = inputs.size(1);
    std::fprintf(stderr,
                 "qtrain: data.file %s has no 'labels': each window of %lld ids runs its first %lld, and ids 2..%lld "
                 "are their next tokens\n",
                 file.c_str(), static_cast<long long>(w), static_cast<long long>(w - 1), static_cast<long long>(w));
    return attach_token_file(t, r, std::move(m), inputs.slice(1, 0, w - 1), inputs.slice(1, 1, w), /*shifted=*/true);
  }
  const at::Tensor labels = data_tensor(f, held, file, "labels",
                                        r.model.task == "causal_lm" ? "next tokens [N, T]" : "integer classes [N]");
  if (r.model.task == "causal_lm") return attach_token_file(t, r, std::move(m), inputs, labels);
  const bool ids = inputs.scalar_type() == at::kLong || inputs.scalar_type() == at::kInt;
  QF_REQUIRE((inputs.scalar_type() == at::kFloat || ids) && inputs.dim() >= 2, "qtrain: data.file ", file,
             ": 'inputs' must be float32 examples or int32 / int64 token ids of at least 2 dimensions [N, ...], got ",
             inputs.scalar_type(), " ", shape_string(inputs.sizes()));
  if (ids) inputs = inputs.to(at::kLong);  // as nn.Embedding takes them
  QF_REQUIRE(at::isIntegralType(labels.scalar_type(), /*includeBool=*/false) && labels.dim() == 1,
             "qtrain: data.file ", file, ": 'labels' must be integer classes of shape [N], got ", labels.scalar_type(),
             " ", shape_string(labels.sizes()), labels.dim() == 2 ? " (next tokens [N, T] are read by model.task causal_lm)" : "");
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
  const bool lm = r.model.task == "causal_lm";
  t.metric = lm ? "perplexity" : "accuracy";
  t.float_weights_from = "the TorchScript file " + r.model.torchscript;
  t.save_torchscript = [m](const std::string& path) mutable { m->save(path); };
  t.graph_notes = [m]() { return m->graph_notes(); };
  if (r.data.dataset == "fashion_mnist") {
    const std::vector<int64_t> image{1, 28, 28};
    QF_REQUIRE(r.model.input_shape.empty() || r.model.input_shape == image,
               "qtrain: model.input_shape is ", shape_string(r.model.input_shape),
               " but Fashion-MNIST images are [1, 28, 28]");
    tasks::attach_fashion_mnist(t, r, with_data);
  } else if (r.data.dataset == "images") {
    if (with_data) {
      tasks::attach_image_folder(t, r);
      check_class_logits(m, r, t, "images of data.folder " + r.data.folder, "class folders",
                         "the folders' sorted order being the model's class order");
    }
  } else if (r.data.dataset == "langid") {
    if (with_data) {
      const int64_t vocab = tasks::attach_language_id(t, r);
      const std::string what = "phrases of the langid data (" + std::to_string(vocab) + " token ids with data.tokens " +
                               r.data.tokens + "; id 0 is padding)";
      // The widest batch a split can make (data.seq_len ids) with the largest id: positions and
      // token table must cover them.
      probe_forward(m, at::full({1, r.data.seq_len}, vocab - 1, at::kLong), [&](const std::string& why) {
        return "qtrain: model.torchscript " + r.model.torchscript + ": a forward on " + std::to_string(r.data.seq_len) +
               " ids (data.seq_len) of " + std::to_string(vocab - 1) + ", the largest id of the " + what +
               ", failed (" + why + ")";
      });
      check_class_logits(m, r, t, what, "languages", "in the data's order");
    }
  } else if (r.data.dataset == "fortunes") {
    QF_REQUIRE(lm, "qtrain: fortunes is text for model.task causal_lm");
    if (with_data) {
      tasks::attach_fortunes(t, r, [m](const at::Tensor& ids) mutable { return m->forward(ids); });
      // One window of the test text through the model: its logits must cover the vocabulary.
      const train::Batch probe = t.test->get(at::arange(std::min<int64_t>(2, t.test->size()), at::kLong));
      check_lm_logits(m, r, probe.input, tasks::fortunes_vocab_size(r), "the fortunes text");
    }
  } else if (with_data) {
    attach_tensor_file(t, r, m);
  }
  return t;
}

}  // namespace

TaskKind torchscript_task() { return {"torchscript", "tensors", make_torchscript_task, {"fashion_mnist", "fortunes", "images", "langid"}}; }

}  // namespace qforge
