// Static KV-cache scales: calibration ranges, the scales they give, and their JSON (kv_static_scales.h).
#include "framework/api/kv_static_scales.h"

#include <ATen/ATen.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "framework/core/error.h"
#include "framework/core/qparams.h"
#include "kernels/cpu/kv_quantize.h"

namespace qforge {
namespace {

constexpr const char* kSideNames[2] = {"key", "value"};

std::vector<float> floats_of(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kFloat).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

std::vector<int32_t> ints_of(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kInt).contiguous();
  return {c.data_ptr<int32_t>(), c.data_ptr<int32_t>() + c.numel()};
}

at::Tensor tensor_from(const nlohmann::json& a, int64_t heads, int64_t groups, bool integer, const std::string& what) {
  QF_REQUIRE(a.is_array() && static_cast<int64_t>(a.size()) == heads * groups, what, " must be an array of ",
             heads * groups, " numbers (kv_heads x groups), got ", a.is_array() ? std::to_string(a.size()) : a.dump());
  at::Tensor t = at::empty({heads, groups}, integer ? at::kInt : at::kFloat);
  for (int64_t i = 0; i < heads * groups; ++i) {
    const nlohmann::json& v = a[static_cast<size_t>(i)];
    QF_REQUIRE(integer ? v.is_number_integer() : v.is_number(), what, "[", i, "] must be ",
               integer ? "an integer" : "a number", ", got ", v.dump());
    if (integer) {
      t.data_ptr<int32_t>()[i] = v.get<int32_t>();
    } else {
      t.data_ptr<float>()[i] = static_cast<float>(v.get<double>());
    }
  }
  return t;
}

}  // namespace

const KvSideScales& KvStaticScales::side(int64_t layer, bool values, const char* who) const {
  QF_REQUIRE(layer >= 0 && layer < static_cast<int64_t>(layers.size()), who, ": the static KV-cache scales cover ",
             layers.size(), " layers; layer ", layer, " has none");
  return layers[static_cast<size_t>(layer)][values];
}

void KvStaticScales::check(int64_t n_layers, int64_t kv_heads, int64_t groups, const KvCacheScheme& scheme,
                           const std::string& who) const {
  QF_REQUIRE(static_cast<int64_t>(layers.size()) == n_layers, who, ": the static KV-cache scales cover ", layers.size(),
             " layers; the model has ", n_layers);
  const int64_t qmin = scheme.qtype->quant_min, qmax = scheme.qtype->quant_max;
  for (size_t l = 0; l < layers.size(); ++l)
    for (int side = 0; side < 2; ++side) {
      const KvSideScales& s = layers[l][side];
      const std::string what = detail::str_cat(who, ": layer ", l, " ", kSideNames[side], " scales");
      QF_REQUIRE(s.scale.defined() && s.zero_point.defined() && s.scale.dim() == 2 && s.scale.size(0) == kv_heads &&
                     s.scale.size(1) == groups && s.zero_point.sizes() == s.scale.sizes(),
                 what, " must be [", kv_heads, ", ", groups, "] (kv_heads x groups), got ",
                 s.scale.defined() ? s.scale.sizes() : at::IntArrayRef{});
      // calculate_qparams never gives less than float32 eps; a smaller one (a crafted file) would
      // make 1 / s overflow and 0 · inf a NaN code.
      QF_REQUIRE(at::isfinite(s.scale).all().item<bool>() && s.scale.ge(kScaleEps).all().item<bool>(), what,
                 " must be finite and at least ", kScaleEps, " (float32 epsilon)");
      QF_REQUIRE(s.zero_point.ge(qmin).all().item<bool>() && s.zero_point.le(qmax).all().item<bool>(), what,
                 ": zero points must lie in [", qmin, ", ", qmax, "]");
      QF_REQUIRE(!scheme.symmetric || s.zero_point.eq(0).all().item<bool>(), what,
                 ": a symmetric scheme's zero points are 0");
    }
}

bool operator==(const KvStaticScales& a, const KvStaticScales& b) {
  if (a.layers.size() != b.layers.size()) return false;
  for (size_t l = 0; l < a.layers.size(); ++l)
    for (int side = 0; side < 2; ++side) {
      const KvSideScales &x = a.layers[l][side], &y = b.layers[l][side];
      if (!at::equal(x.scale, y.scale) || !at::equal(x.zero_point, y.zero_point)) return false;
    }
  return true;
}

nlohmann::json kv_static_scales_json(const KvStaticScales& s) {
  nlohmann::json j = nlohmann::json::object();
  const at::Tensor& first = s.layers.empty() ? at::Tensor() : s.layers[0][0].scale;
  j["kv_heads"] = first.defined() ? first.size(0) : 0;
  j["groups"] = first.defined() ? first.size(1) : 0;
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& layer : s.layers) {
    nlohmann::json l = nlohmann::json::object();
    for (int side = 0; side < 2; ++side) {
      // float -> double is exact, and the JSON writer prints the shortest digits reading back to that double.
      nlohmann::json scales = nlohmann::json::array();
      for (float v : floats_of(layer[side].scale)) scales.push_back(static_cast<double>(v));
      l[std::string(kSideNames[side]) + "_scale"] = std::move(scales);
      if (layer[side].zero_point.ne(0).any().item<bool>())
        l[std::string(kSideNames[side]) + "_zero_point"] = ints_of(layer[side].zero_point);
    }
    layers.push_back(std::move(l));
  }
  j["layers"] = std::move(layers);
  return j;
}

std::shared_ptr<const KvStaticScales> kv_static_scales_from_json(const nlohmann::json& j, const char* who) {
  const std::string w = detail::str_cat(who, ": static_scales");
  QF_REQUIRE(j.is_object() && j.contains("layers") && j["layers"].is_array(), w,
             " must be an object with 'kv_heads', 'groups' and a 'layers' array");
  for (const auto& [key, value] : j.items())
    QF_REQUIRE(key == "kv_heads" || key == "groups" || key == "layers", w, ": key '", key,
               "' is unknown; expected kv_heads, groups, layers");
  QF_REQUIRE(j.contains("kv_heads") && j["kv_heads"].is_number_integer() && j["kv_heads"].get<int64_t>() > 0 &&
                 j.contains("groups") && j["groups"].is_number_integer() && j["groups"].get<int64_t>() > 0,
             w, ": 'kv_heads' and 'groups' must be positive integers");
  const int64_t heads = j["kv_heads"].get<int64_t>(), groups = j["groups"].get<int64_t>();
  auto out = std::make_shared<KvStaticScales>();
  for (size_t l = 0; l < j["layers"].size(); ++l) {
    const nlohmann::json& layer = j["layers"][l];
    const std::string lw = detail::str_cat(w, ".layers[", l, "]");
    QF_REQUIRE(layer.is_object(), lw, " must be an object");
    for (const auto& [key, value] : layer.items())
      QF_REQUIRE(key == "key_scale" || key == "value_scale" || key == "key_zero_point" || key == "value_zero_point", lw,
                 ": key '", key, "' is unknown; expected key_scale, value_scale, key_zero_point, value_zero_point");
    std::array<KvSideScales, 2> sides;
    for (int side = 0; side < 2; ++side) {
      const std::string scale = std::string(kSideNames[side]) + "_scale", zp = std::string(kSideNames[side]) + "_zero_point";
      QF_REQUIRE(layer.contains(scale), lw, " has no '", scale, "'");
      sides[side].scale = tensor_from(layer[scale], heads, groups, false, lw + "." + scale);
      sides[side].zero_point = layer.contains(zp) ? tensor_from(layer[zp], heads, groups, true, lw + "." + zp)
                                                  : at::zeros({heads, groups}, at::kInt);
    }
    out->layers.push_back(std::move(sides));
  }
  return out;
}

KvRangeObserver::KvRangeObserver(const KvCacheScheme& scheme, int64_t layers, int64_t kv_heads, int64_t head_dim)
    : scheme_(scheme), head_dim_(head_dim) {
  QF_REQUIRE(scheme.is_static() && layers > 0 && kv_heads > 0, "KvRangeObserver: a static scheme and a model with "
             "layers and key/value heads, got ", scheme.to_string(), ", ", layers, " layers, ", kv_heads, " heads");
  scheme_.calibrated.reset(), scheme_.observer.reset();
  const int64_t groups = head_dim / scheme.group(head_dim);
  for (int64_t l = 0; l < layers; ++l) {
    lo_.push_back({at::zeros({kv_heads, groups}), at::zeros({kv_heads, groups})});
    hi_.push_back({at::zeros({kv_heads, groups}), at::zeros({kv_heads, groups})});
  }
  seen_ = at::zeros({layers}, at::kLong);
}

void KvRangeObserver::observe(int64_t layer, bool values, const at::Tensor& x) {
  QF_REQUIRE(layer >= 0 && layer < static_cast<int64_t>(lo_.size()), "KvRangeObserver: layer ", layer,
             " of a model with ", lo_.size());
  at::Tensor& lo = lo_[static_cast<size_t>(layer)][values];
  QF_REQUIRE(x.dim() == 4 && x.size(1) == lo.size(0) && x.size(3) == head_dim_, "KvRangeObserver: keys / values [B, ",
             lo.size(0), ", T, ", head_dim_, "] expected, got ", x.sizes());
  const int64_t g = scheme_.group(head_dim_);
  at::Tensor xf = x.detach().to(at::kFloat).to(at::kCPU);
  xf = at::where(at::isfinite(xf), xf, at::zeros({}, xf.options()));  // 0 is in every range already
  if (!scheme_.symmetric) xf = xf.clamp(-kernels::kKvRangeLimit, kernels::kKvRangeLimit);
  // [B, H, T, G, g] -> per head and group over batch, tokens and the group's channels.
  const at::Tensor grouped = xf.reshape({x.size(0), x.size(1), x.size(2), head_dim_ / g, g}).transpose(0, 1).reshape(
      {x.size(1), x.size(0) * x.size(2), head_dim_ / g, g});
  if (grouped.size(1) == 0) return;
  at::Tensor& hi = hi_[static_cast<size_t>(layer)][values];
  lo = at::minimum(lo, grouped.amin({1, 3}));
  hi = at::maximum(hi, grouped.amax({1, 3}));
  if (!values) seen_[layer] += x.size(0) * x.size(2);
}

std::shared_ptr<const KvStaticScales> KvRangeObserver::compute(const std::string& who) const {
  std::string missing;
  for (int64_t l = 0; l < seen_.size(0); ++l)
    if (seen_[l].item<int64_t>() == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(l);
  QF_REQUIRE(missing.empty(), who, ": the static KV-cache scales of layer(s) ", missing,
             " saw no token (run the calibration batches through the model's forward inside the Calibration)");
  const QSpec spec = scheme_.spec(head_dim_);
  auto out = std::make_shared<KvStaticScales>();
  for (size_t l = 0; l < lo_.size(); ++l) {
    std::array<KvSideScales, 2> sides;
    for (int side = 0; side < 2; ++side) {
      at::Tensor lo = lo_[l][side], hi = hi_[l][side];
      if (scheme_.scales == KvScales::kStaticTensor) lo = lo.min().expand_as(lo), hi = hi.max().expand_as(hi);
      if (scheme_.clip_ratio != 1.0f) lo = lo * scheme_.clip_ratio, hi = hi * scheme_.clip_ratio;
      const QParams qp = calculate_qparams(lo.contiguous(), hi.contiguous(), spec);
      sides[side].scale = qp.scale.to(at::kFloat).contiguous();
      sides[side].zero_point = qp.zero_point.to(at::kInt).contiguous();
    }
    out->layers.push_back(std::move(sides));
  }
  return out;
}

}  // namespace qforge
