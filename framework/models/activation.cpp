// HF activation names (see activation.h).
#include "framework/models/activation.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <limits>
#include <vector>

#include "framework/core/error.h"
#include "framework/nn/rms_norm.h"
#include "kernels/cpu/linear_weight_only.h"
#include "kernels/cpu/token_ops.h"

namespace qforge::models {
namespace {

// GELU's tanh form, for every model whose activation is gelu_new or gelu_pytorch_tanh: one fused
// kernel (kernels::gelu_tanh_f32: within 1e-6 |y| + 1.2e-7 |x| of ATen's, whose 1 + tanh u
// cancels for negative x, token_ops.h) where token_ops_fusable holds (float CPU, no gradient to
// record), else ATen's.
at::Tensor gelu_tanh(const at::Tensor& x) {
  if (x.numel() == 0 || !nn::token_ops_fusable({&x})) return at::gelu(x, "tanh");
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc);
  kernels::gelu_tanh_f32({xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel()});
  return y;
}

struct Activation {
  const char* name;
  at::Tensor (*apply)(const at::Tensor&);
};

const Activation kActivations[] = {
    {"silu", [](const at::Tensor& x) { return at::silu(x); }},
    {"swish", [](const at::Tensor& x) { return at::silu(x); }},
    {"gelu", [](const at::Tensor& x) { return at::gelu(x); }},
    {"gelu_new", gelu_tanh},
    {"gelu_pytorch_tanh", gelu_tanh},
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

namespace {

// The context of q, k, v by `kernel` (attention_f32 or attention_prefill_f32): [B, KV, rows, D], or
// with `tokens` set [B, T, KV · rep · D] (undefined where rep > 1 and T > 1: those rows are not
// evenly spaced there). Undefined outside fused_decode_attention's conditions (T aside: the callers
// bound it). q is read where it lies (its rows evenly spaced, D contiguous floats each); decode
// calls keep the scores in the calling thread's scratch.
at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t T, int64_t window,
                           double scale, bool scores, bool tokens,
                           void (*kernel)(const kernels::AttentionProblem&, kernels::RunInfo*)) {
  QF_REQUIRE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes() && q.size(0) == k.size(0) &&
                 q.size(1) == k.size(1) && q.size(3) == k.size(3) && T > 0 && q.size(2) % T == 0,
             "models: attention needs q [B, KV, rep * T, D] and k, v [B, KV, S, D], got ", q.sizes(), ", ", k.sizes(),
             ", ", v.sizes(), " with T=", T);
  const int64_t B = q.size(0), KV = q.size(1), rows = q.size(2), D = q.size(3), S = k.size(2), rep = rows / T;
  if (rows == 0 || S < T || D == 0 || k.stride(3) != 1 || v.stride(3) != 1 || (tokens && rep > 1 && T > 1) ||
      !nn::token_ops_fusable({&q, &k, &v}))
    return {};
  const at::Tensor qc = q.stride(3) == 1 && (rows == 1 || q.stride(2) >= D) ? q : q.contiguous();
  at::Tensor out = tokens ? at::empty({B, T, KV * rep * D}, q.options()) : at::empty({B, KV, rows, D}, q.options());
  thread_local std::vector<float> scratch;
  if (scores) scratch.resize(static_cast<size_t>(B * KV * rows * S));
  kernels::AttentionProblem p;
  p.q = qc.data_ptr<float>(), p.k = k.data_ptr<float>(), p.v = v.data_ptr<float>();
  p.scores = scores ? scratch.data() : nullptr, p.out = out.data_ptr<float>();
  p.groups = B * KV, p.heads = KV, p.rows = rows, p.T = T, p.S = S, p.D = D, p.past = S - T, p.window = window;
  p.k_batch_stride = k.stride(0), p.k_head_stride = k.stride(1), p.k_row_stride = k.stride(2);
  p.v_batch_stride = v.stride(0), p.v_head_stride = v.stride(1), p.v_row_stride = v.stride(2);
  p.q_batch_stride = qc.stride(0), p.q_head_stride = qc.stride(1), p.q_row_stride = qc.stride(2);
  if (tokens) {  // query head kv · rep + r of position t at [b, t, (kv · rep + r) · D]; row i = r · T + t
    p.out_batch_stride = T * KV * rep * D, p.out_head_stride = rep * D, p.out_row_stride = T == 1 ? D : KV * rep * D;
  }
  p.scale = static_cast<float>(scale);
  kernel(p, nullptr);
  constexpr size_t kKeptScratch = size_t{1} << 20;  // floats a thread keeps between calls (4 MB)
  if (scratch.capacity() > kKeptScratch) std::vector<float>().swap(scratch);
  return out;
}

}  // namespace

at::Tensor fused_decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t T,
                                  int64_t window, double scale) {
  if (T > kernels::kWeightOnlyMaxM) return {};
  return fused_attention(q, k, v, T, window, scale, true, false, kernels::attention_f32);
}

at::Tensor fused_decode_attention_tokens(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t T,
                                         int64_t window, double scale) {
  if (T > kernels::kWeightOnlyMaxM) return {};
  return fused_attention(q, k, v, T, window, scale, true, true, kernels::attention_f32);
}

namespace {

// One side of layer `layer`'s cached codes as the kernel reads them (strides in bytes / elements).
kernels::KvCodesOperand codes_operand(const KvCodes& c) {
  kernels::KvCodesOperand o;
  o.codes = c.codes.data_ptr();
  o.scale = c.scale.data_ptr<float>();
  o.zero_point = c.zero_point.defined() ? static_cast<const int8_t*>(c.zero_point.data_ptr()) : nullptr;
  o.batch_stride = c.codes.stride(0), o.head_stride = c.codes.stride(1), o.row_stride = c.codes.stride(2);
  o.scale_batch_stride = c.scale.stride(0), o.scale_head_stride = c.scale.stride(1), o.scale_row_stride = c.scale.stride(2);
  QF_REQUIRE(c.codes.element_size() == 1 && c.codes.stride(3) == 1 && c.scale.stride(3) == 1 &&
                 (!c.zero_point.defined() || c.zero_point.strides() == c.scale.strides()),
             "models: the cache's codes and scales are not laid out as its stores (int8 rows, scales and zero points alike)");
  return o;
}

}  // namespace

at::Tensor fused_decode_attention_on_codes(const at::Tensor& q, KvCache& cache, size_t layer, const at::Tensor& k,
                                           const at::Tensor& v, int64_t T, int64_t window, double scale) {
  const KvCacheScheme& scheme = cache.scheme();
  if (!scheme.quantized() || !cache.attend_on_codes || T > kernels::kWeightOnlyMaxM || T <= 0 || q.dim() != 4 ||
      k.dim() != 4 || q.size(2) % T != 0 || q.size(2) == 0 || q.size(3) > kernels::kKvCodesMaxHeadDim ||
      q.size(3) != k.size(3) || q.size(0) != k.size(0) || q.size(1) != k.size(1) || k.size(2) != T ||
      !nn::token_ops_fusable({&q, &k, &v}))
    return {};
  cache.append_codes(layer, k, v);
  const KvCodes kc = cache.codes(layer, false), vc = cache.codes(layer, true);
  const int64_t B = q.size(0), KV = q.size(1), rows = q.size(2), D = q.size(3), S = kc.codes.size(2);
  const at::Tensor qc = q.contiguous();
  at::Tensor out = at::empty({B, KV, rows, D}, q.options()), w = at::empty({B, KV, rows, S}, q.options());
  kernels::KvCodesAttentionProblem p;
  p.q = qc.data_ptr<float>(), p.scores = w.data_ptr<float>(), p.out = out.data_ptr<float>();
  p.k = codes_operand(kc), p.v = codes_operand(vc);
  p.bits = scheme.qtype->bits, p.group = scheme.group(D);
  p.groups = B * KV, p.heads = KV, p.rows = rows, p.T = T, p.S = S, p.D = D, p.past = S - T, p.window = window;
  p.scale = static_cast<float>(scale);
  kernels::attention_kv_codes_f32(p);
  return out;
}

at::Tensor fused_prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t T,
                                   int64_t window, double scale) {
  if (T <= kernels::kWeightOnlyMaxM) return {};
  // The scalar reference at prefill sizes is far slower than the matmuls it would replace.
  if (kernels::select_kernel(kernels::attention_prefill_kernels(), kernels::AttentionProblem{},
                             kernels::IsaGate::machine(), nullptr).isa == kernels::Isa::kReference)
    return {};
  return fused_attention(q, k, v, T, window, scale, false, false, kernels::attention_prefill_f32);
}

}  // namespace qforge::models
