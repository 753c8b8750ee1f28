// Strict named-state import/export for qforge models.
#include "framework/models/state_dict.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <ATen/ATen.h>

#include <set>
#include <sstream>

#include "framework/core/error.h"

namespace qforge::models {

nlohmann::json read_config_json(const std::string& path, const std::string& who) {
  std::ifstream f(path);
  QF_REQUIRE(f, who, ": cannot open config ", path);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(detail::str_cat(who, ": ", path, " is not valid JSON: ", e.what()));
  }
}
namespace {

bool is_quantizer_state(const std::string& name) {
  std::stringstream ss(name);
  std::string part;
  while (std::getline(ss, part, '.')) {
    constexpr const char* kSuffix = "_quantizer";
    if (part.size() >= 10 && part.compare(part.size() - 10, 10, kSuffix) == 0) return true;
  }
  return false;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string list(const std::vector<std::string>& v, size_t max_items = 20) {
  std::string out;
  for (size_t i = 0; i < v.size() && i < max_items; ++i) out += (i ? ", " : "") + v[i];
  if (v.size() > max_items) out += ", ... (" + std::to_string(v.size() - max_items) + " more)";
  return out;
}

}  // namespace

StateDict model_state(const torch::nn::Module& model) {
  StateDict out;
  for (const auto& p : model.named_parameters(/*recurse=*/true))
    if (p.value().defined() && !is_quantizer_state(p.key())) out[p.key()] = p.value();
  for (const auto& b : model.named_buffers(/*recurse=*/true))
    if (b.value().defined() && !is_quantizer_state(b.key())) out[b.key()] = b.value();
  return out;
}

void load_model_state(torch::nn::Module& model, const StateDict& state, const LoadStateOptions& options) {
  StateDict target = model_state(model);
  std::vector<std::string> unknown, missing, mismatched, dtypes, values;
  std::set<std::string> seen;
  for (const auto& [key, t] : state) {
    bool ignored = false;
    for (const auto& s : options.ignore_suffixes) ignored |= ends_with(key, s);
    if (ignored) continue;
    auto it = target.find(key);
    if (it == target.end()) {
      unknown.push_back(key);
      continue;
    }
    seen.insert(key);
    if (!t.sizes().equals(it->second.sizes())) {
      std::ostringstream os;
      os << key << " (checkpoint " << t.sizes() << ", model " << it->second.sizes() << ")";
      mismatched.push_back(os.str());
    }
    // Floats convert among float widths only: integers or booleans stored for float weights
    // would be truncated values, not weights.
    const bool want_float = at::isFloatingType(it->second.scalar_type());
    if (want_float != at::isFloatingType(t.scalar_type()) || (t.scalar_type() == at::kBool) != (it->second.scalar_type() == at::kBool)) {
      std::ostringstream os;
      os << key << " (checkpoint " << t.scalar_type() << ", model " << it->second.scalar_type() << ")";
      dtypes.push_back(os.str());
    } else if (want_float && !options.allow_non_finite) {
      const int64_t bad = t.numel() - at::isfinite(t).sum().item<int64_t>();
      const bool variance = ends_with(key, "running_var");
      const int64_t negative = variance ? at::lt(t, 0).sum().item<int64_t>() : 0;
      if (bad > 0) values.push_back(key + " (" + std::to_string(bad) + " NaN/inf values)");
      if (negative > 0) values.push_back(key + " (" + std::to_string(negative) + " negative variances)");
    }
  }
  for (const auto& [key, t] : target) {
    if (seen.count(key)) continue;
    bool allowed = false;
    for (const auto& a : options.allow_missing) allowed |= ends_with(key, a);
    if (!allowed) missing.push_back(key);
  }
  if (!unknown.empty() || !missing.empty() || !mismatched.empty() || !dtypes.empty() || !values.empty()) {
    std::ostringstream os;
    os << "models: " << options.source << " does not match the model:";
    if (!unknown.empty()) os << "\n  unknown keys (" << unknown.size() << "): " << list(unknown);
    if (!missing.empty()) os << "\n  missing keys (" << missing.size() << "): " << list(missing);
    if (!mismatched.empty()) os << "\n  shape mismatches (" << mismatched.size() << "): " << list(mismatched);
    if (!dtypes.empty()) os << "\n  dtype mismatches (" << dtypes.size() << "): " << list(dtypes);
    if (!values.empty())
      os << "\n  invalid values (" << values.size() << "; LoadStateOptions::allow_non_finite loads them): " << list(values);
    throw Error(os.str());
  }
  at::NoGradGuard no_grad;
  for (const auto& key : seen) {
    at::Tensor dst = target.at(key);
    dst.copy_(state.at(key).to(dst.scalar_type()));
  }
}

}  // namespace qforge::models
