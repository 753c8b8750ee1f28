// New positions of a quantized KV cache written as codes in one pass (docs/kv_cache.md, "The
// scheme"): for rows x [B, kv_heads, T, D] (contiguous float), each group of `group` consecutive
// channels of a row gets, from its finite values (NaN and ±inf count as 0; asymmetric: clamped to
// ±FLT_MAX / 2 for the range only),
//   symmetric:  s = max(max(|min(lo, 0)|, max(hi, 0)) / ((qmax − qmin) / 2), eps),  z = 0
//   asymmetric: s = max((max(hi, 0) − min(lo, 0)) / (qmax − qmin), eps),
//               z = clamp(qmin − rint(min(lo, 0) / s), qmin, qmax)
//   q = clamp(rint(x · (1 / s)) + z, qmin, qmax)   (NaN stored as z; ±inf saturates)
// where lo and hi are first multiplied by clip_ratio (float) when it is not 1,
// (float operations, true division, rint half to even: calculate_qparams and quantize_to_int8
// bit for bit, as models::quantize_kv computes them with ATen ops), written to position
// `first + t` of stores [B, kv_heads, capacity, ...]: int8 codes (bits 8) or pairs of signed 4-bit
// codes per byte, element 2i in the low nibble (bits 4); float scales and, asymmetric, int8 zero
// points [B, kv_heads, capacity, D / group]. One scalar implementation: a decode step quantizes
// one position per head (a few hundred values), where the ATen ops it replaces took ~0.1 ms a layer.
// Static scales (static_scale set): s and z of head h and group g are static_scale[h · groups + g]
// and static_zero_point[h · groups + g] (null: 0) for every position; the codes follow the same q.
#pragma once

#include <cstdint>
#include <limits>

namespace qforge::kernels {

// Asymmetric groups take their range over values clamped to ±this, so max − min stays finite.
inline constexpr float kKvRangeLimit = std::numeric_limits<float>::max() / 2;

struct KvQuantizeProblem {
  const float* x = nullptr;    // [B, kv_heads, T, D], contiguous
  uint8_t* codes = nullptr;    // [B, kv_heads, capacity, D] int8, or [..., D / 2] packed int4
  float* scale = nullptr;      // [B, kv_heads, capacity, D / group]
  int8_t* zero_point = nullptr;  // same shape as scale; null: symmetric
  const float* static_scale = nullptr;         // [kv_heads, D / group]; null: each row's own scales
  const int32_t* static_zero_point = nullptr;  // [kv_heads, D / group], in [qmin, qmax]; null: 0
  int64_t batch = 0, heads = 0, T = 0, D = 0, group = 0, capacity = 0, first = 0;
  int bits = 8;
  float clip_ratio = 1.0f;  // in (0, 1]: lo, hi scaled before the scale is taken (dynamic scales)
};
void quantize_kv_rows(const KvQuantizeProblem& p);

}  // namespace qforge::kernels
