// QuantizableLayer: what every qforge layer adds to its LibTorch twin: quantizers for its weight
// and input (or output), the scheme it was given, freezing into packed integer storage, and the
// report line saying which kernel it runs and why it fell back.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "framework/api/kernel_plan.h"
#include "framework/api/quantized_tensor.h"
#include "framework/api/quantizer.h"

namespace qforge {

// What one layer is asked to do (resolved from a Scheme and its per-layer rules).
struct LayerScheme {
  std::optional<QuantizerConfig> weights;  // nullopt: float weights
  ActivationMode activations = ActivationMode::kNone;
  QuantizerConfig activation;              // for kStatic / kDynamicPerToken
  std::string note;  // where the layer got other than the scheme asked (e.g. per_channel for a group size that does not divide it)
  // Dynamic per-token rows clipped below their amax (QuantizerConfig::clip_ratio < 1). The layers
  // that take dynamic rows (Linear, MatMul) freeze with them: their CPU kernels clip as the
  // quantizer does.
  bool clips_rows() const {
    return activations == ActivationMode::kDynamicPerToken && activation.clip_ratio != 1.0f;
  }
};

// One line of describe(): how a layer was quantized and what runs it.
struct LayerReport {
  std::string name;
  std::string type;
  std::string weights;      // e.g. "qint8 per_channel(axis=0) symmetric" or "float"
  std::string activations;  // e.g. "static qint8 per_tensor symmetric (histogram)" or "float"
  std::string kernel;       // e.g. "gemv_u8s8s32_n16k4_avx512vnni", "fake_quant", "float"
  std::string fallback_reason;
  int64_t bytes = 0;        // parameter / packed storage bytes of this layer
};

class QuantizableLayer {
 public:
  virtual ~QuantizableLayer() = default;

  virtual const char* layer_type() const = 0;
  virtual torch::nn::Module& module() = 0;
  virtual const torch::nn::Module& module() const = 0;

  // Throws qforge::Error (naming the layer) for combinations this layer cannot run.
  virtual void check_scheme(const LayerScheme& scheme) const;
  // Creates the quantizers (replacing earlier ones) and registers them as submodules.
  void attach(const std::string& path, const LayerScheme& scheme);
  // Back to float: removes the quantizers (not allowed once frozen).
  void detach();

  // Packs the weights into integer storage, releases the float weight and switches forward to
  // the integer kernels. Throws (leaving the layer unchanged) when something is missing.
  void freeze();
  // Frozen state without the float weight: the packed weight (undefined QuantizedTensor for
  // weightless layers). install_frozen() rebuilds a frozen layer from it (checkpoint loading);
  // the layer must be attached with the saved scheme and calibrated first.
  virtual QuantizedTensor frozen_weight() const { return {}; }
  virtual void install_frozen(QuantizedTensor weight) = 0;
  // What freeze() makes this layer run on this machine, from its scheme and shapes alone (no
  // calibration, no weights needed): the kernel plan. freeze() stores it in kernel/fallback.
  virtual KernelPlan plan() const = 0;
  // Bias of a frozen layer, wherever its kernel keeps it (undefined when none).
  virtual at::Tensor frozen_bias() const { return {}; }
  // A new float layer of the same type and options holding copies of this layer's float
  // parameters (nullptr for layers without weights). The search quantizes and freezes such
  // copies to price each candidate with the code freeze() and model_size() run. The default
  // random generator is left as it was (construction initialises, then is overwritten).
  virtual std::shared_ptr<QuantizableLayer> float_copy() const { return nullptr; }
  // Buffers a layer registers only once a transform sets them (Linear: SmoothQuant's
  // "pre_quant_scale"). Loading a checkpoint that holds one creates it: check_optional_buffer()
  // validates before anything changes, set_optional_buffer() registers or replaces it.
  virtual std::vector<std::string> optional_buffers() const { return {}; }
  virtual void check_optional_buffer(const std::string& name, const at::Tensor& value) const;
  virtual void set_optional_buffer(const std::string& name, const at::Tensor& value);
  // Names of quantizers that must be calibrated before freeze() and are not.
  virtual std::vector<std::string> uncalibrated() const;
  // Every quantizer of the layer (for Calibration and QAT switches).
  virtual std::vector<Quantizer> quantizers() const;

  bool quantized() const { return weight_q_ || input_q_; }
  bool frozen() const { return frozen_; }
  const LayerScheme& scheme() const { return scheme_; }
  const std::string& path() const { return path_; }
  Quantizer weight_quantizer() const { return weight_q_; }
  Quantizer input_quantizer() const { return input_q_; }

  // The describe() line. planned: kernel and fallback from plan() instead of the current state
  // (the dry run's view of a model not frozen yet).
  virtual LayerReport report(bool planned = false) const;
  // A fallback reason prefixed with the scheme's note, where it has one (report lines).
  std::string with_scheme_note(const std::string& fallback) const;
  // Bytes of this layer's own parameters, buffers and packed storage (not its children's).
  virtual int64_t storage_bytes() const;

  // While on, every forward records its input's shape and dtype (the search reads them to time
  // each candidate's frozen kernel at the shape the layer really sees). Off by default.
  void record_inputs(bool on) { recording_ = on; }
  struct InputRecord {
    std::vector<int64_t> shape;  // empty: no forward recorded
    at::ScalarType dtype = at::kFloat;
  };
  const InputRecord& recorded_input() const { return recorded_; }

  // A callback every forward of a layer with weights calls first, with the input its weight
  // multiplies (after Linear's pre_quant_scale, before the input quantizer): the PTQ solvers
  // capture layer inputs with it. It may throw to end the model's forward early. Empty: none.
  using InputTap = std::function<void(QuantizableLayer&, const at::Tensor&)>;
  void set_input_tap(InputTap tap) { tap_ = std::move(tap); }

 protected:
  at::Tensor quantize_input(const at::Tensor& x) { return input_q_ ? input_q_->forward(x) : x; }
  // First thing of every forward of a layer with weights (see record_inputs).
  // True while something watches this layer's inputs (recording or a tap).
  bool input_watched() const { return recording_ || static_cast<bool>(tap_); }
  void note_input(const at::Tensor& x) {
    if (recording_) recorded_ = InputRecord{x.sizes().vec(), x.scalar_type()};
    if (tap_) tap_(*this, x);
  }
  at::Tensor quantize_weight(const at::Tensor& w) { return weight_q_ ? weight_q_->forward(w) : w; }
  void require_not_frozen(const char* what) const;
  // The end of every install_frozen(): frozen from here on, kernel and fallback from plan().
  void mark_frozen();
  // Throws qforge::Error: a clone would hold the LibTorch twin only, without quantizers.
  [[noreturn]] void refuse_clone() const;
  // torch::load into a quantized or frozen layer: LibTorch's archive holds float tensors only.
  void refuse_torch_load_if_quantized() const;
  // Where the input quantizer lives: "input_quantizer" (or "output_quantizer" for LayerNorm).
  virtual const char* activation_quantizer_name() const { return "input_quantizer"; }
  virtual bool has_weight() const { return true; }
  // The weight freeze() packs (undefined for weightless layers).
  virtual at::Tensor float_weight() const { return {}; }
  // Called at the end of attach() / detach() for layers with extra quantizers.
  virtual void on_attach() {}
  virtual void on_detach() {}
  // Extra bytes held by frozen storage (kernel objects) outside registered tensors.
  virtual int64_t frozen_storage_bytes() const { return 0; }

  LayerScheme scheme_;
  Quantizer weight_q_{nullptr};
  Quantizer input_q_{nullptr};
  std::string path_;
  bool frozen_ = false;
  std::string kernel_ = "float";
  std::string fallback_;
  bool recording_ = false;
  InputRecord recorded_;
  InputTap tap_;
};

// The qforge layers of `model` by module path, in named_modules() order, the root (path "") first
// when it is one. The one module walk: quantize, freeze, describe, calibration dumps, checkpoints
// and the search all go through it. Works for a root that lives on the stack.
std::vector<std::pair<std::string, QuantizableLayer*>> quantizable_layers(const torch::nn::Module& model);

// LibTorch layers with a qforge twin (torch::nn::Linear, Conv1d/2d, Embedding, LayerNorm) found
// in `model`, in named_modules() order. Members cannot be swapped in place (LibTorch calls typed
// members statically; nn::convert swaps those inside Sequentials), so quantize() refuses them
// (or warns with reason(), Scheme::allow_float_layers) and describe() lists them as float.
struct PlainLayer {
  std::string path;
  std::string type;  // "Linear", "Conv2d", ...
  const torch::nn::Module* module = nullptr;
  std::string reason() const;
};
std::vector<PlainLayer> plain_libtorch_layers(const torch::nn::Module& model);

// Calls fn(path, layer) for every qforge layer, as quantizable_layers() lists them.
template <class Fn>
void for_each_quantizable(torch::nn::Module& model, Fn&& fn) {
  for (const auto& [path, layer] : quantizable_layers(model)) fn(path, *layer);
}
template <class Fn>
void for_each_quantizable(const torch::nn::Module& model, Fn&& fn) {
  for (const auto& [path, layer] : quantizable_layers(model)) fn(path, static_cast<const QuantizableLayer&>(*layer));
}

// The point name of a layer's quantizer: "input" for the quantizer at "<layer path>.input"
// (the names calibration dumps and checkpoints use).
std::string quantization_point(const std::string& layer_path, const Quantizer& q);

// weight (and bias, when both are given) copied into a fresh layer's parameters without autograd.
void copy_float_parameters(at::Tensor& w_to, const at::Tensor& w_from, at::Tensor* b_to = nullptr,
                           const at::Tensor* b_from = nullptr);

// Keeps the default CPU random generator's state across a scope (layer construction draws from it).
class RngStateGuard {
 public:
  RngStateGuard();
  ~RngStateGuard();
  RngStateGuard(const RngStateGuard&) = delete;
  RngStateGuard& operator=(const RngStateGuard&) = delete;

 private:
  at::Tensor state_;
};

// Temporarily replaces a module's tensor member (its weight) so the LibTorch base forward runs
// unchanged on the fake-quantized tensor; restores it on scope exit.
class ScopedTensorSwap {
 public:
  ScopedTensorSwap(at::Tensor& slot, at::Tensor replacement) : slot_(slot), saved_(slot) {
    slot_ = std::move(replacement);
  }
  ~ScopedTensorSwap() { slot_ = saved_; }
  ScopedTensorSwap(const ScopedTensorSwap&) = delete;
  ScopedTensorSwap& operator=(const ScopedTensorSwap&) = delete;

 private:
  at::Tensor& slot_;
  at::Tensor saved_;
};

}  // namespace qforge
