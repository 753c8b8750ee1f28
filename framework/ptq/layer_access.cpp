// LayerAccess: Linear / Conv1d / Conv2d as [N, K] weights and [rows, K] inputs.
#include "framework/ptq/layer_access.h"
#include "framework/ptq/float_view.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"
#include "framework/nn/conv.h"
#include "framework/nn/linear.h"

namespace qforge::ptq {

namespace {

template <size_t D, class Options>
std::string conv_unfit(const Options& o) {
  if (o.groups() != 1) return "grouped convolution (groups = " + std::to_string(o.groups()) + ")";
  if (!nn::variant_if<torch::enumtype::kZeros>(&o.padding_mode())) return "padding mode other than zeros";
  if (!nn::variant_if<torch::ExpandingArray<D>>(&o.padding()) && !nn::variant_if<torch::enumtype::kValid>(&o.padding()))
    return "padding 'same'";
  return "";
}

template <size_t D, class Options>
void conv_geometry(const Options& o, LayerAccess& a) {
  auto vec = [](const torch::ExpandingArray<D>& e) { return std::vector<int64_t>(e->begin(), e->end()); };
  a.kernel = vec(o.kernel_size());
  a.stride = vec(o.stride());
  a.dilation = vec(o.dilation());
  if (const auto* p = nn::variant_if<torch::ExpandingArray<D>>(&o.padding())) a.padding = vec(*p);
  else a.padding = std::vector<int64_t>(D, 0);
  if constexpr (D == 1) {
    // Conv1d runs as a 2-D convolution of height 1.
    a.kernel.insert(a.kernel.begin(), 1);
    a.stride.insert(a.stride.begin(), 1);
    a.dilation.insert(a.dilation.begin(), 1);
    a.padding.insert(a.padding.begin(), 0);
  }
}

}  // namespace

std::string solvable(const std::string&, const QuantizableLayer& layer) {
  const torch::nn::Module& m = layer.module();
  if (m.as<nn::LinearImpl>()) return "";
  if (const auto* c = m.as<nn::Conv2dImpl>()) return conv_unfit<2>(c->options);
  if (const auto* c = m.as<nn::Conv1dImpl>()) return conv_unfit<1>(c->options);
  return std::string(layer.layer_type()) + " layers are not solved (Linear, Conv1d and Conv2d are)";
}

LayerAccess access(QuantizableLayer& layer) {
  const std::string why = solvable(layer.path(), layer);
  QF_REQUIRE(why.empty(), layer.path(), ": ", why);
  LayerAccess a;
  a.layer = &layer;
  torch::nn::Module& m = layer.module();
  if (auto* l = m.as<nn::LinearImpl>()) {
    a.kind = LayerAccess::Kind::kLinear;
    a.weight = l->weight;
    if (l->options.bias()) a.bias = l->bias;
  } else if (auto* c2 = m.as<nn::Conv2dImpl>()) {
    a.kind = LayerAccess::Kind::kConv2d;
    a.weight = c2->weight;
    if (c2->options.bias()) a.bias = c2->bias;
    conv_geometry<2>(c2->options, a);
  } else if (auto* c1 = m.as<nn::Conv1dImpl>()) {
    a.kind = LayerAccess::Kind::kConv1d;
    a.weight = c1->weight;
    if (c1->options.bias()) a.bias = c1->bias;
    conv_geometry<1>(c1->options, a);
  }
  QF_REQUIRE(a.weight.defined(), layer.path(), ": the layer holds no float weight (frozen?)");
  return a;
}

at::Tensor LayerAccess::rows(const at::Tensor& x) const {
  if (kind == Kind::kLinear) return x.reshape({-1, weight.size(1)});
  const at::Tensor x4 = kind == Kind::kConv1d ? x.unsqueeze(-2) : x;
  const at::Tensor batched = x4.dim() == 3 ? x4.unsqueeze(0) : x4;  // unbatched input
  // [B, C·kh·kw, L] in the weight's (C, kh, kw) order.
  const at::Tensor cols = at::im2col(batched, kernel, dilation, padding, stride);
  return cols.transpose(1, 2).reshape({-1, cols.size(1)});
}

void LayerAccess::set_w2d(const at::Tensor& w) const {
  at::NoGradGuard g;
  weight.copy_(w.reshape(weight.sizes()));
}

}  // namespace qforge::ptq

namespace qforge::ptq {

ScopedInputTaps::ScopedInputTaps(std::vector<QuantizableLayer*> layers, const QuantizableLayer::InputTap& tap)
    : layers_(std::move(layers)) {
  for (QuantizableLayer* l : layers_) l->set_input_tap(tap);
}

ScopedInputTaps::~ScopedInputTaps() {
  for (QuantizableLayer* l : layers_) l->set_input_tap(nullptr);
}

// ---- FloatView (framework/ptq/float_view.h) ----

namespace {
std::vector<Quantizer> model_quantizers(const torch::nn::Module& model) {
  std::vector<Quantizer> out;
  for (const auto& [path, layer] : quantizable_layers(model))
    for (Quantizer q : layer->quantizers()) out.push_back(q);
  return out;
}
}  // namespace

FloatView::FloatView(const torch::nn::Module& model) : FloatView(model_quantizers(model)) {}

FloatView::FloatView(const std::vector<Quantizer>& quantizers) {
  for (Quantizer q : quantizers) {
    saved_.push_back({q, q->fake_quant(), q->observing()});
    q->set_fake_quant(false);
    q->set_observing(false);
  }
}

FloatView::~FloatView() {
  for (Saved& s : saved_) {
    s.q->set_fake_quant(s.fake_quant);
    s.q->set_observing(s.observing);
  }
}

}  // namespace qforge::ptq
