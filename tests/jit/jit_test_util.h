// What the TorchScript tests share: the committed fixtures, layer paths, the W8A8 scheme, the
// calls left float, the file's own forward and a temporary directory.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <torch/script.h>

#include <filesystem>
#include <string>
#include <vector>

#include "framework/api/quantize.h"
#include "framework/api/scheme.h"
#include "framework/jit/scripted_model.h"
#include "tests/paths.h"

namespace qforge::jit_test {

// tests/fixtures/torchscript/<name>.pt (scripts/torchscript/make_fixtures.py).
inline std::string fixture(const std::string& name) {
  return std::string(QFORGE_TORCHSCRIPT_FIXTURES) + "/" + name + ".pt";
}

// The module paths of a model's qforge layers, in graph order.
inline std::vector<std::string> layer_paths(const jit::ScriptedModel& m) {
  std::vector<std::string> out;
  for (const auto& l : m->layers()) out.push_back(l->path());
  return out;
}

// How many calls of `op` the model left float.
inline int count_ops(const jit::ScriptedModel& m, const std::string& op) {
  int n = 0;
  for (const auto& f : m->kept_float()) n += f.op == op;
  return n;
}

// How many ops read a packed weight's slices from its qforge layer (chunk / split of in_proj_weight).
inline int sliced_reads(const jit::ScriptedModel& m) {
  int n = 0;
  for (const auto& t : m->tied()) n += t.slice;
  return n;
}

// Every call left float is one the composite path of PyTorch's attention has no weight for:
// LayerNorm, and (scripted) the other branches' Linear calls on slices of the packed weight, which
// read it from the qforge layer. (Its activation products are qforge MatMuls.)
inline void expect_only_weightless_float_calls(const jit::ScriptedModel& m) {
  for (const auto& f : m->kept_float()) {
    const bool weightless = f.op == "aten::layer_norm" ||
                            (f.op == "aten::linear" && f.reason.find("computed in the graph") != std::string::npos);
    EXPECT_TRUE(weightless) << f.name << " " << f.op << ": " << f.reason;
  }
}

// Runs fixture `form`'s own forward on `inputs` in eval mode, with gradients (PyTorch's composite
// path) or without (its fused or nested-tensor fast path where it takes one).
inline c10::IValue original_call(const std::string& form, const std::vector<c10::IValue>& inputs, bool grad) {
  torch::jit::Module original = torch::jit::load(fixture(form));
  original.eval();
  torch::AutoGradMode mode(grad);  // also under a caller's NoGradGuard
  return original.forward(inputs);
}

// Static int8 activations and per-channel int8 weights: the integer kernels after freeze.
inline Scheme w8a8() {
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  return s;
}

// Per-channel int8 weights, int8 activations quantized per token on each call (no calibration).
inline Scheme dynamic_int8() {
  Scheme s(qint8);
  s.activations = ActivationMode::kDynamicPerToken;
  return s;
}

// Largest absolute difference, relative to the largest absolute reference value.
inline double relative_error(const at::Tensor& y, const at::Tensor& ref) {
  return (y - ref).abs().max().item<double>() / ref.abs().max().item<double>();
}

// A temporary directory removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "qforge-jit-test-XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// A model saved by save() and loaded back both ways, run on one input.
struct Reloaded {
  at::Tensor plain;              // torch::jit::load's module, in eval mode
  at::Tensor again;              // load_torchscript's model, in eval mode
  jit::ScriptedModel model{nullptr};  // the latter
};

inline Reloaded save_and_reload(jit::ScriptedModel& m, const std::vector<c10::IValue>& inputs) {
  TempDir tmp;
  const std::string path = (tmp.path / "saved.pt").string();
  m->save(path);
  torch::NoGradGuard no_grad;
  torch::jit::Module plain = torch::jit::load(path);
  plain.eval();
  Reloaded out;
  out.plain = plain.forward(inputs).toTensor();
  out.model = jit::load_torchscript(path);
  out.model->eval();
  out.again = out.model->forward(inputs).toTensor();
  return out;
}

inline Reloaded save_and_reload(jit::ScriptedModel& m, const at::Tensor& x) {
  return save_and_reload(m, std::vector<c10::IValue>{x});
}

// Static W8A8 calibrated on `calib`, frozen, saved and loaded back in C++ both ways (outputs and
// model_size equal): the frozen model's relative error on `run` against the file's composite float path.
inline double static_w8a8_round_trip(const std::string& form, const std::vector<c10::IValue>& calib,
                                     const std::vector<c10::IValue>& run) {
  jit::ScriptedModel m = jit::load_torchscript(fixture(form));
  m->eval();
  const at::Tensor ref = original_call(form, run, true).toTensor().detach();
  quantize(*m, w8a8());
  torch::NoGradGuard no_grad;
  {
    Calibration calibration(*m);
    m->forward(calib);
  }
  freeze(*m);
  for (const auto& l : m->layers()) EXPECT_TRUE(l->layer().frozen()) << l->path();
  const at::Tensor frozen = m->forward(run).toTensor();
  const auto reloaded = save_and_reload(m, run);
  EXPECT_TRUE(at::equal(reloaded.plain, frozen)) << form;
  EXPECT_TRUE(at::equal(reloaded.again, frozen)) << form;
  EXPECT_EQ(model_size(*reloaded.model).total_bytes, model_size(*m).total_bytes);
  return relative_error(frozen, ref);
}

// Dynamic int8 (weights per channel, activations per token, computed per call): the relative error
// on `run` against the file's composite float path.
inline double dynamic_int8_error(const std::string& form, const std::vector<c10::IValue>& run) {
  jit::ScriptedModel m = jit::load_torchscript(fixture(form));
  m->eval();
  quantize(*m, dynamic_int8());
  const at::Tensor ref = original_call(form, run, true).toTensor().detach();
  torch::NoGradGuard no_grad;
  return relative_error(m->forward(run).toTensor(), ref);
}

// Train mode with gradients: the rewritten model and the file, run from the same seed (the same
// dropout masks), give equal outputs, and the output carries gradients.
inline void expect_train_mode_equals_pytorch(const std::string& form, const at::Tensor& x) {
  jit::ScriptedModel m = jit::load_torchscript(fixture(form));
  m->train();
  torch::jit::Module original = torch::jit::load(fixture(form));
  original.train();
  torch::manual_seed(5);
  const at::Tensor y = m->forward(x);
  torch::manual_seed(5);
  const at::Tensor ref = original.forward({x}).toTensor();
  EXPECT_TRUE(at::equal(y, ref)) << form << ": " << relative_error(y.detach(), ref.detach());
  EXPECT_TRUE(y.requires_grad()) << form;
}

}  // namespace qforge::jit_test
