// MatMul of two activations with a quantizer on each operand.
#include "framework/nn/matmul.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>

#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/gemv_s8.h"
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
  const at::Tensor a3 = a.expand(a_shape).reshape({batch * M, K}).contiguous();
  // The second operand as rows of b^T, the layout the kernel packs from.
  const at::Tensor bt = b.expand(b_shape).transpose(-1, -2).reshape({batch * N, K}).contiguous();
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
      rows(a3, batch * M, input_q_, qa, a_scale);
      rows(bt, batch * N, other_q_, qbt, b_scale);
    }
    a_stride = M;
    b_stride = N;
  } else {
    // The fake-quant formula of each static per-tensor quantizer, as int8 codes.
    qa = quantize_to_int8(a3, input_q_->qparams());
    qbt = quantize_to_int8(bt, other_q_->qparams());
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
  if (path_kind_ == LinearPath::kS8Static) {
    static_a_scale_ = input_q_->qparams().scale.to(at::kFloat).item<float>();
    static_b_scale_ = other_q_->qparams().scale.to(at::kFloat).item<float>();
  }
  mark_frozen();
}

KernelPlan MatMulImpl::plan() const { return plan_matmul(scheme_.activations, scheme_.activation.spec); }

}  // namespace qforge::nn
