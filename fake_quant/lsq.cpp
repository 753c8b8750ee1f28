// LSQ / LSQ+ learnable fake quantisation: forward on the affine kernels, fused backward that
// writes dX and reduces dScale / dZeroPoint in one pass.
#include "fake_quant/lsq.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include "fake_quant/cuda/fake_quantize_op.h"
#include "fake_quant/fake_quantize.h"
#include "fake_quant/fake_quantize_kernels.h"
#include "framework/core/error.h"
#include "framework/core/qparams.h"

namespace qforge {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kChunk = fq::kLsqChunk;

void check_learnable_inputs(const char* op, const at::Tensor& x, const at::Tensor& scale,
                            const at::Tensor& zero_point, int64_t qmin, int64_t qmax) {
  QF_REQUIRE(x.defined() && x.is_floating_point(), op, ": input must be a floating tensor");
  QF_REQUIRE(scale.defined() && zero_point.defined() && scale.is_floating_point() &&
                 zero_point.is_floating_point(),
             op, ": scale and zero_point must be floating tensors");
  QF_REQUIRE(qmin < qmax, op, ": quant_min ", qmin, " must be below quant_max ", qmax);
  QF_REQUIRE(at::gt(scale, 0).all().item<bool>(), op, ": scale must be > 0");
}

// dX, and dScale / dZeroPoint per channel, for x viewed as [C, inner] (channel-major).
std::tuple<at::Tensor, at::Tensor, at::Tensor> lsq_backward_rows(const at::Tensor& x, const at::Tensor& dy,
                                                                 const std::vector<fq::LsqGrid>& grids) {
  if (x.is_cuda() && fq::cuda_fake_quantize_built()) return fq::cuda_lsq_backward_rows(x, dy, grids);
  if (!x.is_cpu()) {
    // Another device: the CPU kernels compute the backward on host copies, and the gradients go
    // back to the input's device.
    auto [dx, ds, dz] = lsq_backward_rows(x.cpu(), dy.cpu(), grids);
    return {dx.to(x.device()), ds.to(x.device()), dz.to(x.device())};
  }
  const int64_t C = static_cast<int64_t>(grids.size());
  const int64_t inner = x.numel() / C;
  at::Tensor dx = at::empty_like(x);
  const int64_t chunks_per_row = std::max<int64_t>(1, (inner + kChunk - 1) / kChunk);
  std::vector<fq::LsqSums> partial(static_cast<size_t>(C * chunks_per_row));
  const float* px = x.data_ptr<float>();
  const float* pdy = dy.data_ptr<float>();
  float* pdx = dx.data_ptr<float>();
  const auto& k = fq::active_kernels();
  at::parallel_for(0, C * chunks_per_row, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t c = t / chunks_per_row, j = t % chunks_per_row;
      const int64_t begin = c * inner + j * kChunk;
      const int64_t len = std::min(kChunk, inner - j * kChunk);
      if (len > 0) partial[t] = k.lsq_run(px + begin, pdy + begin, pdx + begin, len, grids[c]);
    }
  });
  at::Tensor ds = at::empty({C}, x.options()), dz = at::empty({C}, x.options());
  for (int64_t c = 0; c < C; ++c) {
    double s = 0.0, z = 0.0;
    for (int64_t j = 0; j < chunks_per_row; ++j) {
      s += partial[c * chunks_per_row + j].dscale;
      z += partial[c * chunks_per_row + j].dzero_point;
    }
    ds.data_ptr<float>()[c] = static_cast<float>(s);
    dz.data_ptr<float>()[c] = static_cast<float>(z);
  }
  return {dx, ds, dz};
}

QParams affine_qparams(const at::Tensor& scale, const at::Tensor& zp_int, int64_t qmin, int64_t qmax,
                       bool per_channel, int64_t axis) {
  QParams qp;
  qp.spec.qtype = QType{"custom", 0, qmin < 0, QKind::kInteger, qmin, qmax, 0, 0, 0, 0.0};
  qp.spec.granularity = per_channel ? Granularity::kPerChannel : Granularity::kPerTensor;
  qp.spec.axis = axis;
  qp.scale = scale;
  qp.zero_point = zp_int;
  return qp;
}

struct LearnablePerTensor : public torch::autograd::Function<LearnablePerTensor> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& scale,
                            const at::Tensor& zero_point, int64_t qmin, int64_t qmax, double grad_factor) {
    const float s = scale.reshape({-1})[0].item<float>();
    const float z = zero_point.reshape({-1})[0].item<float>();
    // Forward rounds the zero point with nearbyint; backward with trunc(z + 0.5) (PyTorch's
    // _get_zero_point_from_tensor(is_forward)).
    const float zf = std::min(std::max(std::nearbyint(z), float(qmin)), float(qmax));
    const float zb = static_cast<float>(static_cast<int64_t>(
        std::min(std::max(z + 0.5f, float(qmin)), float(qmax))));
    ctx->saved_data["s"] = static_cast<double>(s);
    ctx->saved_data["zb"] = static_cast<double>(zb);
    ctx->saved_data["qmin"] = qmin;
    ctx->saved_data["qmax"] = qmax;
    ctx->saved_data["gf"] = grad_factor;
    ctx->save_for_backward({x});
    const QParams qp = affine_qparams(at::full({}, s), at::full({}, static_cast<int>(zf), at::kInt),
                                      qmin, qmax, false, 0);
    return fake_quantize_forward(x, qp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0].to(at::kFloat).contiguous();
    const at::Tensor dy = grads[0].to(at::kFloat).contiguous();
    const float s = static_cast<float>(ctx->saved_data["s"].toDouble());
    const fq::LsqGrid g{s, 1.0f / s, static_cast<float>(ctx->saved_data["zb"].toDouble()),
                        static_cast<float>(ctx->saved_data["qmin"].toInt()),
                        static_cast<float>(ctx->saved_data["qmax"].toInt()),
                        static_cast<float>(ctx->saved_data["gf"].toDouble())};
    auto [dx, ds, dz] = lsq_backward_rows(x.reshape({1, -1}), dy.reshape({1, -1}), {g});
    return {dx.reshape(x.sizes()), ds.reshape({1}), dz.reshape({1}), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

at::Tensor rounded_zero_point(const at::Tensor& zp, int64_t qmin, int64_t qmax) {
  return at::clamp(at::round(zp.detach().to(at::kFloat)), qmin, qmax);
}

struct LearnablePerChannel : public torch::autograd::Function<LearnablePerChannel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& scale,
                            const at::Tensor& zero_point, int64_t axis, int64_t qmin, int64_t qmax,
                            double grad_factor) {
    const at::Tensor zr = rounded_zero_point(zero_point, qmin, qmax);
    ctx->saved_data["axis"] = axis;
    ctx->saved_data["qmin"] = qmin;
    ctx->saved_data["qmax"] = qmax;
    ctx->saved_data["gf"] = grad_factor;
    ctx->save_for_backward({x, scale, zr});
    const QParams qp = affine_qparams(scale.detach().to(at::kFloat), zr.to(at::kInt), qmin, qmax, true, axis);
    return fake_quantize_forward(x, qp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t axis = ctx->saved_data["axis"].toInt();
    const float qmin = static_cast<float>(ctx->saved_data["qmin"].toInt());
    const float qmax = static_cast<float>(ctx->saved_data["qmax"].toInt());
    const float gf = static_cast<float>(ctx->saved_data["gf"].toDouble());
    const at::Tensor x = saved[0].to(at::kFloat);
    const at::Tensor s = saved[1].to(at::kCPU, at::kFloat).contiguous();
    const at::Tensor zr = saved[2].to(at::kCPU).contiguous();
    const int64_t C = s.numel();
    std::vector<fq::LsqGrid> grids(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      const float sc = s.data_ptr<float>()[c];
      grids[c] = fq::LsqGrid{sc, 1.0f / sc, zr.data_ptr<float>()[c], qmin, qmax, gf};
    }
    // Channel-major layout so each channel is one contiguous run.
    const at::Tensor xm = x.movedim(axis, 0).contiguous();
    const at::Tensor dym = grads[0].to(at::kFloat).movedim(axis, 0).contiguous();
    auto [dx, ds, dz] = lsq_backward_rows(xm.reshape({C, -1}), dym.reshape({C, -1}), grids);
    dx = dx.reshape(xm.sizes()).movedim(0, axis).contiguous();
    return {dx, ds.reshape(s.sizes()), dz.reshape(s.sizes()), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

double lsq_grad_factor(int64_t numel, int64_t quant_max) {
  QF_REQUIRE(numel > 0 && quant_max > 0, "lsq_grad_factor: needs numel > 0 and quant_max > 0");
  return 1.0 / std::sqrt(static_cast<double>(numel) * static_cast<double>(quant_max));
}

at::Tensor lsq_init_scale(const at::Tensor& x, int64_t quant_max, int64_t axis) {
  QF_REQUIRE(x.numel() > 0, "lsq_init_scale: empty tensor");
  QF_REQUIRE(quant_max > 0, "lsq_init_scale: quant_max must be > 0");
  const at::Tensor a = x.detach().to(at::kFloat).abs();
  at::Tensor m;
  if (axis < 0) {
    m = a.mean().reshape({1});
  } else {
    QF_REQUIRE(axis < x.dim(), "lsq_init_scale: axis ", axis, " out of range for shape ", x.sizes());
    m = a.movedim(axis, 0).reshape({x.size(axis), -1}).mean(1);
  }
  return at::clamp_min(2.0 * m / std::sqrt(static_cast<double>(quant_max)), kScaleEps);
}

at::Tensor fake_quantize_learnable_per_tensor_affine(const at::Tensor& x, const at::Tensor& scale,
                                                     const at::Tensor& zero_point, int64_t quant_min,
                                                     int64_t quant_max, double grad_factor) {
  check_learnable_inputs("fake_quantize_learnable_per_tensor_affine", x, scale, zero_point, quant_min,
                         quant_max);
  QF_REQUIRE(scale.numel() == 1 && zero_point.numel() == 1,
             "fake_quantize_learnable_per_tensor_affine: scale and zero_point must have one element, got ",
             scale.sizes(), " and ", zero_point.sizes());
  return LearnablePerTensor::apply(x, scale, zero_point, quant_min, quant_max, grad_factor);
}

at::Tensor fake_quantize_learnable_per_channel_affine(const at::Tensor& x, const at::Tensor& scale,
                                                      const at::Tensor& zero_point, int64_t axis,
                                                      int64_t quant_min, int64_t quant_max,
                                                      double grad_factor) {
  check_learnable_inputs("fake_quantize_learnable_per_channel_affine", x, scale, zero_point, quant_min,
                         quant_max);
  QF_REQUIRE(axis >= 0 && axis < x.dim(), "fake_quantize_learnable_per_channel_affine: axis ", axis,
             " out of range for shape ", x.sizes());
  QF_REQUIRE(scale.dim() == 1 && scale.numel() == x.size(axis) && zero_point.sizes() == scale.sizes(),
             "fake_quantize_learnable_per_channel_affine: scale/zero_point must have shape [",
             x.size(axis), "], got ", scale.sizes(), " and ", zero_point.sizes());
  return LearnablePerChannel::apply(x, scale, zero_point, axis, quant_min, quant_max, grad_factor);
}

at::Tensor fake_quantize_lsq_plus(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& beta,
                                  int64_t quant_min, int64_t quant_max, double grad_factor) {
  check_learnable_inputs("fake_quantize_lsq_plus", x, scale, beta, quant_min, quant_max);
  // Written with differentiable ATen ops. Gradient scaling of LSQ (value unchanged, gradient
  // times grad_factor) is applied to scale and beta before they enter the formula.
  const at::Tensor s_g = (scale - scale * grad_factor).detach() + scale * grad_factor;
  const at::Tensor b_g = (beta - beta * grad_factor).detach() + beta * grad_factor;
  const at::Tensor v = (x - b_g) / s_g;
  const at::Tensor r = at::round(v).detach();
  const at::Tensor in_range = at::logical_and(at::ge(r, quant_min), at::le(r, quant_max)).to(x.scalar_type());
  // Straight-through: inside the range q acts as v (gradient 1), outside it is the constant bound.
  const at::Tensor q = at::clamp(r, quant_min, quant_max);
  const at::Tensor q_ste = (q - v * in_range).detach() + v * in_range;
  return q_ste * s_g + b_g;
}

}  // namespace qforge
