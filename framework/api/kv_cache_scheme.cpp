// KV-cache schemes (kv_cache_scheme.h).
#include "framework/api/kv_cache_scheme.h"

#include <nlohmann/json.hpp>
#include <sstream>

#include "framework/api/kv_static_scales.h"
#include "framework/core/error.h"

namespace qforge {

const char* kv_scales_name(KvScales s) {
  switch (s) {
    case KvScales::kDynamic: return "dynamic";
    case KvScales::kStaticHead: return "static_head";
    case KvScales::kStaticTensor: return "static_tensor";
  }
  return "dynamic";
}

KvScales kv_scales_from_name(const std::string& name, const char* who) {
  for (KvScales s : {KvScales::kDynamic, KvScales::kStaticHead, KvScales::kStaticTensor})
    if (name == kv_scales_name(s)) return s;
  throw Error(detail::str_cat(who, ": KV-cache scales '", name, "' are not known; supported: dynamic, static_head, "
                              "static_tensor"));
}

bool operator==(const KvCacheScheme& a, const KvCacheScheme& b) {
  if (a.qtype.has_value() != b.qtype.has_value()) return false;
  if (!a.qtype) return true;
  if (!(*a.qtype == *b.qtype) || a.symmetric != b.symmetric || a.group_size != b.group_size || a.scales != b.scales ||
      a.clip_ratio != b.clip_ratio)
    return false;
  if (a.observer != b.observer || (a.calibrated == nullptr) != (b.calibrated == nullptr)) return false;
  return a.calibrated == b.calibrated || *a.calibrated == *b.calibrated;
}

nlohmann::json kv_cache_scheme_json(const KvCacheScheme& scheme) {
  if (!scheme.quantized()) return nullptr;
  nlohmann::json j = {{"qtype", scheme.qtype->name}, {"symmetric", scheme.symmetric}, {"group_size", scheme.group_size}};
  if (scheme.is_static()) j["scales"] = kv_scales_name(scheme.scales);  // dynamic: absent, as files before the key
  if (scheme.clip_ratio != 1.0f) j["clip_ratio"] = static_cast<double>(scheme.clip_ratio);  // likewise
  if (scheme.calibrated) j["static_scales"] = kv_static_scales_json(*scheme.calibrated);
  return j;
}

KvCacheScheme kv_cache_scheme_from_json(const nlohmann::json& j, const char* who) {
  KvCacheScheme s;
  if (j.is_null()) return s;
  QF_REQUIRE(j.is_object() && j.contains("qtype") && j["qtype"].is_string(), who,
             ": the KV-cache scheme must be an object with a string 'qtype', got ", j.dump());
  for (const auto& [key, value] : j.items()) {
    QF_REQUIRE(key == "qtype" || key == "symmetric" || key == "group_size" || key == "scales" ||
                   key == "static_scales" || key == "clip_ratio",
               who, ": KV-cache scheme key '", key, "' is unknown; expected qtype, symmetric, group_size, scales, "
               "static_scales, clip_ratio");
    if (key == "clip_ratio") QF_REQUIRE(value.is_number(), who, ": KV-cache 'clip_ratio' must be a number");
    if (key == "symmetric") QF_REQUIRE(value.is_boolean(), who, ": KV-cache 'symmetric' must be true or false");
    if (key == "group_size") QF_REQUIRE(value.is_number_integer(), who, ": KV-cache 'group_size' must be an integer");
    if (key == "scales") QF_REQUIRE(value.is_string(), who, ": KV-cache 'scales' must be a string");
  }
  s.qtype = kv_cache_qtype_from_name(j["qtype"].get<std::string>(), who);
  s.symmetric = j.value("symmetric", true);
  s.group_size = j.value("group_size", int64_t{0});
  if (j.contains("scales")) s.scales = kv_scales_from_name(j["scales"].get<std::string>(), who);
  if (j.contains("clip_ratio")) s.clip_ratio = static_cast<float>(j["clip_ratio"].get<double>());
  if (j.contains("static_scales")) {
    QF_REQUIRE(s.is_static(), who, ": KV-cache 'static_scales' belong to a static scheme; 'scales' is ",
               kv_scales_name(s.scales));
    s.calibrated = kv_static_scales_from_json(j["static_scales"], who);
  }
  return s;
}

std::vector<std::string> kv_cache_qtype_names() { return {"int8", "int4"}; }

QType kv_cache_qtype_from_name(const std::string& name, const char* who) {
  if (name == "int8" || name == "qint8") return qint8;
  if (name == "int4" || name == "qint4") return qint4;
  throw Error(detail::str_cat(who, ": KV-cache qtype '", name, "' is not a KV-cache grid; supported: int8, int4"));
}

QSpec KvCacheScheme::spec(int64_t head_dim) const {
  QF_REQUIRE(quantized(), "kv_cache: a float cache has no QSpec");
  QSpec s;
  s.qtype = *qtype;
  s.granularity = Granularity::kPerGroup;
  s.group_size = group(head_dim);
  s.symmetric = symmetric;
  return s;
}

void KvCacheScheme::validate(int64_t head_dim, const std::string& who) const {
  QF_REQUIRE((!calibrated && !observer) || is_static(), who, ": KV-cache static scales belong to a static scheme "
             "(scales static_head or static_tensor); this one is ", to_string());
  if (!quantized()) return;
  QF_REQUIRE(*qtype == qint8 || *qtype == qint4, who, ": the KV cache takes qint8 or qint4, not ", qtype->name);
  QF_REQUIRE(clip_ratio > 0.0f && clip_ratio <= 1.0f, who, ": KV-cache clip_ratio must be in (0, 1], got ", clip_ratio);
  QF_REQUIRE(group_size >= 0, who, ": KV-cache group_size must be >= 0, got ", group_size);
  const int64_t g = group(head_dim);
  QF_REQUIRE(head_dim % g == 0, who, ": KV-cache group_size ", g, " does not divide head_dim ", head_dim);
  QF_REQUIRE(*qtype != qint4 || g % 2 == 0, who, ": a qint4 KV-cache group holds whole bytes of two codes; group ", g,
             " is odd");
}

int64_t KvCacheScheme::bytes_per_head(int64_t head_dim, int64_t float_bytes) const {
  if (!quantized()) return head_dim * float_bytes;
  const int64_t groups = head_dim / group(head_dim);
  // Codes (a byte, or half a byte for qint4), a float32 scale per group, an int8 zero point when asymmetric.
  return head_dim * qtype->bits / 8 + groups * 4 + (symmetric ? 0 : groups);
}

std::string KvCacheScheme::to_string() const {
  if (!quantized()) return "float";
  std::string s = std::string(qtype->name) + (symmetric ? " symmetric" : " asymmetric");
  switch (scales) {
    case KvScales::kDynamic: s += " per token and head"; break;
    case KvScales::kStaticHead: s += " static per head"; break;
    case KvScales::kStaticTensor: s += " static per tensor"; break;
  }
  if (group_size > 0) s += ", groups of " + std::to_string(group_size);
  if (clip_ratio != 1.0f) s += detail::str_cat(", ranges clipped at ", clip_ratio);
  // A recipe's static scheme is never calibrated: only a model's says where its scales stand.
  if (is_static() && (observer || calibrated)) s += observer ? " (calibrating)" : " (calibrated)";
  return s;
}

void KvCacheScheme::validate(int64_t layers, int64_t kv_heads, int64_t head_dim, const std::string& who) const {
  validate(head_dim, who);
  if (calibrated) calibrated->check(layers, kv_heads, head_dim / group(head_dim), *this, who);
}

void KvCacheModel::check_kv_cache_scheme(const KvCacheScheme& scheme, const std::string& who) const {
  scheme.validate(kv_cache_layers(), kv_cache_heads(), kv_cache_head_dim(), who);
}

std::vector<std::pair<std::string, KvCacheModel*>> kv_cache_models(torch::nn::Module& model) {
  std::vector<std::pair<std::string, KvCacheModel*>> out;
  if (auto* m = dynamic_cast<KvCacheModel*>(&model)) out.emplace_back("", m);
  for (auto& item : model.named_modules("", /*include_self=*/false))
    if (auto* m = dynamic_cast<KvCacheModel*>(item.value().get())) out.emplace_back(item.key(), m);
  return out;
}

std::vector<std::pair<std::string, const KvCacheModel*>> kv_cache_models(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, const KvCacheModel*>> out;
  for (const auto& [path, m] : kv_cache_models(const_cast<torch::nn::Module&>(model))) out.emplace_back(path, m);
  return out;
}

int set_kv_cache_scheme(torch::nn::Module& model, const KvCacheScheme& scheme) {
  const auto models = kv_cache_models(model);
  for (const auto& [path, m] : models) m->set_kv_cache_scheme(scheme);
  return static_cast<int>(models.size());
}

void require_no_calibrated_kv_scales(const torch::nn::Module& model, const std::string& who) {
  for (const auto& [path, m] : kv_cache_models(model))
    QF_REQUIRE(m->kv_cache_scheme().calibrated == nullptr, who, ": the KV cache", path.empty() ? "" : " of " + path,
               " holds static scales calibrated on the keys and values this changes (", m->kv_cache_scheme().to_string(),
               "); apply it first, then calibrate the cache");
}

std::string describe_kv_cache(const torch::nn::Module& model) {
  std::ostringstream os;
  for (const auto& [path, m] : kv_cache_models(model)) {
    if (!m->kv_cache_scheme().quantized()) continue;
    os << "KvCacheQuant" << (path.empty() ? "" : " " + path) << ": " << m->kv_cache_scheme().to_string() << ", "
       << m->kv_cache_bytes_per_token(m->kv_cache_scheme()) << " bytes per cached token (float32: "
       << m->kv_cache_bytes_per_token(KvCacheScheme{}) << ")\n";
  }
  return os.str();
}

}  // namespace qforge
