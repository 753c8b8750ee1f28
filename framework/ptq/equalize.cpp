// Cross-layer equalisation (Nagel et al. 2019, "Data-Free Quantization"): equal per-channel
// weight ranges across consecutive layers, checked against the float output.
#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <map>

#include "framework/core/error.h"
#include "framework/ptq/float_view.h"
#include "framework/ptq/layer_access.h"
#include "framework/ptq/ptq.h"

namespace qforge::ptq {

namespace {
constexpr double kEqualizeTolerance = 1e-4;  // relative change of the float output a pair may cause

// Per output channel of A and per input channel of B: max |w|.
at::Tensor out_ranges(const LayerAccess& a) { return a.w2d().detach().abs().amax(1); }
at::Tensor in_ranges(const LayerAccess& b) {
  const at::Tensor w = b.weight.detach();
  return w.transpose(0, 1).reshape({w.size(1), -1}).abs().amax(1);
}
double spread(const at::Tensor& r) {
  const at::Tensor pos = r.masked_select(r > 0);
  return pos.numel() == 0 ? 1.0 : (pos.max() / pos.min()).item<double>();
}
// Multiplies B's input channel i by s_i (the weight's dimension 1).
at::Tensor scale_inputs(const at::Tensor& w, const at::Tensor& s) {
  std::vector<int64_t> shape(static_cast<size_t>(w.dim()), 1);
  shape[1] = s.size(0);
  return w * s.reshape(shape);
}
at::Tensor scale_outputs(const at::Tensor& w, const at::Tensor& s) {
  std::vector<int64_t> shape(static_cast<size_t>(w.dim()), 1);
  shape[0] = s.size(0);
  return w * s.reshape(shape);
}
}  // namespace

EqualizeReport equalize(torch::nn::Module& model, const RunBatch& run, int64_t iterations) {
  QF_REQUIRE(iterations > 0, "equalize: iterations must be > 0, got ", iterations);
  const auto t0 = std::chrono::steady_clock::now();
  EqualizeReport rep;
  at::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  FloatView float_view(model);
  // The weighted layers in the order the forward runs them.
  std::vector<QuantizableLayer*> order, weighted;
  std::map<const QuantizableLayer*, std::string> path_of;  // a float layer's own path() is empty until attached
  for (const auto& [path, layer] : quantizable_layers(model)) {
    path_of[layer] = path;
    if (!solvable(path, *layer).empty()) continue;
    QF_REQUIRE(!layer->frozen() && !(layer->quantized() && layer->weight_quantizer() &&
                                     layer->weight_quantizer()->calibrated()),
               "equalize: ", path, " is frozen or has a fixed weight grid; equalise the float model before quantize()");
    weighted.push_back(layer);
  }
  at::Tensor y0;
  {
    // The weighted layers in the order the forward runs them.
    const ScopedInputTaps taps(weighted, [&order](QuantizableLayer& l, const at::Tensor&) {
      if (std::find(order.begin(), order.end(), &l) == order.end()) order.push_back(&l);
    });
    y0 = run(0).detach().clone();
  }
  auto change = [&] { return relative_change(run(0), y0); };
  for (size_t i = 0; i + 1 < order.size(); ++i) {
    const LayerAccess a = access(*order[i]), b = access(*order[i + 1]);
    EqualizedPair p;
    p.first = path_of.at(order[i]);
    p.second = path_of.at(order[i + 1]);
    if (a.weight.size(0) != b.weight.size(1)) {
      p.reason = "channel counts differ (" + std::to_string(a.weight.size(0)) + " outputs, " +
                 std::to_string(b.weight.size(1)) + " inputs)";
      rep.pairs.push_back(p);
      continue;
    }
    p.range_spread_before = std::max(spread(out_ranges(a)), spread(in_ranges(b)));
    const at::Tensor wa = a.weight.detach().clone(), wb = b.weight.detach().clone();
    const at::Tensor ba = a.bias.defined() ? a.bias.detach().clone() : at::Tensor();
    for (int64_t it = 0; it < iterations; ++it) {
      const at::Tensor ra = out_ranges(a), rb = in_ranges(b);
      // s_i = sqrt(r_A,i / r_B,i); channels with a zero range keep s = 1.
      const at::Tensor ok = at::logical_and(ra > 0, rb > 0);
      const at::Tensor s = at::where(ok, at::sqrt(ra / rb.clamp_min(1e-30)), at::ones_like(ra));
      a.weight.copy_(scale_outputs(a.weight, at::reciprocal(s)));
      if (a.bias.defined()) a.bias.div_(s);
      b.weight.copy_(scale_inputs(b.weight, s));
    }
    const double moved = change();
    if (!(moved <= kEqualizeTolerance)) {
      a.weight.copy_(wa);
      b.weight.copy_(wb);
      if (ba.defined()) a.bias.copy_(ba);
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "the float output moved by %.2g (relative): what lies between them is not positively "
                    "homogeneous (GELU, an unfolded BatchNorm, a residual ...); undone",
                    moved);
      p.reason = buf;
      rep.pairs.push_back(p);
      continue;
    }
    p.applied = true;
    p.range_spread_after = std::max(spread(out_ranges(a)), spread(in_ranges(b)));
    rep.pairs.push_back(p);
  }
  model.train(was_training);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace qforge::ptq
