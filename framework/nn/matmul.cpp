// MatMul of two activations with a quantizer on each operand.
#include "framework/nn/matmul.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>

#include <algorithm>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/gemv_s8.h"
#include "kernels/cpu/parallel_blocks.h"
#include "kernels/cpu/quantize_rows_s8.h"

namespace qforge::nn {

void MatMulImpl::check_scheme(const LayerScheme& scheme) const {
  QuantizableLayer::check_scheme(scheme);
  QF_REQUIRE(scheme.activations != ActivationMode::kNone || !scheme.weights, path_,
             " (MatMul): has no weight; quantize its operands with an activation scheme");
}

void MatMulImpl::on_attach() {
  if (scheme_.activations == ActivationMode::kNone) return;
  other_q_ = Quantizer(QuantizerImpl::Role::kActivation, scheme_.activation, scheme_.activations, path_ + ".other");
  register_module("other_quantizer", other_q_);
  other_q_->train(is_training());
}

std::vector<Quantizer> MatMulImpl::quantizers() const {
  std::vector<Quantizer> out = QuantizableLayer::quantizers();
  if (other_q_) out.push_back(other_q_);
  return out;
}

at::Tensor MatMulImpl::quantize_other(const at::Tensor& b) {
  // Dynamic scales of the second operand: one per column (rows of b^T).
  if (other_q_->mode() == ActivationMode::kDynamicPerToken && b.dim() >= 2)
    return other_q_->forward(b.transpose(-1, -2)).transpose(-1, -2);
  return other_q_->forward(b);
}

at::Tensor MatMulImpl::forward(const at::Tensor& a, const at::Tensor& b) {
  if (!input_q_) return at::matmul(a, b);
  if (per_head()) {
    // One scale per head along axis -3: only [batch, heads, tokens, features] operands say which
    // axis that is (a flattened [batch · heads, tokens, features] would give each sequence's heads
    // their own scale, and a count that changes with the batch).
    QF_REQUIRE(a.dim() == 4 && b.dim() == 4 && a.size(1) == b.size(1), path_,
               " (MatMul): per-head scales need [batch, heads, tokens, features] operands with the same heads, got ",
               a.sizes(), " and ", b.sizes(),
               "; quantize this product with per-tensor scales (a rule with attention: per_tensor, "
               "LayerRule::attention_scales) or keep it float");
  }
  if (frozen_ && path_kind_ != LinearPath::kDequant && a.is_cpu() && b.is_cpu() && a.dim() >= 2 && b.dim() >= 2 &&
      a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat)
    return integer_forward(a, b);
  return at::matmul(input_q_->forward(a), quantize_other(b));
}

at::Tensor MatMulImpl::integer_forward(const at::Tensor& a, const at::Tensor& b) const {
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  QF_REQUIRE(b.size(-2) == K, path_, " (MatMul): operands ", a.sizes(), " and ", b.sizes(),
             " cannot be multiplied (contracted sizes ", K, " and ", b.size(-2), ")");
  const std::vector<int64_t> batch_shape =
      at::infer_size(a.sizes().slice(0, a.dim() - 2), b.sizes().slice(0, b.dim() - 2));
  std::vector<int64_t> a_shape = batch_shape, b_shape = batch_shape, out_shape = batch_shape;
  a_shape.insert(a_shape.end(), {M, K});
  b_shape.insert(b_shape.end(), {K, N});
  out_shape.insert(out_shape.end(), {M, N});
  int64_t batch = 1;
  for (int64_t d : batch_shape) batch *= d;
  at::Tensor y = at::empty(out_shape, at::kFloat);
  if (y.numel() == 0) return y;
  // The operands as rows: a's [batch · M, K], and b's columns as rows of b^T [batch · N, K], the
  // layout the kernel packs from (per head, quantized in their batched shape first).
  const auto a_rows = [&](const at::Tensor& x) { return x.reshape({batch * M, K}).contiguous(); };
  const auto b_rows = [&](const at::Tensor& x) { return x.reshape({batch * N, K}).contiguous(); };
  const at::Tensor a4 = a.expand(a_shape), bt4 = b.expand(b_shape).transpose(-1, -2);
  at::Tensor qa, qbt, a_scale, b_scale;
  int64_t a_stride = 0, b_stride = 0;
  if (path_kind_ == LinearPath::kS8Dynamic) {
    qa = at::empty({batch * M, K}, at::kChar);
    qbt = at::empty({batch * N, K}, at::kChar);
    a_scale = at::empty({batch * M}, at::kFloat);
    b_scale = at::empty({batch * N}, at::kFloat);
    if (K > 0) {
      // Each operand's grid (qint8 on [-127, 127], narrower rows on [-qmax, qmax] as int8 codes)
      // and clip ratio: the fake-quant formula of its quantizer, which the kernel's row
      // quantizer follows bit for bit.
      const auto rows = [K](const at::Tensor& x, int64_t n, const Quantizer& q, at::Tensor& codes, at::Tensor& scale) {
        kernels::quantize_rows_s8(x.data_ptr<float>(), n, K, kernels::ActScale::kPerRow, codes.data_ptr<int8_t>(), K,
                                  scale.data_ptr<float>(), nullptr,
                                  QuantizerImpl::dynamic_qmax(q->config().spec.qtype), q->config().clip_ratio);
      };
      rows(a_rows(a4), batch * M, input_q_, qa, a_scale);
      rows(b_rows(bt4), batch * N, other_q_, qbt, b_scale);
    }
    a_stride = M;
    b_stride = N;
  } else if (per_head()) {
    // Per-head static scales (axis -3 of the [batch, heads, ...] operands, checked in forward): the
    // per-channel fake-quant formula of each head's grid (inv = 1.0f / s_h, rint, clamp) as int8
    // codes, one quantize_static_s8 pass per slice; slice i = (b, h) takes head h's scale for each
    // of its rows (a) and columns (b).
    const int64_t heads = batch_shape[1];
    QF_REQUIRE(heads == static_a_scales_.numel(), path_, " (MatMul): operands with ", heads, " heads; its per-head ",
               "scales were calibrated for ", static_a_scales_.numel());
    const at::Tensor ra = a_rows(a4), rb = b_rows(bt4);
    qa = at::empty({batch * M, K}, at::kChar);
    qbt = at::empty({batch * N, K}, at::kChar);
    const float* inv_a = static_a_inv_.data_ptr<float>();
    const float* inv_b = static_b_inv_.data_ptr<float>();
    const QSpec& ga = input_q_->config().spec;
    const QSpec& gb = other_q_->config().spec;
    // Slices spread over the kernels' threads (parallel_blocks.h; each call inside runs on its
    // thread), a few together when they are small.
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, (M + N) * K));
    try {
      kernels::detail::parallel_over(batch, grain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const int64_t h = i % heads;
          kernels::quantize_static_s8(ra.data_ptr<float>() + i * M * K, M * K, inv_a[h],
                                      static_cast<int>(ga.quant_min()), static_cast<int>(ga.quant_max()),
                                      qa.data_ptr<int8_t>() + i * M * K);
          kernels::quantize_static_s8(rb.data_ptr<float>() + i * N * K, N * K, inv_b[h],
                                      static_cast<int>(gb.quant_min()), static_cast<int>(gb.quant_max()),
                                      qbt.data_ptr<int8_t>() + i * N * K);
        }
      });
    } catch (const Error& e) {
      throw Error(path_ + " (MatMul, per-head static operands): " + e.what());
    }
    a_scale = static_a_scales_.view({1, heads, 1}).expand({batch / heads, heads, M}).contiguous();
    b_scale = static_b_scales_.view({1, heads, 1}).expand({batch / heads, heads, N}).contiguous();
    a_stride = M;
    b_stride = N;
  } else {
    // The fake-quant formula of each static per-tensor quantizer, as int8 codes.
    qa = quantize_to_int8(a_rows(a4), input_q_->qparams());
    qbt = quantize_to_int8(b_rows(bt4), other_q_->qparams());
    a_scale = at::full({M}, static_a_scale_, at::kFloat);
    b_scale = at::full({N}, static_b_scale_, at::kFloat);
  }
  kernels::bmm_s8s8f32(qa.data_ptr<int8_t>(), qbt.data_ptr<int8_t>(), batch, M, N, K, a_scale.data_ptr<float>(),
                       a_stride, b_scale.data_ptr<float>(), b_stride, y.data_ptr<float>());
  return y;
}

void MatMulImpl::install_frozen(QuantizedTensor) {
  QF_REQUIRE(!frozen_, path_, " (MatMul): already frozen");
  QF_REQUIRE(uncalibrated().empty(), path_, " (MatMul): static operand quantizers were never calibrated");
  path_kind_ = plan().path;
  if (path_kind_ == LinearPath::kS8Static && per_head()) {
    static_a_scales_ = input_q_->qparams().scale.to(at::kFloat).reshape({-1}).contiguous();
    static_b_scales_ = other_q_->qparams().scale.to(at::kFloat).reshape({-1}).contiguous();
    QF_REQUIRE(static_a_scales_.numel() == static_b_scales_.numel(), path_, " (MatMul): per-head scales of its operands ",
               "count ", static_a_scales_.numel(), " and ", static_b_scales_.numel(), " heads");
    // What at::reciprocal (the fake-quant formula) computes: 1.0f / s in float.
    static_a_inv_ = at::reciprocal(static_a_scales_);
    static_b_inv_ = at::reciprocal(static_b_scales_);
  } else if (path_kind_ == LinearPath::kS8Static) {
    static_a_scale_ = input_q_->qparams().scale.to(at::kFloat).item<float>();
    static_b_scale_ = other_q_->qparams().scale.to(at::kFloat).item<float>();
  }
  mark_frozen();
}

KernelPlan MatMulImpl::plan() const { return plan_matmul(scheme_.activations, scheme_.activation.spec); }

bool MatMulImpl::per_head() const {
  return input_q_ && scheme_.activations == ActivationMode::kStatic &&
         scheme_.activation.spec.granularity == Granularity::kPerChannel;
}

}  // namespace qforge::nn
