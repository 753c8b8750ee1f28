// Shared quantizer plumbing of the qforge layers.
#include "framework/nn/quantizable.h"

#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <ATen/CPUGeneratorImpl.h>

#include <ATen/ATen.h>

#include "framework/core/error.h"

namespace qforge {

void QuantizableLayer::check_scheme(const LayerScheme& scheme) const {
  if (scheme.weights) {
    QF_REQUIRE(has_weight(), path_, " (", layer_type(), "): has no weight to quantize");
  }
  if (scheme.activations == ActivationMode::kDynamicPerToken) {
    QF_REQUIRE(QuantizerImpl::dynamic_qtype_supported(scheme.activation.spec.qtype) &&
                   scheme.activation.spec.symmetric,
               path_, " (", layer_type(), "): dynamic per-token activations are symmetric signed integers (qint8, "
               "qint4, qint3, qint2), got ", scheme.activation.spec.qtype.name,
               scheme.activation.spec.symmetric ? "" : " asymmetric");
  }
  QF_REQUIRE(scheme.activation.clip_ratio > 0.0f && scheme.activation.clip_ratio <= 1.0f &&
                 (scheme.activation.clip_ratio == 1.0f || scheme.activations == ActivationMode::kDynamicPerToken),
             path_, " (", layer_type(), "): activation clip_ratio ", scheme.activation.clip_ratio,
             " needs dynamic per-token activations and a value in (0, 1]");
}

void QuantizableLayer::require_not_frozen(const char* what) const {
  QF_REQUIRE(!frozen_, path_, " (", layer_type(), "): cannot ", what, " a frozen layer");
}

void QuantizableLayer::attach(const std::string& path, const LayerScheme& scheme) {
  require_not_frozen("re-quantize");
  path_ = path;
  check_scheme(scheme);
  auto& m = module();
  detach();
  scheme_ = scheme;
  if (scheme.weights) {
    weight_q_ = Quantizer(QuantizerImpl::Role::kWeight, *scheme.weights, ActivationMode::kNone,
                          path + ".weight");
    m.register_module("weight_quantizer", weight_q_);
  }
  if (scheme.activations != ActivationMode::kNone) {
    input_q_ = Quantizer(QuantizerImpl::Role::kActivation, scheme.activation, scheme.activations,
                         path + "." + (std::string(activation_quantizer_name()) == "input_quantizer" ? "input" : "output"));
    m.register_module(activation_quantizer_name(), input_q_);
  }
  // A new quantizer starts in the module's current mode.
  if (weight_q_) weight_q_->train(m.is_training());
  if (input_q_) input_q_->train(m.is_training());
  on_attach();
  kernel_ = "fake_quant";
  fallback_.clear();
}

void QuantizableLayer::freeze() {
  if (frozen_) return;
  QF_REQUIRE(quantized(), path_, " (", layer_type(), "): freeze() needs quantize() first");
  QF_REQUIRE(uncalibrated().empty(), path_, " (", layer_type(), "): static activations were never calibrated");
  QuantizedTensor fw;
  at::Device device = at::kCPU;
  if (has_weight()) {
    QF_REQUIRE(weight_q_, path_, " (", layer_type(),
               "): freezing needs quantized weights (activation-only schemes stay fake-quant)");
    const at::Tensor w = float_weight();
    device = w.device();
    // A codebook no forward fitted yet is fitted now and kept (its quantizer then holds the levels
    // the packed weight uses, as after any fake-quant forward).
    if (weight_q_->config().spec.qtype.is_codebook() && !weight_q_->calibrated()) weight_q_->fit_codebook(w);
    QParams qp = weight_q_->qparams(w);
    // Packing happens on the CPU, whatever device the layer is on.
    if (qp.codebook.defined()) {
      qp.codebook = qp.codebook.to(at::kCPU);
    } else {
      qp.scale = qp.scale.to(at::kCPU);
      qp.zero_point = qp.zero_point.to(at::kCPU);
      // Learned (LSQ) 4-bit scales are rounded up to float16 here, as min/max scales already are.
      if (nibble_packed(qp.spec.qtype)) qp.scale = round_scale_up_to_half(qp.scale);
    }
    fw = quantize_tensor(w.to(at::kCPU), qp);
  }
  install_frozen(std::move(fw));
  // A layer frozen on a GPU goes back there: its to() places the frozen storage (Linear uploads
  // the codes its CUDA kernels read).
  if (!device.is_cpu()) module().to(device);
}

std::vector<Quantizer> QuantizableLayer::quantizers() const {
  std::vector<Quantizer> out;
  if (weight_q_) out.push_back(weight_q_);
  if (input_q_) out.push_back(input_q_);
  return out;
}

void QuantizableLayer::detach() {
  require_not_frozen("detach");
  auto& m = module();
  for (const char* name : {"weight_quantizer", "input_quantizer", "output_quantizer", "other_quantizer"}) {
    const auto children = m.named_children();
    if (children.contains(name)) m.unregister_module(name);
  }
  on_detach();
  weight_q_ = Quantizer(nullptr);
  input_q_ = Quantizer(nullptr);
  scheme_ = LayerScheme{};
  kernel_ = "float";
}

void QuantizableLayer::check_optional_buffer(const std::string& name, const at::Tensor&) const {
  throw Error(path_ + " (" + layer_type() + "): has no optional buffer '" + name + "'");
}

void QuantizableLayer::set_optional_buffer(const std::string& name, const at::Tensor& value) {
  check_optional_buffer(name, value);
}

std::vector<std::string> QuantizableLayer::uncalibrated() const {
  std::vector<std::string> out;
  for (Quantizer q : quantizers())
    if (q->role() == QuantizerImpl::Role::kActivation && q->mode() == ActivationMode::kStatic &&
        !q->calibrated() && !q->lsq_initialised())
      out.push_back(q->path());
  return out;
}

LayerReport QuantizableLayer::report(bool planned) const {
  LayerReport r;
  r.name = path_;
  r.type = layer_type();
  r.weights = scheme_.weights ? scheme_.weights->spec.to_string() + (scheme_.weights->lsq ? " lsq" : "") : "float";
  if (scheme_.activations == ActivationMode::kNone) {
    r.activations = "float";
  } else if (scheme_.activations == ActivationMode::kDynamicPerToken) {
    // One scale per token (row), computed per call: the spec's granularity field does not apply.
    r.activations = std::string("dynamic ") + scheme_.activation.spec.qtype.name + " per_token" +
                    (scheme_.activation.spec.symmetric ? " symmetric" : " asymmetric");
    if (scheme_.activation.clip_ratio != 1.0f) r.activations += detail::str_cat(" clip ", scheme_.activation.clip_ratio);
  } else {
    r.activations = std::string(to_string(scheme_.activations)) + " " + scheme_.activation.spec.to_string();
    if (scheme_.activations == ActivationMode::kStatic)
      r.activations += scheme_.activation.lsq ? " (lsq)" : " (" + scheme_.activation.observer + ")";
  }
  if (planned && quantized() && !frozen_) {
    const KernelPlan p = plan();
    r.kernel = plan_kernel_text(p);
    r.fallback_reason = p.fallback;
  } else {
    r.kernel = kernel_;
    r.fallback_reason = fallback_;
  }
  r.fallback_reason = with_scheme_note(r.fallback_reason);
  r.bytes = storage_bytes();
  return r;
}

std::string QuantizableLayer::with_scheme_note(const std::string& fallback) const {
  if (scheme_.note.empty()) return fallback;
  return "scheme: " + scheme_.note + (fallback.empty() ? "" : "; " + fallback);
}

int64_t QuantizableLayer::storage_bytes() const {
  int64_t bytes = frozen_storage_bytes();
  // qforge layers are leaves: recursing adds exactly their quantizers' scale/zero_point.
  for (const auto& p : module().named_parameters(/*recurse=*/true)) bytes += p.value().nbytes();
  for (const auto& b : module().named_buffers(/*recurse=*/true)) bytes += b.value().nbytes();
  return bytes;
}

RngStateGuard::RngStateGuard() : state_(at::detail::getDefaultCPUGenerator().get_state()) {}
RngStateGuard::~RngStateGuard() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();  // shares the default generator
  gen.set_state(state_);
}

namespace {
// Copies `from` into a parameter of a fresh layer (same shape by construction).
void copy_param(at::Tensor& to, const at::Tensor& from) {
  if (!to.defined() || !from.defined()) return;
  at::NoGradGuard no_grad;
  to.copy_(from);
}
}  // namespace

void copy_float_parameters(at::Tensor& w_to, const at::Tensor& w_from, at::Tensor* b_to, const at::Tensor* b_from) {
  copy_param(w_to, w_from);
  if (b_to != nullptr && b_from != nullptr) copy_param(*b_to, *b_from);
}

void QuantizableLayer::mark_frozen() {
  frozen_ = true;
  const KernelPlan p = plan();
  kernel_ = plan_kernel_text(p);
  fallback_ = p.fallback;
  // The packed weight holds the grid a PTQ solver fixed; keeping it here too would double-count it.
  if (weight_q_) weight_q_->drop_fixed_grid();
}

void QuantizableLayer::refuse_clone() const {
  throw Error(detail::str_cat(path_.empty() ? std::string("(root)") : path_, " (", layer_type(),
                              "): clone() is not supported for qforge layers (it would copy the LibTorch "
                              "base without quantizers); build a new model and load a checkpoint "
                              "(io::save_model / io::load_model)"));
}

void QuantizableLayer::refuse_torch_load_if_quantized() const {
  if (!quantized() && !frozen()) return;
  throw Error(detail::str_cat("torch::load: ", path_.empty() ? std::string("(root)") : path_, " (", layer_type(), ") is ",
                              frozen() ? "frozen" : "quantized",
                              "; LibTorch's archive holds float tensors only: load quantized and frozen models with "
                              "qforge::io::load_model (and save them with qforge::io::save_model)"));
}

std::vector<std::pair<std::string, QuantizableLayer*>> quantizable_layers(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, QuantizableLayer*>> out;
  // include_self=false: the root may live on the stack (no shared_ptr to hand out).
  auto* root = const_cast<torch::nn::Module*>(&model);
  if (auto* layer = dynamic_cast<QuantizableLayer*>(root)) out.emplace_back(std::string(), layer);
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* m = const_cast<torch::nn::Module*>(item.value().get());
    if (auto* layer = dynamic_cast<QuantizableLayer*>(m)) out.emplace_back(item.key(), layer);
  }
  return out;
}

namespace {

// The LibTorch layer types that have a qforge twin, by the twin's name.
const char* plain_type(const torch::nn::Module& m) {
  if (dynamic_cast<const QuantizableLayer*>(&m)) return nullptr;  // qforge layers derive from them privately
  if (dynamic_cast<const torch::nn::LinearImpl*>(&m)) return "Linear";
  if (dynamic_cast<const torch::nn::Conv1dImpl*>(&m)) return "Conv1d";
  if (dynamic_cast<const torch::nn::Conv2dImpl*>(&m)) return "Conv2d";
  if (dynamic_cast<const torch::nn::EmbeddingImpl*>(&m)) return "Embedding";
  if (dynamic_cast<const torch::nn::LayerNormImpl*>(&m)) return "LayerNorm";
  return nullptr;
}

}  // namespace

std::vector<PlainLayer> plain_libtorch_layers(const torch::nn::Module& model) {
  std::vector<PlainLayer> out;
  if (const char* t = plain_type(model)) out.push_back({std::string(), t, &model});
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (const char* t = plain_type(*item.value())) out.push_back({item.key(), t, item.value().get()});
  return out;
}

std::string PlainLayer::reason() const {
  return std::string("torch::nn::") + type + " is a LibTorch layer, not a qforge layer: it stays float (use qforge::nn::" +
         type + ")";
}

std::string quantization_point(const std::string& layer_path, const Quantizer& q) {
  const std::string& p = q->path();
  if (!layer_path.empty() && p.size() > layer_path.size() && p.compare(0, layer_path.size(), layer_path) == 0 &&
      p[layer_path.size()] == '.')
    return p.substr(layer_path.size() + 1);
  const size_t dot = p.rfind('.');
  return dot == std::string::npos ? p : p.substr(dot + 1);
}

}  // namespace qforge
