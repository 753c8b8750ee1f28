// Quantizer: one quantization point of a layer (its weight, or its input activation). It owns the
// observer, the qparams the observer produced (buffers "scale" and "zero_point", or learnable
// parameters of the same names under LSQ) and the fake-quant step of PTQ evaluation and QAT.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <vector>

#include "framework/core/qparams.h"
#include "observers/observer.h"

namespace qforge {

// How a layer's input activations are quantized.
enum class ActivationMode : uint8_t {
  kNone,             // float activations (weight-only quantization)
  kStatic,           // scale calibrated once from data (observer), fixed at inference
  kDynamicPerToken,  // symmetric scale per row computed on every call (amax / qmax; int8: amax / 127)
};
const char* to_string(ActivationMode m);
ActivationMode activation_mode_from_name(const std::string& name);
std::vector<std::string> activation_mode_names();  // "none", "static", "dynamic_per_token"

// How one point is quantized: grid, granularity, observer, learnable or not.
struct QuantizerConfig {
  QSpec spec;
  std::string observer = "minmax";  // static activations only; weights use their own min/max
  ObserverOptions observer_options;
  bool lsq = false;                 // learnable scale (and zero point when affine)
  // kDynamicPerToken only: each row's scale is clip_ratio · amax / qmax, so values beyond
  // clip_ratio · amax saturate and the rest get a finer step (QuaRot clips 4-bit rows at 0.9).
  // In (0, 1]; 1: the whole amax. No integer kernel takes it: freeze() refuses a layer with it.
  float clip_ratio = 1.0f;
};

class QuantizerImpl : public torch::nn::Module {
 public:
  enum class Role : uint8_t { kWeight, kActivation };

  QuantizerImpl(Role role, QuantizerConfig config, ActivationMode mode, std::string path);

  // Weight: fake-quantized weight (STE or LSQ). Activation: observes and/or fake-quantizes
  // according to the flags below; returns x unchanged while only observing.
  at::Tensor forward(const at::Tensor& x);

  // QParams in force: static activations after calibration, LSQ parameters, or the weight's
  // (`weight` is required for non-learnable weight quantizers).
  QParams qparams(const at::Tensor& weight = {}) const;
  // Per-row symmetric qparams of kDynamicPerToken for x viewed as [rows, K], on the narrow signed
  // grid of `qtype` (qint8 [-127, 127], qint4 [-7, 7], qint3 [-3, 3], qint2 [-1, 1]):
  //   scale = amax > 0 ? (amax · clip_ratio) / qmax : 1   (float32 on the CPU; the product only
  //   when clip_ratio is not 1), zero point 0.
  static QParams dynamic_qparams(const at::Tensor& x2d, const QType& qtype = qint8, float clip_ratio = 1.0f);
  // The signed integer qtypes dynamic per-token activations take (qint8, qint4, qint3, qint2).
  static bool dynamic_qtype_supported(const QType& qtype);
  // The largest code of that narrow grid (qint8 127, qint4 7, qint3 3, qint2 1): the rows' scale
  // is amax / dynamic_qmax, what the integer kernels quantize rows with (quantize_rows_s8's qmax).
  static int dynamic_qmax(const QType& qtype);

  // Calibration: observe without fake-quantizing. QAT/eval: fake-quantize; observe while training
  // unless the observer is frozen.
  void set_observing(bool on) { observing_ = on; }
  void set_fake_quant(bool on) { fake_quant_ = on; }
  void freeze_observer() { observer_frozen_ = true; }
  bool observing() const { return observing_; }
  bool fake_quant() const { return fake_quant_; }
  bool observer_frozen() const { return observer_frozen_; }

  // Observer → "scale"/"zero_point" buffers. Throws when the observer saw nothing.
  void compute_qparams();
  // Sets the static qparams directly (loading a calibration dump or checkpoint). On a weight
  // quantizer it fixes the weight's grid (per-channel / per-group shapes kept): qparams() stops
  // following the weight's min/max. The PTQ solvers (GPTQ, AdaRound) fix the grid they rounded
  // onto, so the solved weight fake-quantizes and freezes to exactly the codes they chose.
  void set_qparams(const QParams& qp);
  // Frozen layers hold their grid in the packed weight: a weight's fixed scale / zero_point go back
  // to the uncalibrated scalar defaults (not saved). Codebook and LSQ quantizers are kept.
  void drop_fixed_grid();
  // Codebook weights (qkmeans4/3/2): k-means on `w` (kmeans_1d, levels rounded to float16) fixes
  // the codebook, the learnable parameter "codebook" (codebook_shape). `importance` weighs each
  // weight element in the k-means objective: the inputs' energy E[x_k^2] per input feature (the
  // diagonal of the layer's Hessian XᵀX / N), shaped as one output channel of w (w.sizes()[1:],
  // or [in_features] for Linear); undefined: every element counts 1. Not for other qtypes.
  void fit_codebook(const at::Tensor& w, const at::Tensor& importance = {});
  // Sets the codebook directly (a checkpoint's): float values of codebook_shape, float16-exact.
  void set_codebook(const at::Tensor& levels);
  // The learnable codebook parameter (empty until fitted or set). Codebook qtypes only.
  const at::Tensor& codebook() const { return codebook_; }

  // Has usable static qparams: calibrated, loaded, or learned by LSQ (weights: a fixed grid).
  bool calibrated() const { return calibrated_ || lsq_initialised_; }
  // True once LSQ turned scale / zero_point into learnable parameters.
  bool lsq_initialised() const { return lsq_initialised_; }
  // Every mode switch drops the eval-mode weight cache: the weight's version counter cannot see
  // optimizers that update through .data() (torch::optim::SGD), so training must not leave it stale.
  void train(bool on = true) override;
  // The eval-mode weight cache: on by default. Off, each forward fake-quantizes the weight afresh
  // and keeps nothing; turning it off drops the cache. pause / resume: qforge::Calibration pauses
  // it while alive (so its forwards never hold a fake-quantized copy of every weight at once),
  // counted, so overlapping guards and a cache the caller turned off are left as they were.
  void set_weight_cache(bool on) {
    weight_cache_ = on;
    if (!on) clear_cache();
  }
  void pause_weight_cache() {
    ++cache_pauses_;
    clear_cache();
  }
  void resume_weight_cache() {
    if (cache_pauses_ > 0) --cache_pauses_;
  }
  bool weight_cache() const { return weight_cache_ && cache_pauses_ == 0; }
  // An Embedding's lookup with the cache off: fake_quantize(w, qparams(w)).index_select(0, index)
  // computed on the looked-up rows alone (qparams from the whole table, the same values), where
  // the grid allows it: a 2-D weight quantized per tensor, per row (per channel on axis 0) or per
  // group, not LSQ, not a codebook or microscaling, no gradient, eval mode. Undefined otherwise
  // (the caller fake-quantizes the whole table). index: any integer tensor, flattened.
  at::Tensor weight_rows(const at::Tensor& w, const at::Tensor& index);
  // Drops the eval-mode cache (and so its reference to the float weight).
  void clear_cache() {
    cached_w_ = at::Tensor();
    cached_wq_ = at::Tensor();
    cached_storage_ = c10::Storage();
    cached_offset_ = -1;
    cached_version_ = -1;
  }

  Role role() const { return role_; }
  ActivationMode mode() const { return mode_; }
  const QuantizerConfig& config() const { return config_; }
  const std::string& path() const { return path_; }

  // torch::save reaches every submodule through Module::save, and LibTorch's archive would keep
  // only the float tensors (a calibrated model loads back float, a frozen one not at all): it
  // throws instead, naming qforge::io::save_model, before anything is written.
  void save(torch::serialize::OutputArchive& archive) const override;
  Observer* observer() { return observer_.get(); }
  const Observer* observer() const { return observer_.get(); }

 private:
  at::Tensor weight_forward(const at::Tensor& w);
  QParams weight_grid(const at::Tensor& w) const;  // the fixed grid once set, else the weight's min/max
  at::Tensor activation_forward(const at::Tensor& x);
  at::Tensor lsq_forward(const at::Tensor& x);
  void init_lsq(const at::Tensor& x);

  Role role_;
  QuantizerConfig config_;
  ActivationMode mode_;
  std::string path_;
  std::unique_ptr<Observer> observer_;
  at::Tensor scale_, zero_point_;  // buffers, or parameters under LSQ
  at::Tensor codebook_;            // parameter of codebook qtypes (their levels)
  bool observing_ = false;
  bool fake_quant_ = true;
  bool observer_frozen_ = false;
  bool calibrated_ = false;
  bool lsq_initialised_ = false;
  bool weight_cache_ = true;
  int cache_pauses_ = 0;
  // Eval-mode cache of the fake-quantized weight, keyed on the weight's TensorImpl, its storage
  // (set_data swaps it under the same TensorImpl and version; held, so its address cannot be
  // handed to another tensor while cached), its storage offset and its version.
  at::Tensor cached_w_, cached_wq_;
  c10::Storage cached_storage_;
  int64_t cached_offset_ = -1;
  int64_t cached_version_ = -1;
  int64_t cached_cb_version_ = -1;
};

TORCH_MODULE(Quantizer);

// The float16 levels k-means fits to a codebook weight `w` under `spec` (what
// Quantizer::fit_codebook sets), codebook_shape; `importance` as there. `who` names the weight.
at::Tensor codebook_levels(const at::Tensor& w, const at::Tensor& importance, const QSpec& spec,
                           const std::string& who);

// Rounds positive float32 scales up to the nearest IEEE float16 value. Scales of nibble-packed
// weights (qint4, quint4, qint3) are stored as float16 in the packed int4 layout; rounding up (never down) keeps every value inside
// the grid.
at::Tensor round_scale_up_to_half(const at::Tensor& scale);

// A weight's min/max qparams under `spec`, as a non-learnable weight quantizer computes them
// (4-bit scales rounded up to float16). `who` names the weight in errors.
QParams weight_minmax_qparams(const at::Tensor& weight, const QSpec& spec, const std::string& who);

// Reshapes a per-channel / per-group qparam tensor so it broadcasts against x.
at::Tensor broadcast_qparam(const at::Tensor& t, const at::Tensor& x, const QSpec& spec);
// x [..., K] viewed as [..., K / group_size, group_size] for per-group specs (x itself otherwise):
// the shape broadcast_qparam's per-group qparams apply to.
at::Tensor grouped(const at::Tensor& x, const QSpec& spec);

// Integer grid values q = clamp(rint(x * (1/s)) + z, qmin, qmax) as int8 (integer grids up to 8
// bits), the same values fake_quantize dequantizes: (q - z) * s == fake_quantize(x). Per-tensor
// with z = 0 on the CPU it runs kernels::quantize_static_s8 (one pass, threaded, bit-identical)
// and throws qforge::Error on NaN / Inf; otherwise ATen ops.
at::Tensor quantize_to_int8(const at::Tensor& x, const QParams& qp);
// (q - z) * s for integer values q (any integer dtype).
at::Tensor dequantize_int(const at::Tensor& q, const QParams& qp);

}  // namespace qforge
