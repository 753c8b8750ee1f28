// Packing and dequantization of frozen weights.
#include "framework/nn/frozen_weight.h"

#include <ATen/ATen.h>

#include "fake_quant/fake_quant_math.h"
#include "fake_quant/fake_quantize.h"
#include "framework/core/error.h"
#include "framework/quantizer.h"
#include "kernels/cpu/reference.h"

namespace qforge {

namespace {
const fq::Float8Format& float8_format(const QType& q) { return q == qfloat8_e5m2 ? fq::kE5M2 : fq::kE4M3; }
}  // namespace

at::Tensor pack_codes(const at::Tensor& values_in, const QType& qtype) {
  const at::Tensor v = values_in.to(at::kChar).contiguous().flatten();
  const int64_t n = v.numel();
  if (qtype.bits == 8) return v.clone();
  const int64_t per_byte = 8 / qtype.bits;
  at::Tensor packed = at::zeros({(n + per_byte - 1) / per_byte}, at::kByte);
  const int8_t* src = v.data_ptr<int8_t>();
  uint8_t* dst = packed.data_ptr<uint8_t>();
  if (qtype.bits == 4) {
    qtype.is_signed ? kernels::pack_s4_reference(src, n, dst) : kernels::pack_u4_reference(src, n, dst);
  } else if (qtype.bits == 2 && qtype.is_signed) {
    kernels::pack_s2_reference(src, n, dst);
  } else {
    throw Error(detail::str_cat("pack_codes: no packing for ", qtype.name));
  }
  return packed;
}

at::Tensor unpack_codes(const at::Tensor& packed, const QType& qtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (qtype.bits == 8) return packed.to(at::kChar).reshape(shape);
  at::Tensor out = at::empty({n}, at::kChar);
  const at::Tensor p = packed.contiguous();
  if (qtype.bits == 4) {
    qtype.is_signed ? kernels::unpack_s4_reference(p.data_ptr<uint8_t>(), n, out.data_ptr<int8_t>())
                    : kernels::unpack_u4_reference(p.data_ptr<uint8_t>(), n, out.data_ptr<int8_t>());
  } else if (qtype.bits == 2 && qtype.is_signed) {
    kernels::unpack_s2_reference(p.data_ptr<uint8_t>(), n, out.data_ptr<int8_t>());
  } else {
    throw Error(detail::str_cat("unpack_codes: no packing for ", qtype.name));
  }
  return out.reshape(shape);
}

FrozenWeight freeze_weight(const at::Tensor& w_in, const QParams& qp) {
  const at::Tensor w = w_in.detach().to(at::kFloat).contiguous();
  FrozenWeight f;
  f.qp = qp;
  f.shape.assign(w.sizes().begin(), w.sizes().end());
  if (qp.spec.qtype.is_float()) {
    // fp8 codes of round_to_float8(w / s): decode(code) * s reproduces fake_quantize.
    const at::Tensor v = w / broadcast_qparam(qp.scale.to(at::kFloat), w, qp.spec);
    const at::Tensor vc = v.contiguous();
    f.storage = at::empty({w.numel()}, at::kByte);
    const fq::Float8Format& fmt = float8_format(qp.spec.qtype);
    const float* pv = vc.data_ptr<float>();
    uint8_t* out = f.storage.data_ptr<uint8_t>();
    for (int64_t i = 0; i < w.numel(); ++i) out[i] = fq::encode_float8(fq::round_to_float8(pv[i], fmt), fmt);
    return f;
  }
  if (qp.spec.qtype == quint8) {
    // quint8 codes are stored as uint8.
    const at::Tensor s = broadcast_qparam(qp.scale.to(at::kFloat), w, qp.spec);
    const at::Tensor z = broadcast_qparam(qp.zero_point.to(at::kFloat), w, qp.spec);
    f.storage = at::clamp(at::round(w * at::reciprocal(s)) + z, 0, 255).to(at::kByte).flatten();
    return f;
  }
  f.storage = pack_codes(quantize_to_int8(w, qp), qp.spec.qtype);
  return f;
}

int64_t FrozenWeight::bytes() const {
  return (storage.defined() ? storage.nbytes() : 0) + qp.scale.nbytes() + qp.zero_point.nbytes();
}

at::Tensor FrozenWeight::int_values() const {
  QF_REQUIRE(storage.defined(), "FrozenWeight: codes are held by a kernel object");
  QF_REQUIRE(qp.spec.qtype.is_integer(), "FrozenWeight: float8 weights have no integer values");
  if (qp.spec.qtype == quint8) return storage.to(at::kInt).reshape(shape);
  return unpack_codes(storage, qp.spec.qtype, shape);
}

at::Tensor FrozenWeight::dequantize() const {
  if (qp.spec.qtype.is_float()) {
    const fq::Float8Format& fmt = float8_format(qp.spec.qtype);
    const at::Tensor codes = storage.contiguous();
    at::Tensor v = at::empty({codes.numel()}, at::kFloat);
    const uint8_t* pc = codes.data_ptr<uint8_t>();
    float* pv = v.data_ptr<float>();
    for (int64_t i = 0; i < codes.numel(); ++i) pv[i] = fq::decode_float8(pc[i], fmt);
    v = v.reshape(shape);
    return v * broadcast_qparam(qp.scale.to(at::kFloat), v, qp.spec);
  }
  return dequantize_int(int_values(), qp);
}

}  // namespace qforge
