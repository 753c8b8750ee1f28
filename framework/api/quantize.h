// The public API, quanto-style:
//   qforge::quantize(model, qforge::qint8);           // attach quantizers to every qforge layer
//   { qforge::Calibration calib(*model); run(data); } // static activations: observe, then scales
//   qforge::freeze(*model);                           // packed integer weights, integer kernels
// plus QAT switches, model_size / estimate_memory and describe().
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "framework/api/kv_cache_scheme.h"
#include "framework/api/module_like.h"
#include "framework/api/scheme.h"

namespace qforge {

struct QuantizeReport {
  struct Entry {
    std::string path;
    std::string type;
    LayerScheme scheme;
    int rule = -1;      // index of the rule that matched, -1 for the scheme's defaults
    std::string note;   // adjustments made for this layer (e.g. group size fell back)
  };
  std::vector<Entry> quantized;
  std::vector<std::string> kept_float;  // qforge layers a keep-float rule (or the scheme) left alone
  std::vector<std::string> warnings;    // rules that matched nothing, adjustments
  // Float ops worth knowing about: a torch::nn::BatchNorm2d after a quantized Conv2d (fold it).
  std::vector<std::string> notes;
};

// Walks named_modules(), attaches quantizers to every qforge layer the scheme selects (replacing
// earlier ones: quantizing twice replaces the scheme). Warnings and notes go to the report and to
// stderr. A model holding plain LibTorch layers with a qforge twin (torch::nn::Linear, Conv1d,
// Conv2d, Embedding, LayerNorm) is refused with one error listing each (path, type, the way out),
// nothing attached; Scheme::allow_float_layers keeps them float with a warning each instead.
QuantizeReport quantize(torch::nn::Module& model, const Scheme& scheme);
template <class Holder, class = ModuleLike<Holder>>
QuantizeReport quantize(Holder& model, const Scheme& scheme) {
  return quantize(detail::module_of(model), scheme);
}

// RAII calibration (quanto's `with Calibration()`): while alive, forward passes feed the static
// activation observers (no fake-quant of activations, no gradients; each weight fake-quantized
// afresh on every forward with its eval-mode cache off, so memory stays near the float model's
// rather than holding a second copy of every weight) and the key/value ranges of
// a static KV-cache scheme (kv_static_scales.h; attention then reads float keys and values);
// finish() or destruction turns observations into scales. finish() throws naming quantizers and
// KV caches that saw no data (such a cache keeps the scheme it had); the destructor prints that instead.
// The guard refers to the model's KV-cache modules: destroy (or finish) it before the model.
class Calibration {
 public:
  explicit Calibration(torch::nn::Module& model);
  template <class Holder, class = ModuleLike<Holder>>
  explicit Calibration(Holder& model) : Calibration(detail::module_of(model)) {}
  ~Calibration();
  Calibration(const Calibration&) = delete;
  Calibration& operator=(const Calibration&) = delete;
  void finish();

 private:
  struct KvCacheCalibration {
    std::string path;
    KvCacheModel* model;
    KvCacheScheme before;  // restored when no token reached a layer
    std::shared_ptr<KvRangeObserver> observer;  // the one this guard attached
  };
  std::vector<Quantizer> quantizers_;
  std::vector<Quantizer> uncached_;  // weight quantizers whose cache this guard paused
  std::vector<KvCacheCalibration> kv_caches_;
  at::NoGradGuard no_grad_;
  bool done_ = false;
};

// QAT bookkeeping: call step() once per optimizer step. After `freeze_observers_after` steps the
// activation observers stop updating (their last qparams stay); after `freeze_bn_after` steps
// BatchNorm layers are kept in eval mode (running statistics fixed). -1 never freezes.
struct QatOptions {
  int64_t freeze_observers_after = -1;
  int64_t freeze_bn_after = -1;
};
class QatController {
 public:
  QatController(torch::nn::Module& model, QatOptions options);
  // Puts the model in training mode with observers updating (unless frozen).
  void begin_epoch();
  void step();
  int64_t steps() const { return steps_; }

 private:
  void apply();
  torch::nn::Module& model_;
  QatOptions options_;
  int64_t steps_ = 0;
};

// Packs every quantized layer and every RPQ layer (nn::RPQLayer::freeze). Checks first, changes
// nothing on error: static activations never calibrated are listed by name in the error, RPQ
// layers off the CPU too; a model with no quantized or RPQ layer at all is an error (nothing would
// shrink). Freezing a model already frozen does nothing.
void freeze(torch::nn::Module& model);
template <class Holder, class = ModuleLike<Holder>>
void freeze(Holder& model) {
  freeze(detail::module_of(model));
}

struct ModelSize {
  struct Layer {
    std::string name;
    std::string kind;  // "float", "fake_quant", "frozen", "rpq" (codebooks + uint8 indices + bias)
    int64_t bytes = 0;
  };
  std::vector<Layer> layers;  // every module that owns tensors
  int64_t total_bytes = 0;
  int64_t float_bytes = 0;      // float parameters and buffers
  int64_t quantized_bytes = 0;  // packed weights, scales and zero points of frozen layers; RPQ layers' codebooks and indices
};
ModelSize model_size(const torch::nn::Module& model);
template <class Holder, class = ModuleLike<Holder>>
ModelSize model_size(const Holder& model) {
  return model_size(detail::module_of(model));
}

// Bytes to store num_params weights of `qtype` (packed), plus float32 scales (and one byte of zero
// point per scale when affine) for per-group (group_size > 0) or per-channel (channels > 0).
// Codebook qtypes: nibble (qkmeans4/3) or 2-bit (qkmeans2) indices plus 2^bits float16 levels per
// codebook. Microscaling qtypes: nibbles plus one scale byte per block (group_size), and nvfp4's
// float32 tensor scale.
int64_t estimate_memory(int64_t num_params, const QType& qtype, int64_t group_size = 0,
                        int64_t channels = 0, bool affine = false);

// What freeze() makes of `layer` under `ls`, built from a float copy (the layer is left alone):
// static activation scales set to 1 (bytes and kernels do not depend on them), LSQ steps created
// as QAT's first step creates them. Its storage_bytes() are the frozen layer's; the search times it.
// nullptr for a layer kind without float_copy().
std::shared_ptr<QuantizableLayer> frozen_copy(const QuantizableLayer& layer, const std::string& path,
                                              const LayerScheme& ls);

// The per-layer table: name, type, weights, activations, kernel, fallback reason, bytes.
// planned: the kernel and fallback each quantized layer's freeze() will use on this machine (its
// kernel plan) and the bytes it will hold (frozen_copy), without calibrating or freezing the
// model; frozen layers show their stored plan.
std::vector<LayerReport> layer_reports(const torch::nn::Module& model, bool planned = false);
std::string describe(const torch::nn::Module& model, bool planned = false);
template <class Holder, class = ModuleLike<Holder>>
std::vector<LayerReport> layer_reports(const Holder& model, bool planned = false) {
  return layer_reports(detail::module_of(model), planned);
}
template <class Holder, class = ModuleLike<Holder>>
std::string describe(const Holder& model, bool planned = false) {
  return describe(detail::module_of(model), planned);
}

}  // namespace qforge
