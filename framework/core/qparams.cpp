// Min/max to (scale, zero_point), reproducing torch.ao.quantization.ObserverBase._calculate_qparams.
#include "framework/core/qparams.h"

#include <ATen/ATen.h>

#include <cmath>
#include <sstream>

#include "framework/core/enum_names.h"
#include "framework/core/error.h"

namespace qforge {

namespace {
constexpr NamedValue<Granularity> kGranularityNames[] = {
    {Granularity::kPerTensor, "per_tensor"},     {Granularity::kPerChannel, "per_channel"},
    {Granularity::kPerGroup, "per_group"},       {Granularity::kPerTensor, "tensor", true},
    {Granularity::kPerChannel, "channel", true}, {Granularity::kPerGroup, "group", true}};
}  // namespace

const char* to_string(Granularity g) { return name_of(kGranularityNames, g); }
Granularity granularity_from_name(const std::string& name) { return value_of(kGranularityNames, name, "granularity"); }
std::vector<std::string> granularity_names() { return names_of(kGranularityNames); }

int64_t QSpec::quant_min() const {
  if (qtype.is_float() || qtype.is_microscaling()) return 0;
  int64_t qmin = qtype.quant_min;
  // reduce_range halves the range as PyTorch's _calculate_qmin_qmax does: [-64, 63] / [0, 127].
  if (reduce_range) qmin = qtype.is_signed ? qmin / 2 : qmin;
  if (narrow_range && qtype.is_signed) qmin += 1;
  return qmin;
}

int64_t QSpec::quant_max() const {
  if (qtype.is_float() || qtype.is_microscaling()) return 0;
  int64_t qmax = qtype.quant_max;
  if (reduce_range) qmax = qtype.is_signed ? (qmax - 1) / 2 : qmax / 2;
  if (narrow_range && !qtype.is_signed) qmax -= 1;
  return qmax;
}

void QSpec::validate() const {
  QF_REQUIRE(granularity != Granularity::kPerGroup || group_size > 0,
             "QSpec: per_group granularity needs group_size > 0, got ", group_size);
  QF_REQUIRE(granularity == Granularity::kPerGroup || group_size == 0,
             "QSpec: group_size ", group_size, " is only meaningful with per_group granularity");
  QF_REQUIRE(!qtype.is_float() || (!narrow_range && !reduce_range),
             "QSpec: narrow_range/reduce_range do not apply to float8 qtype ", qtype.name);
  QF_REQUIRE(!qtype.is_codebook() || (!narrow_range && !reduce_range),
             "QSpec: narrow_range/reduce_range do not apply to codebook qtype ", qtype.name);
  // The block size is part of the format: a 32-element MX block is what the scale's meaning assumes.
  QF_REQUIRE(!qtype.is_microscaling() || (granularity == Granularity::kPerGroup && group_size == qtype.block_size),
             "QSpec: ", qtype.name, " scales blocks of ", qtype.block_size,
             " elements along the last dimension, fixed by the format; got ", qforge::to_string(granularity),
             granularity == Granularity::kPerGroup ? detail::str_cat(" with group_size ", group_size) : std::string());
  QF_REQUIRE(!qtype.is_microscaling() || (!narrow_range && !reduce_range),
             "QSpec: narrow_range/reduce_range do not apply to microscaling qtype ", qtype.name);
  QF_REQUIRE(qtype.is_float() || qtype.is_microscaling() || quant_min() < quant_max(), "QSpec: empty quantization range [",
             quant_min(), ", ", quant_max(), "] for ", qtype.name);
}

std::string QSpec::to_string() const {
  std::ostringstream os;
  os << qtype.name << " " << qforge::to_string(granularity);
  if (granularity == Granularity::kPerChannel) os << "(axis=" << axis << ")";
  if (granularity == Granularity::kPerGroup) os << "(group_size=" << group_size << ")";
  if (qtype.is_codebook()) return os.str();  // levels, no zero point
  if (qtype.is_microscaling()) return os.str();  // block scales, no zero point
  os << (symmetric || qtype.is_float() ? " symmetric" : " affine");
  if (narrow_range) os << " narrow_range";
  if (reduce_range) os << " reduce_range";
  return os.str();
}

std::vector<int64_t> qparams_shape(const QSpec& spec, at::IntArrayRef sizes) {
  switch (spec.granularity) {
    case Granularity::kPerTensor: return {};
    case Granularity::kPerChannel: {
      const int64_t dim = static_cast<int64_t>(sizes.size());
      QF_REQUIRE(dim > 0, "per_channel quantization needs a tensor with at least 1 dimension");
      QF_REQUIRE(spec.axis >= -dim && spec.axis < dim, "per_channel axis ", spec.axis,
                 " is out of range for a tensor of shape ", sizes);
      return {sizes[spec.axis < 0 ? spec.axis + dim : spec.axis]};
    }
    case Granularity::kPerGroup: {
      QF_REQUIRE(!sizes.empty(), "per_group quantization needs a tensor with at least 1 dimension");
      const int64_t k = sizes.back();
      QF_REQUIRE(spec.group_size > 0 && k % spec.group_size == 0, "per_group: last dimension ", k,
                 " of shape ", sizes, " is not a multiple of group_size ", spec.group_size);
      std::vector<int64_t> out(sizes.begin(), sizes.end());
      out.back() = k / spec.group_size;
      return out;
    }
  }
  return {};
}

namespace {
QParams calculate_qparams_cpu(const at::Tensor& min_val_in, const at::Tensor& max_val_in, const QSpec& spec);
}  // namespace

// The arithmetic runs on the CPU for every device: LibTorch's CUDA division by a scalar multiplies
// by its reciprocal (one ulp off true division), which would give a GPU model other scales than
// the same model on the CPU. The results go back to the inputs' device.
QParams calculate_qparams(const at::Tensor& min_val_in, const at::Tensor& max_val_in, const QSpec& spec) {
  if (min_val_in.is_cpu() && max_val_in.is_cpu()) return calculate_qparams_cpu(min_val_in, max_val_in, spec);
  QParams qp = calculate_qparams_cpu(min_val_in.to(at::kCPU), max_val_in.to(at::kCPU), spec);
  qp.scale = qp.scale.to(min_val_in.device());
  qp.zero_point = qp.zero_point.to(min_val_in.device());
  return qp;
}

namespace {
QParams calculate_qparams_cpu(const at::Tensor& min_val_in, const at::Tensor& max_val_in, const QSpec& spec) {
  spec.validate();
  QF_REQUIRE(!spec.qtype.is_codebook(), "calculate_qparams: ", spec.qtype.name,
             " levels come from k-means on the weights, not from a min/max (codebook qtypes are for weights)");
  QF_REQUIRE(!spec.qtype.is_microscaling(), "calculate_qparams: ", spec.qtype.name,
             " block scales come from each block's values (microscaling_qparams), not from a min/max");
  QF_REQUIRE(min_val_in.sizes() == max_val_in.sizes(), "calculate_qparams: min shape ",
             min_val_in.sizes(), " differs from max shape ", max_val_in.sizes());
  const at::Tensor min_val = min_val_in.to(at::kFloat);
  const at::Tensor max_val = max_val_in.to(at::kFloat);
  QF_REQUIRE(min_val.numel() > 0, "calculate_qparams: empty min/max");
  QF_REQUIRE(at::isfinite(min_val).all().item<bool>() && at::isfinite(max_val).all().item<bool>(),
             "calculate_qparams: min/max are not finite (the observer saw no finite values)");
  QF_REQUIRE(at::le(min_val, max_val).all().item<bool>(),
             "calculate_qparams: min > max (min ", min_val.min().item<float>(), ", max ",
             max_val.max().item<float>(), ")");

  const at::Tensor zeros = at::zeros_like(min_val);
  const at::Tensor min_neg = at::minimum(min_val, zeros);
  at::Tensor max_pos = at::maximum(max_val, zeros);
  const at::Tensor eps = at::full({}, kScaleEps, min_val.options());

  QParams qp;
  qp.spec = spec;
  if (spec.qtype.is_float()) {
    // Float8 grids are symmetric: the largest magnitude maps to the largest finite fp8 value.
    max_pos = at::maximum(-min_neg, max_pos);
    qp.scale = at::maximum(max_pos / spec.qtype.max_finite, eps);
    qp.zero_point = at::zeros(min_val.sizes(), min_val.options().dtype(at::kInt));
    return qp;
  }
  const int64_t qmin = spec.quant_min(), qmax = spec.quant_max();
  if (spec.symmetric) {
    max_pos = at::maximum(-min_neg, max_pos);
    qp.scale = at::maximum(max_pos / (static_cast<double>(qmax - qmin) / 2), eps);
    int64_t zp = 0;
    if (!spec.qtype.is_signed) {
      // PyTorch: 128 for the default quint8 range, the down-rounded midpoint for custom ranges.
      zp = (spec.qtype == quint8 && !spec.custom_range()) ? 128 : (qmin + qmax) / 2;
    }
    qp.zero_point = at::full(min_val.sizes(), zp, min_val.options().dtype(at::kInt));
  } else {
    qp.scale = at::maximum((max_pos - min_neg) / static_cast<double>(qmax - qmin), eps);
    // max − min of ±3e38 overflows to inf: no grid covers it (PyTorch returns an inf scale).
    QF_REQUIRE(at::isfinite(qp.scale).all().item<bool>(), "calculate_qparams: the range [",
               min_neg.min().item<float>(), ", ", max_pos.max().item<float>(),
               "] is wider than float32 can represent (its width overflows); no integer grid covers it");
    // torch.round is half-to-even, so zero points match PyTorch's observers.
    qp.zero_point =
        at::clamp(qmin - at::round(min_neg / qp.scale).to(at::kInt), qmin, qmax).to(at::kInt);
  }
  return qp;
}
}  // namespace

QParams make_qparams(const QSpec& spec, const at::Tensor& scale, const at::Tensor& zero_point) {
  spec.validate();
  QF_REQUIRE(!spec.qtype.is_codebook(), "make_qparams: ", spec.qtype.name,
             " has a codebook, not a scale and zero point (make_codebook_qparams)");
  QF_REQUIRE(!spec.qtype.is_microscaling(), "make_qparams: ", spec.qtype.name,
             " block scales come from each block's values (microscaling_qparams)");
  QF_REQUIRE(scale.sizes() == zero_point.sizes(), "make_qparams: scale shape ", scale.sizes(),
             " differs from zero_point shape ", zero_point.sizes());
  const at::Tensor s = scale.to(at::kFloat).contiguous();
  QF_REQUIRE(at::isfinite(s).all().item<bool>() && at::gt(s, 0).all().item<bool>(),
             "make_qparams: scale must be finite and > 0");
  const at::Tensor z = zero_point.to(at::kInt).contiguous();
  if (spec.qtype.is_integer()) {
    QF_REQUIRE(at::ge(z, spec.quant_min()).all().item<bool>() &&
                   at::le(z, spec.quant_max()).all().item<bool>(),
               "make_qparams: zero_point outside [", spec.quant_min(), ", ", spec.quant_max(), "]");
  } else {
    QF_REQUIRE(at::eq(z, 0).all().item<bool>(), "make_qparams: float8 grids have zero_point 0");
  }
  return QParams{spec, s, z};
}

std::vector<int64_t> qparam_shape(const QSpec& spec, const std::vector<int64_t>& shape) {
  switch (spec.granularity) {
    case Granularity::kPerTensor: return {};
    case Granularity::kPerChannel: {
      const int64_t axis = spec.axis < 0 ? spec.axis + static_cast<int64_t>(shape.size()) : spec.axis;
      QF_REQUIRE(axis >= 0 && axis < static_cast<int64_t>(shape.size()), "qparam_shape: axis ", spec.axis,
                 " outside a tensor of ", shape.size(), " dimensions");
      return {shape[static_cast<size_t>(axis)]};
    }
    case Granularity::kPerGroup: {
      QF_REQUIRE(!shape.empty() && spec.group_size > 0 && shape.back() % spec.group_size == 0,
                 "qparam_shape: the last dimension is not a multiple of group_size ", spec.group_size);
      std::vector<int64_t> out = shape;
      out.back() /= spec.group_size;
      return out;
    }
  }
  return {};
}

std::vector<int64_t> codebook_shape(const QSpec& spec, at::IntArrayRef sizes) {
  QF_REQUIRE(spec.qtype.is_codebook(), "codebook_shape: ", spec.qtype.name, " is not a codebook qtype");
  std::vector<int64_t> out = qparams_shape(spec, sizes);
  out.push_back(spec.qtype.levels());
  return out;
}

QParams make_codebook_qparams(const QSpec& spec, const at::Tensor& codebook, at::IntArrayRef sizes) {
  spec.validate();
  QF_REQUIRE(spec.qtype.is_codebook(), "make_codebook_qparams: ", spec.qtype.name, " is not a codebook qtype");
  const std::vector<int64_t> want = codebook_shape(spec, sizes);
  QF_REQUIRE(codebook.defined() && codebook.sizes() == at::IntArrayRef(want), "make_codebook_qparams: a ",
             spec.to_string(), " codebook for shape ", sizes, " must have shape ", at::IntArrayRef(want), ", got ",
             codebook.defined() ? codebook.sizes() : at::IntArrayRef{});
  const at::Tensor c = codebook.detach().to(at::kCPU, at::kFloat).contiguous();
  const at::Tensor bad = at::logical_or(at::logical_not(at::isfinite(c)), c.to(at::kHalf).to(at::kFloat) != c);
  if (bad.any().item<bool>()) {
    const int64_t i = bad.flatten().nonzero()[0][0].item<int64_t>();
    throw Error(detail::str_cat("make_codebook_qparams: codebook entry ", i, " (flat) = ", c.flatten()[i].item<float>(),
                                " is not a finite float16 value"));
  }
  QParams qp;
  qp.spec = spec;
  qp.codebook = c.clone();
  return qp;
}

bool same_spec(const QSpec& a, const QSpec& b) {
  return a.qtype == b.qtype && a.granularity == b.granularity && a.axis == b.axis && a.group_size == b.group_size &&
         a.symmetric == b.symmetric && a.narrow_range == b.narrow_range && a.reduce_range == b.reduce_range;
}

float QParams::scale_value() const {
  QF_REQUIRE(scale.defined() && scale.numel() == 1, "QParams::scale_value: a per-tensor scale, got ",
             scale.defined() ? scale.sizes() : at::IntArrayRef{});
  if (scale.is_cpu() && scale.scalar_type() == at::kFloat) return *scale.data_ptr<float>();
  return scale.to(at::kFloat).reshape({-1})[0].item<float>();
}

// A floating-point zero point must hold an integer (a grid's zero point is one).
int64_t QParams::zero_point_value() const {
  QF_REQUIRE(zero_point.defined() && zero_point.numel() == 1, "QParams::zero_point_value: a per-tensor zero point, got ",
             zero_point.defined() ? zero_point.sizes() : at::IntArrayRef{});
  if (zero_point.is_cpu() && zero_point.scalar_type() == at::kInt) return *zero_point.data_ptr<int32_t>();
  if (!at::isFloatingType(zero_point.scalar_type())) return zero_point.reshape({-1})[0].item<int64_t>();
  const double z = zero_point.reshape({-1})[0].item<double>();
  QF_REQUIRE(z == std::nearbyint(z), "QParams::zero_point_value: the zero point ", z, " is not an integer");
  return static_cast<int64_t>(z);
}

}  // namespace qforge
