// qbench cases for frozen Linear layers: qforge's int8 (dynamic per-token activations) and int4
// (groups of 128) kernels against fp32 at::linear (OpenBLAS) and LibTorch's
// quantized::linear_dynamic on its oneDNN engine, at decode and prefill shapes.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/quantized/PackedParams.h>

#include <memory>

#include "apps/qbench_registry.h"
#include "framework/nn/linear.h"
#include "framework/quantize.h"

namespace qforge::bench {
namespace {

struct Shape {
  int64_t M, K, N;
};
const Shape kShapes[] = {{1, 4096, 4096}, {16, 4096, 4096}, {128, 768, 3072}, {512, 1024, 1024}};

std::string shape_name(const Shape& s) {
  return std::to_string(s.M) + "x" + std::to_string(s.K) + "x" + std::to_string(s.N);
}

std::shared_ptr<nn::LinearImpl> frozen_linear(const at::Tensor& w, const at::Tensor& b, const QType& qtype) {
  auto lin = std::make_shared<nn::LinearImpl>(w.size(1), w.size(0));
  {
    at::NoGradGuard g;
    lin->weight.copy_(w);
    lin->bias.copy_(b);
  }
  Scheme s(qtype);
  s.activations = ActivationMode::kDynamicPerToken;
  quantize(*lin, s);
  freeze(*lin);
  return lin;
}

using PrepackFn = c10::intrusive_ptr<LinearPackedParamsBase>(at::Tensor, c10::optional<at::Tensor>);
using DynamicFn = at::Tensor(at::Tensor, const c10::intrusive_ptr<LinearPackedParamsBase>&, bool);

// LibTorch's int8 dynamic linear (the op behind torch.ao.nn.quantized.dynamic.Linear).
std::function<void()> libtorch_int8_dynamic(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  at::globalContext().setQEngine(at::QEngine::ONEDNN);
  static auto prepack =
      c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_prepack", "").typed<PrepackFn>();
  static auto dynamic =
      c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_dynamic", "").typed<DynamicFn>();
  const at::Tensor amax = w.abs().amax(1);
  const at::Tensor qw = at::quantize_per_channel(w, (amax / 127.0).clamp_min(1e-8).to(at::kDouble),
                                                 at::zeros({w.size(0)}, at::kLong), 0, at::kQInt8);
  auto packed = prepack.call(qw, b);
  return [x, packed] { dynamic.call(x, packed, /*reduce_range=*/false); };
}

std::vector<Case> cases(bool int4, bool vs_libtorch_int8) {
  std::vector<Case> out;
  for (const Shape& s : kShapes) {
    const at::Tensor x = at::randn({s.M, s.K});
    const at::Tensor w = at::randn({s.N, s.K}) * 0.02;
    const at::Tensor b = at::randn({s.N}) * 0.1;
    auto lin = frozen_linear(w, b, int4 ? qint4 : qint8);
    Case c{shape_name(s), 0.0, {}};
    if (vs_libtorch_int8) {
      c.impls.push_back({"libtorch", libtorch_int8_dynamic(x, w, b)});
    } else {
      c.impls.push_back({"libtorch", [x, w, b] { at::linear(x, w, b); }});
    }
    c.impls.push_back({"qforge", [x, lin] { lin->forward(x); }});
    out.push_back(std::move(c));
  }
  return out;
}

const Register kInt8VsFp32(30, "linear_w8a8dyn_vs_fp32", [] { return cases(false, false); });
const Register kInt8VsTorchInt8(31, "linear_w8a8dyn_vs_torch_int8", [] { return cases(false, true); });
const Register kInt4VsFp32(32, "linear_w4a8dyn_g128_vs_fp32", [] { return cases(true, false); });

}  // namespace
}  // namespace qforge::bench
