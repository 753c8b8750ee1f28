// Microscaling block scales from a tensor's values, and fake quantisation with them.
#include "fake_quant/microscaling.h"

#include <ATen/ATen.h>

#include "fake_quant/fake_quantize.h"
#include "fake_quant/microscaling_math.h"
#include "framework/core/error.h"

namespace qforge {

QSpec microscaling_spec(const QType& qtype) {
  QF_REQUIRE(qtype.is_microscaling(), "microscaling_spec: ", qtype.name,
             " is not a microscaling qtype (mxfp4, nvfp4)");
  QSpec s;
  s.qtype = qtype;
  s.granularity = Granularity::kPerGroup;
  s.group_size = qtype.block_size;
  s.symmetric = true;
  return s;
}

namespace {

// A scale from a NaN or inf would poison the whole block: refuse, naming the first such element.
void require_finite(const at::Tensor& x) {
  const at::Tensor bad = at::logical_not(at::isfinite(x)).flatten();
  if (!bad.any().item<bool>()) return;
  const int64_t i = bad.nonzero()[0][0].item<int64_t>();
  throw Error(detail::str_cat("microscaling_qparams: element ", i, " of a tensor of shape ", x.sizes(), " is ",
                              x.flatten()[i].item<float>(),
                              "; block scales need finite values (NaN and inf are refused)"));
}

float checked_tensor_scale(const at::Tensor& given) {
  QF_REQUIRE(given.numel() == 1, "microscaling_qparams: the nvfp4 tensor scale has one value, got shape ",
             given.sizes());
  const float g = given.to(at::kCPU, at::kFloat).item<float>();
  QF_REQUIRE(std::isfinite(g) && g > 0.0f, "microscaling_qparams: the nvfp4 tensor scale must be finite and > 0, got ", g);
  return g;
}

}  // namespace

QParams microscaling_qparams(const at::Tensor& x_in, const QSpec& spec, const at::Tensor& tensor_scale) {
  spec.validate();
  QF_REQUIRE(spec.qtype.is_microscaling(), "microscaling_qparams: ", spec.qtype.name,
             " is not a microscaling qtype (mxfp4, nvfp4)");
  QF_REQUIRE(x_in.defined() && x_in.dim() >= 1, "microscaling_qparams: needs a tensor of at least one dimension");
  const at::Tensor x = x_in.detach().to(at::kCPU, at::kFloat).contiguous();
  const std::vector<int64_t> shape = qparams_shape(spec, x.sizes());  // refuses K % block != 0
  require_finite(x);
  const bool nv = spec.qtype == qnvfp4;
  QF_REQUIRE(!tensor_scale.defined() || nv, "microscaling_qparams: ", spec.qtype.name,
             " has no tensor scale (only nvfp4 does)");
  float g = 1.0f;
  if (nv)
    g = tensor_scale.defined() ? checked_tensor_scale(tensor_scale)
                               : fq::nvfp4_tensor_scale(x.numel() > 0 ? x.abs().max().item<float>() : 0.0f);
  const int64_t block = spec.qtype.block_size;
  const at::Tensor amax = x.reshape({-1, block}).abs().amax(1).contiguous();
  at::Tensor scale = at::empty({amax.numel()}, at::kFloat);
  const float* a = amax.data_ptr<float>();
  float* s = scale.data_ptr<float>();
  for (int64_t b = 0; b < amax.numel(); ++b)
    s[b] = nv ? fq::nvfp4_block_scale(a[b], g) * g : std::ldexp(1.0f, fq::mx_shared_exponent(a[b]));
  QParams qp;
  qp.spec = spec;
  qp.scale = scale.reshape(shape).to(x_in.device());
  qp.zero_point = at::zeros(shape, at::TensorOptions(at::kInt).device(x_in.device()));
  if (nv) qp.tensor_scale = at::full({}, g, at::TensorOptions(at::kFloat).device(x_in.device()));
  return qp;
}

at::Tensor fake_quantize_microscaling(const at::Tensor& x, const QSpec& spec, const at::Tensor& tensor_scale) {
  return fake_quantize(x, microscaling_qparams(x, spec, tensor_scale));
}

}  // namespace qforge
