// QuantizedTensor: quantization, packing, unpacking and dequantization.
#include "framework/api/quantized_tensor.h"

#include <ATen/ATen.h>

#include <cmath>

#include "fake_quant/codebook.h"
#include "fake_quant/fake_quant_math.h"
#include "fake_quant/microscaling_math.h"
#include "framework/core/error.h"
#include "framework/api/quantizer.h"
#include "kernels/cpu/reference.h"

namespace qforge {

namespace {

const fq::Float8Format& float8_format(const QType& q) { return q == qfloat8_e5m2 ? fq::kE5M2 : fq::kE4M3; }

constexpr int64_t kMaxElements = int64_t{1} << 48;

int64_t product(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Bits one stored code takes in the packed data.
int storage_bits(const QType& qt) {
  if (qt.is_codebook()) return codebook_storage_bits(qt);
  return nibble_packed(qt) || qt.is_microscaling() ? 4 : qt.bits;
}

int64_t packed_bytes(const QType& qt, int64_t n) {
  const int64_t per_byte = 8 / storage_bits(qt);
  return (n + per_byte - 1) / per_byte;
}

bool packable(const QType& qt) {
  return qt.is_float() || qt.is_codebook() || qt.is_microscaling() ||
         (qt.is_integer() && (qt.bits == 8 || nibble_packed(qt) || (qt.bits == 2 && qt.is_signed)));
}

// The stored form of a spec: non-negative per-channel axis, 0 otherwise; group_size only per-group.
QSpec stored_spec(QSpec s, int64_t dim) {
  if (s.granularity == Granularity::kPerChannel) {
    if (s.axis < 0) s.axis += dim;
  } else {
    s.axis = 0;
  }
  if (s.granularity != Granularity::kPerGroup) s.group_size = 0;
  return s;
}

// Microscaling block scales as their bytes: E8M0 codes (mxfp4: each scale a power of two) or E4M3
// codes of scale / tensor_scale (nvfp4); refuses scales that are neither (QParams from elsewhere).
at::Tensor microscaling_scale_codes(const QParams& qp, float g) {
  const at::Tensor s = qp.scale.detach().cpu().to(at::kFloat).contiguous();
  at::Tensor codes = at::empty(s.sizes(), at::kByte);
  const float* ps = s.data_ptr<float>();
  uint8_t* pc = codes.data_ptr<uint8_t>();
  const bool nv = qp.spec.qtype == qnvfp4;
  for (int64_t i = 0; i < s.numel(); ++i) {
    // ilogb of 0, inf or NaN is undefined for E8M0: refuse such scales before encoding.
    QF_REQUIRE(std::isfinite(ps[i]) && ps[i] > 0.0f, "QuantizedTensor: ", qp.spec.qtype.name, " scale[", i,
               "] = ", ps[i], " is not a finite positive number");
    const float b = nv ? fq::round_to_float8(ps[i] / g, fq::kE4M3) : 0.0f;
    pc[i] = nv ? fq::encode_float8(b, fq::kE4M3) : fq::encode_e8m0(std::ilogb(ps[i]));
    const float back = nv ? fq::decode_float8(pc[i], fq::kE4M3) * g : fq::decode_e8m0(pc[i]);
    QF_REQUIRE(back == ps[i], "QuantizedTensor: ", qp.spec.qtype.name, " scale[", i, "] = ", ps[i], " is not ",
               nv ? "an E4M3 value times the tensor scale" : "a power of two in [2^-127, 2^127]");
  }
  return codes;
}

// The float32 block scales the codes stand for (the QParams scale).
at::Tensor microscaling_scales(const QuantizedTensor& q) {
  const at::Tensor c = q.scale.contiguous();
  at::Tensor s = at::empty(c.sizes(), at::kFloat);
  const uint8_t* pc = c.data_ptr<uint8_t>();
  float* ps = s.data_ptr<float>();
  const bool nv = q.spec.qtype == qnvfp4;
  const float g = nv ? q.tensor_scale.item<float>() : 1.0f;
  for (int64_t i = 0; i < c.numel(); ++i) ps[i] = nv ? fq::decode_float8(pc[i], fq::kE4M3) * g : fq::decode_e8m0(pc[i]);
  return s;
}

// Scale bytes read from a file: no E8M0 NaN (255); E4M3 codes positive, finite and not zero.
void validate_microscaling_scales(const QuantizedTensor& q, const std::vector<int64_t>& expected, const std::string& who) {
  const QType& qt = q.spec.qtype;
  const bool nv = qt == qnvfp4;
  try {
    q.spec.validate();  // the format's block size, whatever a file says
  } catch (const Error& e) {
    throw Error(who + ": " + e.what());
  }
  QF_REQUIRE(!q.zero_point.defined(), who, ": ", qt.name, " has block scales, no zero point");
  QF_REQUIRE(q.scale.defined() && q.scale.scalar_type() == at::kByte && q.scale.sizes().vec() == expected, who,
             ": ", qt.name, " scale must be uint8 ", nv ? "E4M3" : "E8M0", " codes of shape ", at::IntArrayRef(expected),
             ", got ", q.scale.defined() ? detail::str_cat(q.scale.scalar_type(), " ", q.scale.sizes()) : "none");
  const at::Tensor c = q.scale.to(at::kInt);
  if (!nv) {
    QF_REQUIRE(!q.tensor_scale.defined(), who, ": mxfp4 has no tensor scale");
    QF_REQUIRE(!at::eq(c, fq::kE8M0Nan).any().item<bool>(), who, ": an E8M0 scale is the NaN code 255");
    return;
  }
  QF_REQUIRE(q.tensor_scale.defined() && q.tensor_scale.scalar_type() == at::kFloat && q.tensor_scale.numel() == 1,
             who, ": nvfp4 needs a float32 tensor_scale of one value");
  const float g = q.tensor_scale.item<float>();
  QF_REQUIRE(std::isfinite(g) && g > 0.0f, who, ": nvfp4 tensor_scale ", g, " is not finite and > 0");
  // Sign bit clear, not zero, not the NaN code 0x7f.
  QF_REQUIRE(at::logical_and(c > 0, c < 0x7f).all().item<bool>(), who,
             ": an nvfp4 block scale is zero, negative or NaN (E4M3 codes 1..126 are valid)");
}

QuantizedTensor with_qparams(const QParams& qp, std::vector<int64_t> shape) {
  QuantizedTensor q;
  q.spec = stored_spec(qp.spec, static_cast<int64_t>(shape.size()));
  q.shape = std::move(shape);
  if (qp.spec.qtype.is_codebook()) {
    QF_REQUIRE(qp.codebook.defined(), "QuantizedTensor: ", qp.spec.qtype.name, " QParams without a codebook");
    q.codebook = qp.codebook.detach().cpu().to(at::kHalf).contiguous().clone();
    return q;
  }
  if (qp.spec.qtype.is_microscaling()) {
    const bool nv = qp.spec.qtype == qnvfp4;
    QF_REQUIRE(!nv || qp.tensor_scale.defined(), "QuantizedTensor: nvfp4 QParams without a tensor scale");
    const float g = nv ? qp.tensor_scale.detach().cpu().to(at::kFloat).item<float>() : 1.0f;
    QF_REQUIRE(std::isfinite(g) && g > 0.0f, "QuantizedTensor: nvfp4 tensor scale ", g, " is not finite and > 0");
    q.scale = microscaling_scale_codes(qp, g);
    if (nv) q.tensor_scale = at::full({}, g, at::kFloat);
    return q;
  }
  q.scale = qp.scale.detach().cpu().to(at::kFloat).contiguous().clone();
  q.zero_point = qp.zero_point.detach().cpu().to(at::kInt).contiguous().clone();
  return q;
}

// Row-major int8 values -> the packed data of `qt` (kernels/cpu reference packing for sub-byte).
at::Tensor pack_values(const at::Tensor& values, const QType& qt) {
  if (qt.bits == 8 && !qt.is_codebook()) return values.to(qt.is_signed ? at::kChar : at::kByte).contiguous().clone();
  const at::Tensor v8 = values.to(at::kChar).contiguous();
  const int64_t n = v8.numel();
  at::Tensor packed = at::zeros({packed_bytes(qt, n)}, at::kByte);
  const int8_t* src = v8.data_ptr<int8_t>();
  uint8_t* dst = packed.data_ptr<uint8_t>();
  // Codebook indices are unsigned fields of codebook_storage_bits (4 or 2).
  if (qt.is_codebook() && storage_bits(qt) == 2) kernels::pack_u2_reference(src, n, dst);
  else if (qt.is_codebook() || qt.is_microscaling()) kernels::pack_u4_reference(src, n, dst);
  else if (nibble_packed(qt) && qt.is_signed) kernels::pack_s4_reference(src, n, dst);
  else if (nibble_packed(qt)) kernels::pack_u4_reference(src, n, dst);
  else kernels::pack_s2_reference(src, n, dst);
  return packed;
}

}  // namespace

int64_t QuantizedTensor::numel() const { return product(shape); }

QParams QuantizedTensor::qparams() const {
  if (spec.qtype.is_microscaling()) {
    const at::Tensor s = microscaling_scales(*this);
    QParams qp{spec, s, at::zeros(s.sizes(), at::kInt)};
    qp.tensor_scale = tensor_scale;
    return qp;
  }
  QParams qp{spec, scale, zero_point};
  if (codebook.defined()) qp.codebook = codebook.to(at::kFloat);
  return qp;
}

int64_t QuantizedTensor::bytes() const {
  return (data.defined() ? data.nbytes() : 0) + (scale.defined() ? scale.nbytes() : 0) +
         (zero_point.defined() ? zero_point.nbytes() : 0) + (codebook.defined() ? codebook.nbytes() : 0) +
         (tensor_scale.defined() ? tensor_scale.nbytes() : 0);
}

void QuantizedTensor::validate(const std::string& who) const {
  const QType& qt = spec.qtype;
  QF_REQUIRE(packable(qt), who, ": qtype ", qt.name, " has no packed storage");
  // A shape read from a file: every dimension non-negative and an element count that cannot
  // overflow (a wrapped count could match a short packed length).
  int64_t count = 1;
  for (int64_t d : shape) {
    QF_REQUIRE(d >= 0, who, ": shape ", at::IntArrayRef(shape), " has a negative dimension");
    QF_REQUIRE(d == 0 || count <= kMaxElements / d, who, ": shape ", at::IntArrayRef(shape),
               " has more than 2^48 elements");
    count *= d;
  }
  std::vector<int64_t> expected_qp;
  try {
    expected_qp = qparams_shape(spec, shape);
  } catch (const Error& e) {
    throw Error(who + ": " + e.what());
  }
  if (qt.is_microscaling()) {
    validate_microscaling_scales(*this, expected_qp, who);
  } else if (qt.is_codebook()) {
    QF_REQUIRE(!scale.defined() && !zero_point.defined(), who, ": ", qt.name, " holds a codebook, not a scale and zero point");
    expected_qp.push_back(qt.levels());
    QF_REQUIRE(codebook.defined() && codebook.scalar_type() == at::kHalf && codebook.sizes().vec() == expected_qp, who,
               ": codebook must be float16 of shape ", at::IntArrayRef(expected_qp), " for ", spec.to_string(),
               " of shape ", at::IntArrayRef(shape), ", got ",
               codebook.defined() ? detail::str_cat(codebook.scalar_type(), " ", codebook.sizes()) : "none");
    QF_REQUIRE(at::isfinite(codebook.to(at::kFloat)).all().item<bool>(), who, ": codebook holds NaN or inf");
  } else {
    QF_REQUIRE(!codebook.defined(), who, ": ", qt.name, " has no codebook");
    QF_REQUIRE(scale.defined() && scale.scalar_type() == at::kFloat && scale.sizes().vec() == expected_qp,
               who, ": scale must be float32 of shape ", at::IntArrayRef(expected_qp), " for ",
               to_string(spec.granularity), " of shape ", at::IntArrayRef(shape), ", got ",
               scale.defined() ? detail::str_cat(scale.scalar_type(), " ", scale.sizes()) : "none");
    QF_REQUIRE(zero_point.defined() && zero_point.scalar_type() == at::kInt &&
                   zero_point.sizes().vec() == expected_qp,
               who, ": zero_point must be int32 of shape ", at::IntArrayRef(expected_qp), ", got ",
               zero_point.defined() ? detail::str_cat(zero_point.scalar_type(), " ", zero_point.sizes())
                                    : "none");
    // Values, as make_qparams requires them: a file can hold any bits.
    try {
      (void)make_qparams(spec, scale, zero_point);
    } catch (const Error& e) {
      throw Error(who + ": " + e.what());
    }
  }
  QF_REQUIRE(data.defined(), who, ": no data");
  if (qt.bits == 8) {
    const at::ScalarType want = qt.is_integer() && qt.is_signed ? at::kChar : at::kByte;
    QF_REQUIRE(data.scalar_type() == want && data.sizes().vec() == shape, who, ": ", qt.name,
               " data must be ", want, " of shape ", at::IntArrayRef(shape), ", got ",
               data.scalar_type(), " ", data.sizes());
  } else {
    const int64_t bytes = packed_bytes(qt, numel());
    QF_REQUIRE(data.scalar_type() == at::kByte && data.dim() == 1 && data.size(0) == bytes, who,
               ": ", qt.name, " data of shape ", at::IntArrayRef(shape), " must be 1-d uint8 of ",
               bytes, " bytes (", kPackingLowBitsFirst, "), got ", data.scalar_type(), " ",
               data.sizes());
  }
}

at::Tensor QuantizedTensor::int_values() const {
  QF_REQUIRE(data.defined(), "QuantizedTensor: the codes are held by a kernel object");
  if (spec.qtype.is_codebook()) {
    at::Tensor out = at::empty(shape, at::kChar);
    const at::Tensor packed = data.contiguous();
    if (storage_bits(spec.qtype) == 2) kernels::unpack_u2_reference(packed.data_ptr<uint8_t>(), out.numel(), out.data_ptr<int8_t>());
    else kernels::unpack_u4_reference(packed.data_ptr<uint8_t>(), out.numel(), out.data_ptr<int8_t>());
    return out.to(at::kByte);
  }
  if (spec.qtype.is_microscaling()) {
    at::Tensor out = at::empty(shape, at::kChar);
    kernels::unpack_u4_reference(data.contiguous().data_ptr<uint8_t>(), out.numel(), out.data_ptr<int8_t>());
    return out.to(at::kByte);
  }
  QF_REQUIRE(spec.qtype.is_integer(), "QuantizedTensor: ", spec.qtype.name, " codes have no integer values");
  if (spec.qtype.bits == 8) return data.reshape(shape);
  at::Tensor out = at::empty(shape, at::kChar);
  const at::Tensor packed = data.contiguous();
  const uint8_t* src = packed.data_ptr<uint8_t>();
  int8_t* dst = out.data_ptr<int8_t>();
  if (nibble_packed(spec.qtype) && spec.qtype.is_signed) kernels::unpack_s4_reference(src, out.numel(), dst);
  else if (nibble_packed(spec.qtype)) kernels::unpack_u4_reference(src, out.numel(), dst);
  else if (spec.qtype.bits == 2 && spec.qtype.is_signed) kernels::unpack_s2_reference(src, out.numel(), dst);
  else throw Error(detail::str_cat("QuantizedTensor: no packing for ", spec.qtype.name));
  return out;
}

at::Tensor QuantizedTensor::dequantize() const {
  if (spec.qtype.is_codebook()) return codebook_lookup(int_values(), qparams()).contiguous();
  if (spec.qtype.is_microscaling()) {
    // The E2M1 value times its block's float32 scale: the product fake_quantize forms.
    const at::Tensor codes = int_values().contiguous();
    at::Tensor v = at::empty(shape, at::kFloat);
    const uint8_t* pc = codes.data_ptr<uint8_t>();
    float* pv = v.data_ptr<float>();
    for (int64_t i = 0; i < codes.numel(); ++i) pv[i] = fq::decode_e2m1(pc[i]);
    return (grouped(v, spec) * broadcast_qparam(microscaling_scales(*this), v, spec)).reshape(shape);
  }
  if (spec.qtype.is_float()) {
    QF_REQUIRE(data.defined(), "QuantizedTensor: the codes are held by a kernel object");
    const fq::Float8Format& fmt = float8_format(spec.qtype);
    const at::Tensor codes = data.contiguous();
    at::Tensor v = at::empty({codes.numel()}, at::kFloat);
    const uint8_t* pc = codes.data_ptr<uint8_t>();
    float* pv = v.data_ptr<float>();
    for (int64_t i = 0; i < codes.numel(); ++i) pv[i] = fq::decode_float8(pc[i], fmt);
    v = v.reshape(shape);
    return (grouped(v, spec) * broadcast_qparam(scale.to(at::kFloat), v, spec)).reshape(shape);
  }
  return dequantize_int(int_values(), qparams());
}

QuantizedTensor quantize_tensor(const at::Tensor& w_in, const QParams& qp) {
  QF_REQUIRE(w_in.defined() && at::isFloatingType(w_in.scalar_type()),
             "quantize_tensor: needs a floating-point tensor");
  QF_REQUIRE(packable(qp.spec.qtype), "quantize_tensor: qtype ", qp.spec.qtype.name, " has no packed storage");
  const at::Tensor w = w_in.detach().cpu().to(at::kFloat).contiguous();
  QuantizedTensor q = with_qparams(qp, w.sizes().vec());
  if (qp.spec.qtype.is_codebook()) {
    // Indices of the nearest float16 level (the levels the tensor stores).
    q.data = pack_values(codebook_assign(w, q.qparams()), qp.spec.qtype);
  } else if (qp.spec.qtype.is_float()) {
    // fp8 codes of round_to_float8(w / s): decode(code) * s reproduces fake_quantize.
    const at::Tensor v = (grouped(w, qp.spec) / broadcast_qparam(q.scale, w, qp.spec)).reshape(w.sizes()).contiguous();
    q.data = at::empty(w.sizes(), at::kByte);
    const fq::Float8Format& fmt = float8_format(qp.spec.qtype);
    const float* pv = v.data_ptr<float>();
    uint8_t* out = q.data.data_ptr<uint8_t>();
    for (int64_t i = 0; i < w.numel(); ++i) out[i] = fq::encode_float8(fq::round_to_float8(pv[i], fmt), fmt);
  } else if (qp.spec.qtype.is_microscaling()) {
    // E2M1 codes of round_to_e2m1(w / s), with s the block's float32 scale (the QParams one).
    QF_REQUIRE(at::isfinite(w).all().item<bool>(), "quantize_tensor: ", qp.spec.qtype.name,
               " weights must be finite (E2M1 has no NaN or inf)");
    const at::Tensor v = (grouped(w, qp.spec) / broadcast_qparam(qp.scale.detach().cpu().to(at::kFloat), w, qp.spec))
                             .reshape(w.sizes()).contiguous();
    at::Tensor codes = at::empty(w.sizes(), at::kChar);
    const float* pv = v.data_ptr<float>();
    int8_t* pc = codes.data_ptr<int8_t>();
    for (int64_t i = 0; i < w.numel(); ++i) pc[i] = static_cast<int8_t>(fq::encode_e2m1(fq::round_to_e2m1(pv[i])));
    q.data = pack_values(codes, qp.spec.qtype);
  } else if (qp.spec.qtype == quint8) {
    // quint8 values do not fit int8: the same formula, kept in uint8.
    const at::Tensor g = grouped(w, qp.spec);
    const at::Tensor s = broadcast_qparam(q.scale, w, qp.spec);
    const at::Tensor z = broadcast_qparam(q.zero_point.to(at::kFloat), w, qp.spec);
    q.data = at::clamp(at::round(g * at::reciprocal(s)) + z, qp.spec.quant_min(), qp.spec.quant_max())
                 .to(at::kByte)
                 .reshape(w.sizes())
                 .contiguous();
  } else if (qp.spec.qtype.bits == 8) {
    // int8 codes are their own storage: the fresh codes, not a copy of them beside them.
    q.data = quantize_to_int8(w, qp).contiguous();
  } else {
    q.data = pack_values(quantize_to_int8(w, qp), qp.spec.qtype);
  }
  return q;
}

QuantizedTensor pack_quantized(const at::Tensor& values, const QParams& qp) {
  const QType qt = qp.spec.qtype;
  QF_REQUIRE((qt.is_integer() || qt.is_codebook() || qt.is_microscaling()) && packable(qt), "pack_quantized: qtype ",
             qt.name, " cannot be stored as packed integers");
  QF_REQUIRE(values.defined() && !at::isFloatingType(values.scalar_type()) && values.scalar_type() != at::kBool,
             "pack_quantized: needs integer values, got ",
             values.defined() ? detail::str_cat(values.scalar_type()) : "an undefined tensor");
  const at::Tensor v = values.detach().cpu().to(at::kInt).contiguous();
  if (v.numel() > 0) {
    const int64_t lo = v.min().item<int64_t>(), hi = v.max().item<int64_t>();
    // Microscaling values are the 16 E2M1 codes.
    const int64_t qmin = qt.is_microscaling() ? 0 : qt.quant_min, qmax = qt.is_microscaling() ? 15 : qt.quant_max;
    QF_REQUIRE(lo >= qmin && hi <= qmax, "pack_quantized: values in [", lo, ", ", hi, "] do not fit ", qt.name, " [",
               qmin, ", ", qmax, "]");
  }
  QuantizedTensor q = with_qparams(qp, v.sizes().vec());
  q.data = pack_values(v, qt);
  q.validate("pack_quantized");
  return q;
}

QuantizedTensor make_quantized(const QParams& qp, std::vector<int64_t> shape, at::Tensor data) {
  QuantizedTensor q = with_qparams(qp, std::move(shape));
  q.data = std::move(data);
  q.validate("make_quantized");
  return q;
}

}  // namespace qforge
