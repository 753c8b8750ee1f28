// What the TorchScript tests share: the committed fixtures, layer paths, the W8A8 scheme and a
// temporary directory.
#pragma once

#include <stdlib.h>

#include <torch/script.h>

#include <filesystem>
#include <string>
#include <vector>

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

inline Reloaded save_and_reload(jit::ScriptedModel& m, const at::Tensor& x) {
  TempDir tmp;
  const std::string path = (tmp.path / "saved.pt").string();
  m->save(path);
  torch::NoGradGuard no_grad;
  torch::jit::Module plain = torch::jit::load(path);
  plain.eval();
  Reloaded out;
  out.plain = plain.forward({x}).toTensor();
  out.model = jit::load_torchscript(path);
  out.model->eval();
  out.again = out.model->forward(x);
  return out;
}

}  // namespace qforge::jit_test
