// The quantize / dequantize math of a quantized KV cache (docs/kv_cache.md) and the store one
// side (keys or values) of one layer keeps its codes in. For x [..., head_dim] and a scheme with
// groups of g elements, each group (one token, one key/value head, g consecutive channels) gets
//   symmetric:  s = max(max|x|, 0) / ((qmax - qmin) / 2),  z = 0
//   asymmetric: s = (max(x, 0) - min(x, 0)) / (qmax - qmin), z = qmin - rint(min(x, 0) / s) clamped
// (calculate_qparams, PyTorch's min/max formulas; s >= float32 eps; asymmetric, x clamped to
// ±FLT_MAX / 2 for the range only, so that max - min stays finite), q = clamp(rint(x * (1/s)) + z,
// qmin, qmax) and x̂ = (q - z) * s, the values fake_quantize gives. Non-finite entries: the scale
// comes from the group's finite values, ±inf saturates to qmax / qmin and NaN is stored as the
// zero point (it dequantizes to 0), so one bad value neither poisons the group nor reaches a cast.
// A static scheme (kv_static_scales.h) takes s and z of each key/value head and group from its
// calibrated scales instead and applies the same q and x̂ (values beyond the range saturate).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "framework/api/kv_cache_scheme.h"
#include "framework/api/kv_static_scales.h"
#include "framework/core/qparams.h"

namespace qforge::models {

// One tensor's codes: int8 [..., head_dim] (qint8) or uint8 [..., head_dim / 2] (qint4, two codes
// per byte, element 2i in the low nibble, as kernels::pack_s4_reference), float32 scales
// [..., groups] and, asymmetric only, int8 zero points [..., groups].
struct KvCodes {
  at::Tensor codes, scale, zero_point;
};

// Layer `layer`'s calibrated keys (values: false) or values scales under a static scheme; null for
// a dynamic one. An uncalibrated static scheme (or one being calibrated) is refused, naming `who`.
const KvSideScales* kv_static_side(const KvCacheScheme& scheme, int64_t layer, bool values, const char* who);
// The scales and zero points of x [..., head_dim] under `scheme` (quantized): from x's finite
// values, or `fixed` ([kv_heads, groups], x [B, kv_heads, T, head_dim]) broadcast over B and T.
QParams kv_qparams(const at::Tensor& x, const KvCacheScheme& scheme, const KvSideScales* fixed = nullptr);
// x [..., head_dim] (any float dtype) to codes; NaN / inf by the rule above.
KvCodes quantize_kv(const at::Tensor& x, const KvCacheScheme& scheme, const KvSideScales* fixed = nullptr);
// The float values (dtype `dtype`) the codes stand for: (q - z) * s.
at::Tensor dequantize_kv(const KvCodes& c, const KvCacheScheme& scheme, at::ScalarType dtype);
// x̂ through the fake-quant kernels (fake_quantize, straight-through gradient), x's dtype: what a
// cacheless forward of a model with this scheme attends to. Equals dequantize_kv(quantize_kv(x)).
at::Tensor fake_quantize_kv(const at::Tensor& x, const KvCacheScheme& scheme, const KvSideScales* fixed = nullptr);
// What attention layer `layer`'s forward without a cache attends to, in place: k and v as they
// are for a float scheme; recorded by the observer and left float while a static scheme is being
// calibrated; else their fake-quantized values (dynamic, or the calibrated static scales).
void cacheless_kv(at::Tensor& k, at::Tensor& v, const KvCacheScheme& scheme, int64_t layer, const char* who);

// int8 codes in [-8, 7], last dimension even, to bytes of two codes (low nibble first) and back.
// Tensor ops beside kernels::pack_s4_reference's scalar loop: any device and batch shape, no copy to the CPU.
at::Tensor pack_int4_pairs(const at::Tensor& codes);
at::Tensor unpack_int4_pairs(const at::Tensor& packed);

// A store of `capacity` positions shaped like `like` [B, kv_heads, T, n] holding the first `keep`
// positions of `old` (when defined): how the float and the quantized caches' stores grow.
at::Tensor new_kv_store(const at::Tensor& like, int64_t capacity, const at::Tensor& old, int64_t keep);

// One side of one layer of a quantized cache: codes, scales and zero points of `length` positions
// in preallocated stores [B, kv_heads, capacity, ...] that grow by doubling, as the float cache's.
class KvQuantStore {
 public:
  // Appends x [B, kv_heads, T, head_dim] (same B, kv_heads, head_dim and dtype as before) and
  // returns the dequantized values of every cached position, [B, kv_heads, length, head_dim].
  // `fixed`: the side's static scales (kv_static_side), null for dynamic schemes.
  at::Tensor append(const at::Tensor& x, const KvCacheScheme& scheme, int64_t reserve,
                    const KvSideScales* fixed = nullptr);
  // The same without dequantizing anything (attention on the codes reads codes() instead).
  void push(const at::Tensor& x, const KvCacheScheme& scheme, int64_t reserve, const KvSideScales* fixed = nullptr);
  // The dequantized values of the cached positions (undefined when empty).
  at::Tensor values(const KvCacheScheme& scheme) const;
  // The codes of the cached positions (views of the stores).
  KvCodes codes() const;
  void truncate(int64_t n) { length_ = n; }
  int64_t length() const { return length_; }
  int64_t capacity() const { return codes_.defined() ? codes_.size(2) : 0; }
  // Bytes of the cached positions' codes, scales and zero points; capacity_bytes: of the stores.
  int64_t bytes() const;
  int64_t capacity_bytes() const;
  // A deep copy: stores of the same capacity holding the same codes.
  KvQuantStore clone() const;

 private:
  at::Tensor codes_, scale_, zero_point_;
  at::ScalarType dtype_ = at::kFloat;  // what the values dequantize to (the appended tensors' dtype)
  int64_t length_ = 0;
};

}  // namespace qforge::models
