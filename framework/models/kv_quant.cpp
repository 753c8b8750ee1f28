// KV-cache quantization: codes, scales and their stores (kv_quant.h).
#include "framework/models/kv_quant.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "fake_quant/fake_quantize.h"
#include "framework/api/quantizer.h"
#include "framework/core/error.h"
#include "kernels/cpu/kv_quantize.h"

namespace qforge::models {
namespace {

constexpr const char* kKvQuant = "models/kv_cache";

bool is_int4(const KvCacheScheme& s) { return s.qtype->bits == 4; }

// NaN becomes 0 (the zero point's code); ±inf stays and saturates in the clamp.
at::Tensor without_nan(const at::Tensor& x) { return at::where(at::isnan(x), at::zeros({}, x.options()), x); }

int64_t tensor_bytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

}  // namespace

at::Tensor new_kv_store(const at::Tensor& like, int64_t capacity, const at::Tensor& old, int64_t keep) {
  at::Tensor s = at::empty({like.size(0), like.size(1), capacity, like.size(3)}, like.options());
  if (old.defined() && keep > 0) s.narrow(2, 0, keep).copy_(old.narrow(2, 0, keep));
  return s;
}

const KvSideScales* kv_static_side(const KvCacheScheme& scheme, int64_t layer, bool values, const char* who) {
  if (!scheme.is_static()) return nullptr;
  QF_REQUIRE(scheme.observer == nullptr, who, ": the static KV-cache scales (", scheme.to_string(),
             ") are being calibrated; a Calibration's forwards run without a cache");
  QF_REQUIRE(scheme.calibrated != nullptr, who, ": the KV cache is ", scheme.to_string(),
             "; run a Calibration (qforge::Calibration over a few batches) before attending with it");
  return &scheme.calibrated->side(layer, values, who);
}

QParams kv_qparams(const at::Tensor& x, const KvCacheScheme& scheme, const KvSideScales* fixed) {
  QF_REQUIRE(x.defined() && x.dim() >= 1 && x.is_floating_point(), kKvQuant,
             ": keys / values must be a floating tensor [..., head_dim]");
  scheme.validate(x.size(-1), kKvQuant);
  QF_REQUIRE(scheme.quantized(), kKvQuant, ": a float cache has no scales");
  const QSpec spec = scheme.spec(x.size(-1));
  if (fixed != nullptr) {
    QF_REQUIRE(x.dim() == 4 && fixed->scale.dim() == 2 && x.size(1) == fixed->scale.size(0) &&
                   x.size(3) / spec.group_size == fixed->scale.size(1),
               kKvQuant, ": static scales ", fixed->scale.sizes(), " do not fit keys / values ", x.sizes());
    const std::vector<int64_t> shape = {x.size(0), x.size(1), x.size(2), fixed->scale.size(1)};
    auto spread = [&](const at::Tensor& t) { return t.to(x.device()).unsqueeze(1).unsqueeze(0).expand(shape).contiguous(); };
    return make_qparams(spec, spread(fixed->scale), spread(fixed->zero_point));
  }
  const at::Tensor xf = x.detach().to(at::kFloat);
  at::Tensor g = grouped(at::where(at::isfinite(xf), xf, at::zeros({}, xf.options())), spec);
  // Asymmetric: max - min must stay finite (an inf scale would dequantize to 0 * inf = NaN).
  if (!scheme.symmetric) g = g.clamp(-kernels::kKvRangeLimit, kernels::kKvRangeLimit);
  if (scheme.clip_ratio != 1.0f) return calculate_qparams(g.amin(-1) * scheme.clip_ratio, g.amax(-1) * scheme.clip_ratio, spec);
  return calculate_qparams(g.amin(-1), g.amax(-1), spec);
}

KvCodes quantize_kv(const at::Tensor& x, const KvCacheScheme& scheme, const KvSideScales* fixed) {
  const QParams qp = kv_qparams(x, scheme, fixed);
  const at::Tensor q = quantize_to_int8(without_nan(x.detach()), qp);
  KvCodes c;
  c.codes = is_int4(scheme) ? pack_int4_pairs(q) : q;
  c.scale = qp.scale;
  if (!scheme.symmetric) c.zero_point = qp.zero_point.to(at::kChar);  // within [qmin, qmax] of an int8 grid
  return c;
}

at::Tensor dequantize_kv(const KvCodes& c, const KvCacheScheme& scheme, at::ScalarType dtype) {
  const at::Tensor q = is_int4(scheme) ? unpack_int4_pairs(c.codes) : c.codes;
  QParams qp;
  qp.spec = scheme.spec(q.size(-1));
  qp.scale = c.scale;
  qp.zero_point = c.zero_point.defined() ? c.zero_point : at::zeros(c.scale.sizes(), c.scale.options().dtype(at::kInt));
  return dequantize_int(q, qp).to(dtype);
}

at::Tensor fake_quantize_kv(const at::Tensor& x, const KvCacheScheme& scheme, const KvSideScales* fixed) {
  const QParams qp = kv_qparams(x, scheme, fixed);
  return fake_quantize(without_nan(x), qp).to(x.scalar_type());
}

void cacheless_kv(at::Tensor& k, at::Tensor& v, const KvCacheScheme& scheme, int64_t layer, const char* who) {
  if (!scheme.quantized()) return;
  if (scheme.is_static() && scheme.observer) {
    scheme.observer->observe(layer, false, k);
    scheme.observer->observe(layer, true, v);
    return;  // calibration sees float keys and values, as a Calibration's activation observers do
  }
  k = fake_quantize_kv(k, scheme, kv_static_side(scheme, layer, false, who));
  v = fake_quantize_kv(v, scheme, kv_static_side(scheme, layer, true, who));
}

at::Tensor pack_int4_pairs(const at::Tensor& codes) {
  QF_REQUIRE(codes.dim() >= 1 && codes.size(-1) % 2 == 0, kKvQuant, ": int4 codes pack in pairs; the last dimension ",
             codes.dim() ? codes.size(-1) : 0, " is odd");
  const at::Tensor c = codes.to(at::kInt).bitwise_and(15);  // two's-complement nibble
  const int64_t n = codes.size(-1);
  return (c.slice(-1, 0, n, 2) + c.slice(-1, 1, n, 2) * 16).to(at::kByte);
}

at::Tensor unpack_int4_pairs(const at::Tensor& packed) {
  const at::Tensor p = packed.to(at::kInt);
  const at::Tensor lo = p.bitwise_and(15), hi = at::div(p.bitwise_and(240), 16, "floor");
  auto sign = [](const at::Tensor& n) { return n - (n >= 8).to(at::kInt) * 16; };
  return at::stack({sign(lo), sign(hi)}, -1).flatten(-2).to(at::kChar);
}

at::Tensor KvQuantStore::append(const at::Tensor& x, const KvCacheScheme& scheme, int64_t reserve,
                                const KvSideScales* fixed) {
  push(x, scheme, reserve, fixed);
  return values(scheme);
}

void KvQuantStore::push(const at::Tensor& x, const KvCacheScheme& scheme, int64_t reserve, const KvSideScales* fixed) {
  QF_REQUIRE(x.dim() == 4, kKvQuant, ": keys / values must be [batch, kv_heads, T, head_dim], got ", x.sizes());
  // Float CPU positions are written in one pass (kernels::quantize_kv_rows, the same values);
  // others through quantize_kv's ATen ops.
  const bool fused = x.device().is_cpu() && x.scalar_type() == at::kFloat && x.numel() > 0;
  KvCodes c;
  if (fused) {
    scheme.validate(x.size(3), kKvQuant);
    QF_REQUIRE(scheme.quantized(), kKvQuant, ": a float cache has no codes");
    const int64_t B = x.size(0), H = x.size(1), D = x.size(3), groups = D / scheme.group(D);
    c.codes = at::empty({B, H, 0, is_int4(scheme) ? D / 2 : D}, x.options().dtype(is_int4(scheme) ? at::kByte : at::kChar));
    c.scale = at::empty({B, H, 0, groups}, x.options());
    if (!scheme.symmetric) c.zero_point = at::empty({B, H, 0, groups}, x.options().dtype(at::kChar));
    if (fixed != nullptr)
      QF_REQUIRE(fixed->scale.dim() == 2 && fixed->scale.size(0) == H && fixed->scale.size(1) == groups, kKvQuant,
                 ": static scales ", fixed->scale.sizes(), " do not fit keys / values ", x.sizes());
  } else {
    c = quantize_kv(x, scheme, fixed);
  }
  if (codes_.defined())
    QF_REQUIRE(codes_.size(0) == x.size(0) && codes_.size(1) == x.size(1) && codes_.size(3) == c.codes.size(3) &&
                   scale_.size(3) == c.scale.size(3) && dtype_ == x.scalar_type() && codes_.device() == x.device(),
               kKvQuant, ": appended ", x.sizes(), " ", x.scalar_type(), " on ", x.device(),
               " does not match the cached [", codes_.size(0), ", ", codes_.size(1), ", ", length_, ", ",
               x.size(3), "] ", dtype_, " on ", codes_.device());
  const int64_t T = x.size(2), need = length_ + T;
  if (!codes_.defined() || codes_.size(2) < need) {
    const int64_t capacity = std::max(codes_.defined() ? 2 * codes_.size(2) : reserve, need);
    codes_ = new_kv_store(c.codes, capacity, codes_, length_);
    scale_ = new_kv_store(c.scale, capacity, scale_, length_);
    if (c.zero_point.defined()) zero_point_ = new_kv_store(c.zero_point, capacity, zero_point_, length_);
  }
  if (fused) {
    const at::Tensor xc = x.detach().contiguous();
    kernels::KvQuantizeProblem p;
    p.x = xc.data_ptr<float>();
    p.codes = static_cast<uint8_t*>(codes_.data_ptr());
    p.scale = scale_.data_ptr<float>();
    p.zero_point = scheme.symmetric ? nullptr : static_cast<int8_t*>(zero_point_.data_ptr());
    p.batch = x.size(0), p.heads = x.size(1), p.T = T, p.D = x.size(3), p.group = scheme.group(x.size(3));
    p.capacity = codes_.size(2), p.first = length_, p.bits = scheme.qtype->bits, p.clip_ratio = scheme.clip_ratio;
    at::Tensor static_scale, static_zero_point;  // held for the call
    if (fixed != nullptr) {
      static_scale = fixed->scale.to(at::kFloat).contiguous();
      static_zero_point = fixed->zero_point.to(at::kInt).contiguous();
      p.static_scale = static_scale.data_ptr<float>();
      p.static_zero_point = static_zero_point.data_ptr<int32_t>();
    }
    kernels::quantize_kv_rows(p);
  } else {
    codes_.narrow(2, length_, T).copy_(c.codes);
    scale_.narrow(2, length_, T).copy_(c.scale);
    if (c.zero_point.defined()) zero_point_.narrow(2, length_, T).copy_(c.zero_point);
  }
  dtype_ = x.scalar_type();
  length_ = need;
}

KvCodes KvQuantStore::codes() const {
  KvCodes c;
  if (!codes_.defined()) return c;
  c.codes = codes_.narrow(2, 0, length_);
  c.scale = scale_.narrow(2, 0, length_);
  if (zero_point_.defined()) c.zero_point = zero_point_.narrow(2, 0, length_);
  return c;
}

at::Tensor KvQuantStore::values(const KvCacheScheme& scheme) const {
  return codes_.defined() ? dequantize_kv(codes(), scheme, dtype_) : at::Tensor();
}

int64_t KvQuantStore::capacity_bytes() const {
  return tensor_bytes(codes_) + tensor_bytes(scale_) + tensor_bytes(zero_point_);
}

int64_t KvQuantStore::bytes() const { return capacity() > 0 ? capacity_bytes() / capacity() * length_ : 0; }

KvQuantStore KvQuantStore::clone() const {
  KvQuantStore s = *this;
  for (at::Tensor* t : {&s.codes_, &s.scale_, &s.zero_point_})
    if (t->defined()) *t = t->clone();
  return s;
}

}  // namespace qforge::models
