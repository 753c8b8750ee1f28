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
    // x @ W: the script's W [in, out] becomes a view of the layer's weight [out, in] (same storage).
    if (w.defined()) set_script_attr(l->home().owner, l->home().weight, l->spec().weight_transposed ? w.detach().t() : w);
    const at::Tensor b = l->bias();
    if (b.defined() && !l->home().bias.empty()) set_script_attr(l->home().owner, l->home().bias, b);
  }
  RewriteResult r = rewrite_forward(script_);
  layers_.insert(layers_.end(), r.layers.begin(), r.layers.end());
  kept_float_ = std::move(r.kept_float);
  folded_ = std::move(r.folded);
  tied_ = std::move(r.tied);
  chained_ = std::move(r.chained);
  residual_ = std::move(r.residual);
  max_pools_ = r.max_pools;
  for (const auto& l : layers_) mount(*this, l->path(), l->module());
  register_script_tensors();
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
             "): a move would not reach the tensors the TorchScript graph holds as constants (docs/torchscript.md)");
}

// to(kFloat) as PyTorch's Module.to(dtype): floating-point tensors only (a BatchNorm's integer
// num_batches_tracked keeps its dtype, which the script's in-place add_ needs).
void floating_to_float(torch::nn::Module& m) {
  for (auto& t : m.parameters(/*recurse=*/true))
    if (at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kFloat) t.set_data(t.to(at::kFloat));
  for (auto& t : m.buffers(/*recurse=*/true))
    if (at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kFloat) t.set_data(t.to(at::kFloat));
}

}  // namespace

void ScriptedModelImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  require_cpu_float(device, dtype);
  torch::nn::Module::to(device, non_blocking);
  floating_to_float(*this);
}

void ScriptedModelImpl::to(torch::Dtype dtype, bool non_blocking) {
  require_cpu_float(std::nullopt, dtype);
  (void)non_blocking;  // nothing moves between devices
  floating_to_float(*this);
}

void ScriptedModelImpl::to(torch::Device device, bool non_blocking) {
  require_cpu_float(device, std::nullopt);
  torch::nn::Module::to(device, non_blocking);
}

std::vector<at::Tensor> ScriptedModelImpl::trainable_parameters() {
  std::vector<at::Tensor> out;
  std::set<const c10::TensorImpl*> ours, seen;
  for (const at::Tensor& p : parameters()) ours.insert(p.unsafeGetTensorImpl());
  // Script order first; a folded BatchNorm's parameters (no longer read) and released weights are not.
  for (const at::Tensor& p : script_.parameters()) {
    if (p.numel() == 0 || !ours.count(p.unsafeGetTensorImpl())) continue;
    out.push_back(p);
    seen.insert(p.unsafeGetTensorImpl());
  }
  for (const at::Tensor& p : parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

void ScriptedModelImpl::set_script_attr(const std::string& owner, const std::string& attr, const at::Tensor& value) {
  set_attribute(script_, owner, attr, value);
}

void ScriptedModelImpl::register_script_tensors() {
  std::set<std::string> skip;
  for (const auto& l : layers_) {
    if (l->home().weight.empty()) continue;  // a MatMul reads no tensor of the script
    const std::string prefix = l->home().owner.empty() ? "" : l->home().owner + ".";
    skip.insert(prefix + l->home().weight);
    if (!l->home().bias.empty()) skip.insert(prefix + l->home().bias);
  }
  const std::set<std::string> read = tensor_attributes_read(script_);
  std::set<std::string> layer_paths;
  for (const auto& l : layers_) layer_paths.insert(l->path());
  auto add = [&](const std::string& script_name, const at::Tensor& t, bool parameter) {
    if (skip.count(script_name) || !read.count(script_name)) return;
    // A tensor of a module whose layer has the module's path goes beside that layer.
    const std::string name = outside_layers(script_name, layer_paths);
    const size_t dot = name.rfind('.');
    torch::nn::Module& owner = dot == std::string::npos ? *this : module_at(*this, name.substr(0, dot));
    const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
    QF_REQUIRE(!owner.named_parameters(false).contains(leaf) && !owner.named_buffers(false).contains(leaf) &&
                   !owner.named_children().contains(leaf),
               "framework/jit: the script's tensor '", script_name, "' would be the model's '", name,
               "', a name already taken (a qforge layer holds no children, so a module's other tensors go beside "
               "its layer): rename one of them in the script");
    // The same tensor as the script's: a checkpoint load or an optimizer step reaches the script.
    if (parameter)
      owner.register_parameter(leaf, t, t.requires_grad());
    else
      owner.register_buffer(leaf, t);
  };
  for (const auto& p : script_.named_parameters(/*recurse=*/true)) add(p.name, p.value, true);
  for (const auto& b : script_.named_buffers(/*recurse=*/true)) add(b.name, b.value, false);
}

void ScriptedModelImpl::release_script_tensor(const std::string& owner, const std::string& attr) {
  torch::jit::Module m = script_;
  std::stringstream names(owner);
  for (std::string name; std::getline(names, name, '.');) m = m.attr(name).toModule();
  const c10::TensorImpl* impl = m.attr(attr).toTensor().unsafeGetTensorImpl();
  std::vector<std::string> holders{owner.empty() ? attr : owner + "." + attr};
  // A tied tensor (lm_head.weight = tok.weight) is one tensor under several names: empty each.
  for (const auto& p : script_.named_parameters(/*recurse=*/true))
    if (p.value.unsafeGetTensorImpl() == impl) holders.push_back(p.name);
  for (const auto& b : script_.named_buffers(/*recurse=*/true))
    if (b.value.unsafeGetTensorImpl() == impl) holders.push_back(b.name);
  for (const std::string& name : holders) {
    const size_t dot = name.rfind('.');
    set_script_attr(dot == std::string::npos ? "" : name.substr(0, dot), name.substr(dot + 1), at::empty({0}));
  }
}

void ScriptedModelImpl::save(const std::string& path) {
  for (const auto& l : layers_) {
    if (!l->layer().frozen() || l->home().weight.empty()) continue;
    release_script_tensor(l->home().owner, l->home().weight);
    // A bias the packed weight holds now (Linear's integer formats) is released too.
    if (!l->home().bias.empty() && !l->bias().defined()) set_script_attr(l->home().owner, l->home().bias, at::empty({0}));
  }
  try {
    script_.save(path);
  } catch (const c10::Error& e) {
    throw Error("framework/jit: cannot save TorchScript to " + path + ": " + e.what_without_backtrace());
  }
}

std::string ScriptedModelImpl::describe(bool planned) const { return qforge::describe(*this, planned) + graph_notes(); }

std::string ScriptedModelImpl::graph_notes() const {
  std::string out;
  for (const auto& [bn, conv] : folded_) out += "folded  " + bn + "  aten::batch_norm into " + conv + "\n";
  for (const TiedCall& t : tied_)
    out += (t.slice ? "sliced  " : "tied  ") + t.name + "  " + t.op +
           (t.slice ? " reads it from the qforge layer " : " runs the qforge layer ") + t.layer + "\n";
  for (const ChainedCall& c : chained_)
    out += "chained  " + c.from + " -> " + c.activation + " -> " + c.to +
           ": int8 codes between them once both are frozen on the integer path\n";
  for (const ResidualCall& r : residual_)
    out += "residual  " + r.layer + " + aten::add" + (r.relu ? " -> aten::relu" : "") +
           ": in its epilogue once it is frozen on the integer path\n";
  if (max_pools_ > 0)
    out += "pooled  aten::max_pool2d (" + std::to_string(max_pools_) +
           (max_pools_ == 1 ? " call" : " calls") + "): qforge's kernel on channels-last float inputs\n";
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
