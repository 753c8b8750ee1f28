// HF activation names (see activation.h).
#include "framework/models/activation.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <limits>

#include "framework/core/error.h"
#include "framework/nn/rms_norm.h"
#include "kernels/cpu/linear_weight_only.h"
#include "kernels/cpu/token_ops.h"

namespace qforge::models {
namespace {

struct Activation {
  const char* name;
  at::Tensor (*apply)(const at::Tensor&);
};

const Activation kActivations[] = {
    {"silu", [](const at::Tensor& x) { return at::silu(x); }},
    {"swish", [](const at::Tensor& x) { return at::silu(x); }},
    {"gelu", [](const at::Tensor& x) { return at::gelu(x); }},
    {"gelu_new", [](const at::Tensor& x) { return at::gelu(x, "tanh"); }},
    {"gelu_pytorch_tanh", [](const at::Tensor& x) { return at::gelu(x, "tanh"); }},
    {"relu", [](const at::Tensor& x) { return at::relu(x); }},
};

const Activation* find_activation(const std::string& act) {
  for (const Activation& a : kActivations)
    if (act == a.name) return &a;
  return nullptr;
}

}  // namespace

bool is_activation(const std::string& act) { return find_activation(act) != nullptr; }

std::string activation_names() {
  std::string names;
  for (const Activation& a : kActivations) names += (names.empty() ? "" : ", ") + std::string(a.name);
  return names;
}

at::Tensor apply_activation(const std::string& act, const at::Tensor& x) {
  const Activation* a = find_activation(act);
  QF_REQUIRE(a != nullptr, "models: unsupported activation '", act, "' (", activation_names(), ")");
  return a->apply(x);
}

at::Tensor masked_score(const at::Tensor& scores) {
  double lowest = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, scores.scalar_type(), "masked_score",
                                  [&] { lowest = static_cast<double>(std::numeric_limits<scalar_t>::lowest()); });
  return at::full({}, lowest, scores.options());
}

at::Tensor fused_causal_softmax(const at::Tensor& scores, int64_t past, int64_t window, double scale) {
  QF_REQUIRE(scores.dim() == 4, "models: attention scores must be [B, H, T, S], got ", scores.sizes());
  const int64_t T = scores.size(2), S = scores.size(3);
  if (T > kernels::kWeightOnlyMaxM || T == 0 || S == 0 || !nn::token_ops_fusable({&scores})) return {};
  at::Tensor w = scores.contiguous();
  kernels::causal_softmax_f32({w.data_ptr<float>(), w.numel() / (T * S), T, S, past, window, static_cast<float>(scale)});
  return w;
}

}  // namespace qforge::models
