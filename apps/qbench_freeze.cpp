// qbench case for freeze(): packing the Linear weights of a BERT-base-sized encoder (12 layers of
// 4 x 768x768 and 768x3072 + 3072x768, 85M weights) into int8 per-channel storage, beside
// LibTorch's own int8 packing of the same weights (quantize_per_channel + quantized::linear_prepack
// on oneDNN, what PyTorch's convert runs). qforge's figure includes float_copy() of every layer
// (freeze releases the float weight, so each call starts from a fresh copy); "qforge-copy" is
// that copy alone, to subtract. Bytes: the float weights read plus the int8 weights written.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/quantized/PackedParams.h>

#include <memory>
#include <vector>

#include "apps/qbench_registry.h"
#include "framework/nn/linear.h"
#include "framework/api/quantize.h"

namespace qforge::bench {
namespace {

constexpr int64_t kLayers = 12, kHidden = 768, kFfn = 3072;

std::vector<std::shared_ptr<nn::LinearImpl>> bert_base_linears() {
  std::vector<std::shared_ptr<nn::LinearImpl>> out;
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int i = 0; i < 4; ++i) out.push_back(std::make_shared<nn::LinearImpl>(kHidden, kHidden));
    out.push_back(std::make_shared<nn::LinearImpl>(kHidden, kFfn));
    out.push_back(std::make_shared<nn::LinearImpl>(kFfn, kHidden));
  }
  return out;
}

using PrepackFn = c10::intrusive_ptr<LinearPackedParamsBase>(at::Tensor, c10::optional<at::Tensor>);

std::vector<Case> cases() {
  auto layers = std::make_shared<std::vector<std::shared_ptr<nn::LinearImpl>>>(bert_base_linears());
  int64_t weights = 0;
  for (const auto& l : *layers) weights += l->weight.numel();
  Case c{"bert_base_85M", static_cast<double>(weights) * 5.0, {}};  // 4 B read + 1 B written
  c.impls.push_back({"libtorch", [layers] {
    at::globalContext().setQEngine(at::QEngine::ONEDNN);
    static auto prepack =
        c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_prepack", "").typed<PrepackFn>();
    at::NoGradGuard g;
    for (const auto& l : *layers) {
      const at::Tensor w = l->weight.detach();
      const at::Tensor scale = (w.abs().amax(1) / 127.0).clamp_min(1e-8).to(at::kDouble);
      const at::Tensor qw = at::quantize_per_channel(w, scale, at::zeros({w.size(0)}, at::kLong), 0, at::kQInt8);
      prepack.call(qw, l->bias.detach());
    }
  }});
  c.impls.push_back({"qforge", [layers] {
    for (const auto& l : *layers) {
      const std::shared_ptr<QuantizableLayer> copy = l->float_copy();
      quantize(copy->module(), qint8);
      copy->freeze();
    }
  }});
  c.impls.push_back({"qforge-copy", [layers] {
    for (const auto& l : *layers) l->float_copy();
  }});
  return {c};
}

const Register kFreeze(60, "freeze_int8_per_channel", cases);

}  // namespace
}  // namespace qforge::bench
