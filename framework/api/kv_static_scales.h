// Static KV-cache scales (docs/kv_cache.md, "Static scales"): what a Calibration measures of each
// attention layer's keys and values (KvRangeObserver) and what a static KvCacheScheme then
// quantizes them with (KvStaticScales), instead of a scale computed from each appended position.
// For the observed range of one (layer, side, key/value head, group) over every calibration token,
//   lo = min(min x, 0), hi = max(max x, 0)      (finite values; asymmetric: clamped to ±FLT_MAX / 2)
// (kStaticTensor: lo, hi over every head and group of the layer and side; both times the scheme's
// clip_ratio when it is not 1), the scale and zero point are calculate_qparams(lo, hi) on the scheme's grid, the formulas the dynamic scheme applies per
// position (kv_quant.h), so a static scheme calibrated on one position equals the dynamic one there.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "framework/api/kv_cache_scheme.h"

namespace qforge {

// One side (keys or values) of one layer: scale float32 [kv_heads, groups], zero_point int32
// [kv_heads, groups] (zeros when symmetric).
struct KvSideScales {
  at::Tensor scale, zero_point;
};

struct KvStaticScales {
  // Per attention layer: [0] keys, [1] values.
  std::vector<std::array<KvSideScales, 2>> layers;

  // Layer `layer`'s keys (values: false) or values; an error naming `who` past the last layer
  // (a C string: each static-cache append asks, so no string is built per layer and token).
  const KvSideScales& side(int64_t layer, bool values, const char* who) const;
  // Throws qforge::Error (prefixed by `who`) unless there are `layers` layers of finite, positive
  // [kv_heads, groups] scales and zero points on the scheme's grid.
  void check(int64_t layers, int64_t kv_heads, int64_t groups, const KvCacheScheme& scheme,
             const std::string& who) const;
  // The same values (at::equal on every tensor).
  friend bool operator==(const KvStaticScales& a, const KvStaticScales& b);
};

// {"kv_heads": H, "groups": G, "layers": [{"key_scale": [H·G floats], "value_scale": [...],
// "key_zero_point": [H·G ints], "value_zero_point": [...]}, ...]} (zero points only when any is
// non-zero), heads major. Floats are written with the digits that read back to the same float32.
nlohmann::json kv_static_scales_json(const KvStaticScales& s);
// Unknown keys, wrong types and ragged lengths are refused, naming `who`.
std::shared_ptr<const KvStaticScales> kv_static_scales_from_json(const nlohmann::json& j, const char* who);

// The running ranges of a model's keys and values while a Calibration runs: lo / hi of the
// formula above per layer, side, key/value head and group, starting at 0 (every range holds 0).
class KvRangeObserver {
 public:
  // `scheme`: the static scheme being calibrated; the model's layers, key/value heads, head_dim.
  KvRangeObserver(const KvCacheScheme& scheme, int64_t layers, int64_t kv_heads, int64_t head_dim);
  // x [B, kv_heads, T, head_dim], the keys (values: false) or values layer `layer` caches.
  void observe(int64_t layer, bool values, const at::Tensor& x);
  // Tokens observed per layer (keys and values counted once), and the ranges themselves (float32
  // [kv_heads, groups]), for merging observations of several processes (min of lo, max of hi, sum).
  at::Tensor& seen() { return seen_; }
  at::Tensor& lo(int64_t layer, bool values) { return lo_.at(static_cast<size_t>(layer))[values]; }
  at::Tensor& hi(int64_t layer, bool values) { return hi_.at(static_cast<size_t>(layer))[values]; }
  // The scales of the ranges; throws naming the layers no token reached (`who` prefixes it).
  std::shared_ptr<const KvStaticScales> compute(const std::string& who) const;

 private:
  KvCacheScheme scheme_;
  int64_t head_dim_;
  std::vector<std::array<at::Tensor, 2>> lo_, hi_;
  at::Tensor seen_;  // int64 [layers]
};

}  // namespace qforge
