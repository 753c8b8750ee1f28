// ScriptedModel: a TorchScript model (torch.jit.script / torch.jit.trace, saved from PyTorch) as a
// qforge model. Loading rewrites its forward so each Linear / Conv1d / Conv2d call runs a qforge
// layer (graph_rewrite.h); those layers are registered here under their module paths, so the
// public API works on it unchanged: quantize (Scheme rules by path), Calibration, QatController,
// freeze, model_size, describe, io::save_model. save() writes TorchScript again, which runs
// wherever libqforge (or libqforge_torchscript.so in Python) is loaded. docs/torchscript.md.
#pragma once

#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <utility>
#include <vector>

#include "framework/jit/graph_rewrite.h"

namespace qforge::jit {

class ScriptedModel;
ScriptedModel load_torchscript(const std::string& path);

class ScriptedModelImpl : public torch::nn::Module {
 public:
  // Only load_torchscript() makes one: the module must be freshly loaded, because LibTorch keeps
  // running the graph a forward already compiled, not the rewritten one (the output would stay
  // float while the layers report quantized).
  class FreshlyLoaded {
    FreshlyLoaded() = default;
    friend ScriptedModel load_torchscript(const std::string& path);
  };

  // Takes `script` (as torch::jit::load returns it) and rewrites its forward in place. A file
  // saved by save() is taken as it is: its qforge layers come back quantized / frozen as saved.
  ScriptedModelImpl(torch::jit::Module script, FreshlyLoaded);

  // The TorchScript module's forward (one tensor in, one tensor out; or any inputs).
  at::Tensor forward(const at::Tensor& x);
  c10::IValue forward(std::vector<c10::IValue> inputs);

  // Training mode of both the qforge layers and the TorchScript module (dropout, BatchNorm).
  void train(bool on = true) override;

  // Only the CPU and float32 for now: a move would reach the qforge layers and the script's
  // registered parameters and buffers, but not tensors the graph holds as constants. Others throw.
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  // The TorchScript module's parameters its forward reads (the qforge layers' float weights and
  // biases are these same tensors) followed by qforge's own trainable ones (a folded conv's bias,
  // LSQ scales): what a QAT optimizer takes.
  std::vector<at::Tensor> trainable_parameters();

  // Saves the TorchScript module. Frozen layers' float weights are released from it first (the
  // module's attribute becomes an empty tensor): the file holds their packed weights only.
  void save(const std::string& path);

  // qforge::describe's table plus graph_notes().
  std::string describe(bool planned = false) const;
  // One line per BatchNorm folded at load, per call sharing a tied weight's layer, per pair of
  // convolutions chained through int8 codes, per residual addition fused into a convolution, and
  // per call left float, with the reason.
  std::string graph_notes() const;

  const std::vector<c10::intrusive_ptr<ScriptedLayer>>& layers() const { return layers_; }
  const std::vector<FloatCall>& kept_float() const { return kept_float_; }
  // {BatchNorm path, convolution path} of each BatchNorm folded at load (empty for a file save() wrote).
  const std::vector<std::pair<std::string, std::string>>& folded() const { return folded_; }
  // Calls that run another call's qforge layer (a tied LM head on the embedding table), found at
  // load (empty for a file save() wrote).
  const std::vector<TiedCall>& tied() const { return tied_; }
  // Convolutions passing int8 codes to the next through a ReLU / ReLU6 once frozen (a saved
  // file's chains included).
  const std::vector<ChainedCall>& chained() const { return chained_; }
  // Convolutions whose output plus a residual (and a ReLU) run in their epilogue once frozen (a
  // saved file's included).
  const std::vector<ResidualCall>& residual_adds() const { return residual_; }
  // aten::max_pool2d calls routed to qforge::max_pool2d (conv_chain.h, route_max_pools).
  int64_t max_pools() const { return max_pools_; }
  torch::jit::Module& script() { return script_; }

 private:
  // The TorchScript module's attribute at dotted module path `owner`, name `attr`.
  void set_script_attr(const std::string& owner, const std::string& attr, const at::Tensor& value);

  // Registers the script's parameters and buffers the forward reads, other than the qforge
  // layers' weights and biases, as this module's own (the same tensors): parameters(),
  // io::save_model / load_model and to() see them. One of a module whose layer has the module's
  // path is registered beside that layer (outside_layers: "attn_temperature").
  void register_script_tensors();

  // Empties the script's tensor attribute at owner.attr and every other attribute holding that
  // same tensor (a frozen layer's float weight leaves the saved file).
  void release_script_tensor(const std::string& owner, const std::string& attr);

  torch::jit::Module script_;
  std::vector<c10::intrusive_ptr<ScriptedLayer>> layers_;
  std::vector<FloatCall> kept_float_;
  std::vector<std::pair<std::string, std::string>> folded_;
  std::vector<TiedCall> tied_;
  std::vector<ChainedCall> chained_;
  std::vector<ResidualCall> residual_;
  int64_t max_pools_ = 0;
};

TORCH_MODULE(ScriptedModel);

// torch::jit::load(path) on the CPU, then ScriptedModel. Throws qforge::Error naming the file when
// it is missing or not TorchScript.
ScriptedModel load_torchscript(const std::string& path);

}  // namespace qforge::jit
