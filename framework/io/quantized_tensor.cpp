// QuantizedTensor: packing, unpacking and dequantization of stored quantized weights.
#include "framework/io/quantized_tensor.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"
#include "kernels/cpu/reference.h"

namespace qforge::io {

namespace {
int64_t product(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

int64_t packed_bytes(const QType& qt, int64_t n) {
  const int64_t per_byte = 8 / qt.bits;
  return (n + per_byte - 1) / per_byte;
}

void require_integer_grid(const QType& qt, const char* who) {
  QF_REQUIRE(qt.is_integer() && (qt.bits == 8 || qt.bits == 4 || qt.bits == 2), "framework/io: ",
             who, ": qtype ", qt.name,
             " cannot be stored as packed integers (float8 checkpoints are not supported yet)");
}
}  // namespace

int64_t QuantizedTensor::numel() const { return product(shape); }

QParams QuantizedTensor::qparams() const {
  QParams qp;
  qp.spec.qtype = qtype;
  qp.spec.granularity = granularity;
  qp.spec.axis = axis;
  qp.spec.group_size = group_size;
  qp.scale = scale;
  qp.zero_point = zero_point;
  return qp;
}

void QuantizedTensor::validate(const std::string& who) const {
  require_integer_grid(qtype, who.c_str());
  QSpec spec = qparams().spec;
  std::vector<int64_t> expected_qp;
  try {
    expected_qp = qparams_shape(spec, shape);
  } catch (const Error& e) {
    throw Error(who + ": " + e.what());
  }
  QF_REQUIRE(scale.defined() && scale.scalar_type() == at::kFloat &&
                 scale.sizes().vec() == expected_qp,
             who, ": scale must be float32 of shape ", at::IntArrayRef(expected_qp), " for ",
             to_string(granularity), " of shape ", at::IntArrayRef(shape), ", got ",
             scale.defined() ? detail::str_cat(scale.scalar_type(), " ", scale.sizes()) : "none");
  QF_REQUIRE(zero_point.defined() && zero_point.scalar_type() == at::kInt &&
                 zero_point.sizes().vec() == expected_qp,
             who, ": zero_point must be int32 of shape ", at::IntArrayRef(expected_qp), ", got ",
             zero_point.defined() ? detail::str_cat(zero_point.scalar_type(), " ", zero_point.sizes())
                                  : "none");
  QF_REQUIRE(data.defined(), who, ": no data");
  if (qtype.bits == 8) {
    const at::ScalarType want = qtype.is_signed ? at::kChar : at::kByte;
    QF_REQUIRE(data.scalar_type() == want && data.sizes().vec() == shape, who, ": ", qtype.name,
               " data must be ", want, " of shape ", at::IntArrayRef(shape), ", got ",
               data.scalar_type(), " ", data.sizes());
  } else {
    const int64_t bytes = packed_bytes(qtype, numel());
    QF_REQUIRE(data.scalar_type() == at::kByte && data.dim() == 1 && data.size(0) == bytes, who,
               ": ", qtype.name, " data of shape ", at::IntArrayRef(shape), " must be 1-d uint8 of ",
               bytes, " bytes (", kPackingLowBitsFirst, "), got ", data.scalar_type(), " ",
               data.sizes());
  }
}

at::Tensor expand_qparam(const at::Tensor& p, Granularity g, int64_t axis, int64_t group_size,
                         at::IntArrayRef shape) {
  switch (g) {
    case Granularity::kPerTensor: return p.reshape({}).expand(shape);
    case Granularity::kPerChannel: {
      const int64_t dim = static_cast<int64_t>(shape.size());
      const int64_t a = axis < 0 ? axis + dim : axis;
      std::vector<int64_t> view(shape.size(), 1);
      view[a] = shape[a];
      return p.reshape(view).expand(shape);
    }
    case Granularity::kPerGroup: return p.repeat_interleave(group_size, -1);
  }
  return p;
}

QuantizedTensor pack_quantized(const at::Tensor& values, const QParams& qp) {
  const QType qt = qp.spec.qtype;
  require_integer_grid(qt, "pack_quantized");
  QF_REQUIRE(values.defined() && !at::isFloatingType(values.scalar_type()) &&
                 values.scalar_type() != at::kBool,
             "framework/io: pack_quantized needs integer values, got ",
             values.defined() ? detail::str_cat(values.scalar_type()) : "an undefined tensor");
  const at::Tensor v = values.detach().cpu().to(at::kInt).contiguous();
  if (v.numel() > 0) {
    const int64_t lo = v.min().item<int64_t>(), hi = v.max().item<int64_t>();
    QF_REQUIRE(lo >= qt.quant_min && hi <= qt.quant_max, "framework/io: pack_quantized: values in [",
               lo, ", ", hi, "] do not fit ", qt.name, " [", qt.quant_min, ", ", qt.quant_max, "]");
  }
  QuantizedTensor q;
  q.qtype = qt;
  q.granularity = qp.spec.granularity;
  q.axis = qp.spec.axis;
  if (q.granularity == Granularity::kPerChannel && q.axis < 0) q.axis += v.dim();
  q.group_size = q.granularity == Granularity::kPerGroup ? qp.spec.group_size : 0;
  q.shape = v.sizes().vec();
  q.scale = qp.scale.detach().cpu().to(at::kFloat).contiguous().clone();
  q.zero_point = qp.zero_point.detach().cpu().to(at::kInt).contiguous().clone();
  if (qt.bits == 8) {
    q.data = v.to(qt.is_signed ? at::kChar : at::kByte);
  } else {
    const at::Tensor v8 = v.to(at::kChar).contiguous();
    q.data = at::zeros({packed_bytes(qt, v.numel())}, at::kByte);
    const int8_t* src = v8.data_ptr<int8_t>();
    uint8_t* dst = q.data.data_ptr<uint8_t>();
    if (qt.bits == 4 && qt.is_signed) kernels::pack_s4_reference(src, v.numel(), dst);
    else if (qt.bits == 4) kernels::pack_u4_reference(src, v.numel(), dst);
    else kernels::pack_s2_reference(src, v.numel(), dst);
  }
  q.validate("framework/io: pack_quantized");
  return q;
}

QuantizedTensor quantize_tensor(const at::Tensor& w, const QParams& qp) {
  require_integer_grid(qp.spec.qtype, "quantize_tensor");
  QF_REQUIRE(w.defined() && at::isFloatingType(w.scalar_type()),
             "framework/io: quantize_tensor needs a floating-point tensor");
  const at::Tensor x = w.detach().cpu().to(at::kFloat);
  const at::Tensor scale = expand_qparam(qp.scale.to(at::kFloat).cpu(), qp.spec.granularity,
                                         qp.spec.axis, qp.spec.group_size, x.sizes());
  const at::Tensor zp = expand_qparam(qp.zero_point.to(at::kFloat).cpu(), qp.spec.granularity,
                                      qp.spec.axis, qp.spec.group_size, x.sizes());
  // Multiply by the float reciprocal, as ATen's quantize kernels and fake_quant do.
  const at::Tensor inv = at::reciprocal(scale);
  const at::Tensor q = at::clamp(at::round(x * inv + zp), qp.spec.quant_min(), qp.spec.quant_max());
  return pack_quantized(q.to(at::kInt), qp);
}

at::Tensor unpack_values(const QuantizedTensor& q) {
  q.validate("framework/io: unpack_values");
  if (q.qtype.bits == 8) return q.data;
  at::Tensor out = at::empty(q.shape, at::kChar);
  const at::Tensor packed = q.data.contiguous();
  const uint8_t* src = packed.data_ptr<uint8_t>();
  int8_t* dst = out.data_ptr<int8_t>();
  if (q.qtype.bits == 4 && q.qtype.is_signed) kernels::unpack_s4_reference(src, out.numel(), dst);
  else if (q.qtype.bits == 4) kernels::unpack_u4_reference(src, out.numel(), dst);
  else kernels::unpack_s2_reference(src, out.numel(), dst);
  return out;
}

at::Tensor dequantize(const QuantizedTensor& q) {
  const at::Tensor v = unpack_values(q).to(at::kInt);
  const at::Tensor zp = expand_qparam(q.zero_point, q.granularity, q.axis, q.group_size, q.shape);
  const at::Tensor scale = expand_qparam(q.scale, q.granularity, q.axis, q.group_size, q.shape);
  return (v - zp).to(at::kFloat) * scale;
}

}  // namespace qforge::io
