// ScriptedModel: a rewritten TorchScript module seen through qforge's module walk.
#include "framework/jit/scripted_model.h"

#include <torch/script.h>

#include <filesystem>
#include <optional>
#include <set>
#include <sstream>

#include "framework/api/quantize.h"
#include "framework/core/error.h"

namespace qforge::jit {

ScriptedModelImpl::ScriptedModelImpl(torch::jit::Module script, FreshlyLoaded) : script_(std::move(script)) {
  // A file save() wrote: its layers are attributes already; rebind the float ones to the module's
  // own parameters again, so training the TorchScript module trains them.
  layers_ = rewritten_layers(script_);
  for (const auto& l : layers_) {
    const at::Tensor w = l->weight();
    if (w.defined()) set_script_attr(l->home().owner, l->home().weight, w);
    const at::Tensor b = l->bias();
    if (b.defined() && !l->home().bias.empty()) set_script_attr(l->home().owner, l->home().bias, b);
  }
  RewriteResult r = rewrite_forward(script_);
  layers_.insert(layers_.end(), r.layers.begin(), r.layers.end());
  kept_float_ = std::move(r.kept_float);
  for (const auto& l : layers_) mount(*this, l->path(), l->module());
  train(script_.is_training());
}

at::Tensor ScriptedModelImpl::forward(const at::Tensor& x) {
  const c10::IValue out = script_.forward({x});
  QF_REQUIRE(out.isTensor(), "framework/jit: the TorchScript forward returned ", out.tagKind(),
             ", not a tensor (use forward(std::vector<c10::IValue>))");
  return out.toTensor();
}

c10::IValue ScriptedModelImpl::forward(std::vector<c10::IValue> inputs) { return script_.forward(std::move(inputs)); }

void ScriptedModelImpl::train(bool on) {
  torch::nn::Module::train(on);
  script_.train(on);
}

namespace {

void require_cpu_float(const std::optional<torch::Device>& device, const std::optional<torch::Dtype>& dtype) {
  QF_REQUIRE((!device || device->is_cpu()) && (!dtype || *dtype == torch::kFloat),
             "framework/jit: a ScriptedModel stays on the CPU in float32 for now (asked: ",
             device ? device->str() : std::string("same device"), ", ",
             dtype ? std::string(c10::toString(*dtype)) : std::string("same dtype"),
             "): moving it would move the qforge layers but not the TorchScript module's other parameters "
             "and buffers (docs/torchscript.md)");
}

}  // namespace

void ScriptedModelImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  require_cpu_float(device, dtype);
  torch::nn::Module::to(device, dtype, non_blocking);
}

void ScriptedModelImpl::to(torch::Dtype dtype, bool non_blocking) {
  require_cpu_float(std::nullopt, dtype);
  torch::nn::Module::to(dtype, non_blocking);
}

void ScriptedModelImpl::to(torch::Device device, bool non_blocking) {
  require_cpu_float(device, std::nullopt);
  torch::nn::Module::to(device, non_blocking);
}

std::vector<at::Tensor> ScriptedModelImpl::trainable_parameters() {
  std::vector<at::Tensor> out;
  std::set<const c10::TensorImpl*> seen;
  for (const at::Tensor& p : script_.parameters()) {
    if (p.numel() == 0) continue;  // a frozen layer's released weight
    out.push_back(p);
    seen.insert(p.unsafeGetTensorImpl());
  }
  for (const at::Tensor& p : parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

void ScriptedModelImpl::set_script_attr(const std::string& owner, const std::string& attr, const at::Tensor& value) {
  torch::jit::Module m = script_;
  std::stringstream path(owner);
  for (std::string name; std::getline(path, name, '.');) m = m.attr(name).toModule();
  m.setattr(attr, value);
}

void ScriptedModelImpl::save(const std::string& path) {
  for (const auto& l : layers_) {
    if (!l->layer().frozen()) continue;
    set_script_attr(l->home().owner, l->home().weight, at::empty({0}));
    // A bias the packed weight holds now (Linear's integer formats) is released too.
    if (!l->home().bias.empty() && !l->bias().defined()) set_script_attr(l->home().owner, l->home().bias, at::empty({0}));
  }
  try {
    script_.save(path);
  } catch (const c10::Error& e) {
    throw Error("framework/jit: cannot save TorchScript to " + path + ": " + e.what_without_backtrace());
  }
}

std::string ScriptedModelImpl::describe(bool planned) const {
  std::string out = qforge::describe(*this, planned);
  for (const FloatCall& f : kept_float_) out += "float  " + f.name + "  " + f.op + ": " + f.reason + "\n";
  return out;
}

ScriptedModel load_torchscript(const std::string& path) {
  QF_REQUIRE(std::filesystem::is_regular_file(path), "framework/jit: no TorchScript file at ", path);
  torch::jit::Module script;
  try {
    script = torch::jit::load(path, torch::kCPU);
  } catch (const c10::Error& e) {
    throw Error("framework/jit: " + path + " is not a TorchScript file LibTorch can load: " +
                e.what_without_backtrace());
  }
  return ScriptedModel(std::move(script), ScriptedModelImpl::FreshlyLoaded());
}

}  // namespace qforge::jit
