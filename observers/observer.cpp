// Observer base: input validation, NaN/inf accounting, counts, state plumbing and the factory.
#include "observers/observer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "framework/core/enum_names.h"
#include "framework/core/error.h"
#include "observers/histogram_observer.h"
#include "observers/minmax_observer.h"
#include "observers/moving_average_minmax_observer.h"
#include "observers/moving_average_per_channel_minmax_observer.h"
#include "observers/per_channel_histogram_observer.h"
#include "observers/per_channel_minmax_observer.h"

namespace qforge {

namespace {
constexpr NamedValue<HistogramMethod> kHistogramMethodNames[] = {
    {HistogramMethod::kL2, "l2"},
    {HistogramMethod::kEntropy, "entropy"},
    {HistogramMethod::kPercentile, "percentile"},
    {HistogramMethod::kMse, "mse"},
    {HistogramMethod::kEntropy, "kl", true}};
}  // namespace

const char* to_string(HistogramMethod m) { return name_of(kHistogramMethodNames, m); }
HistogramMethod histogram_method_from_name(const std::string& name) {
  return value_of(kHistogramMethodNames, name, "histogram method", "observers: ");
}
std::vector<std::string> histogram_method_names() { return names_of(kHistogramMethodNames); }

void Observer::update(const at::Tensor& x) {
  QF_REQUIRE(x.defined(), kind(), " observer: update() got an undefined tensor");
  QF_REQUIRE(at::isFloatingType(x.scalar_type()), kind(),
             " observer: update() needs a floating-point tensor, got dtype ", x.scalar_type(),
             " with shape ", x.sizes());
  if (x.numel() == 0) return;
  // Statistics are float32 on the CPU, as PyTorch observers' buffers; detach so no autograd
  // tape is kept.
  const at::Tensor xf = x.detach().to(at::kCPU, at::kFloat).contiguous();
  const int64_t nonfinite = observe(xf);
  QF_CHECK(nonfinite >= 0 && nonfinite <= xf.numel());
  nonfinite_count_ += nonfinite;
  count_ += xf.numel() - nonfinite;
}

QParams Observer::qparams(const QSpec& spec) const {
  const auto [min_val, max_val] = range(spec);
  return calculate_qparams(min_val, max_val, spec);
}

void Observer::merge(const Observer& other) {
  QF_REQUIRE(other.kind() == kind(), "observers: cannot merge a ", other.kind(), " observer into a ",
             kind(), " observer");
  if (&other == this) {
    // Merging with itself means seeing the same data twice; do it on a copy.
    const std::unique_ptr<Observer> copy = clone();
    merge(*copy);
    return;
  }
  check_compatible(other);
  int64_t count = 0, nonfinite = 0;
  QF_REQUIRE(!__builtin_add_overflow(count_, other.count_, &count) &&
                 !__builtin_add_overflow(nonfinite_count_, other.nonfinite_count_, &nonfinite),
             "observers: merged counts overflow int64 (", count_, " + ", other.count_, ", nonfinite ",
             nonfinite_count_, " + ", other.nonfinite_count_, ")");
  merge_from(other);
  count_ = count;
  nonfinite_count_ = nonfinite;
}

std::map<std::string, at::Tensor> Observer::state() const {
  std::map<std::string, at::Tensor> s = kind_state();
  s["count"] = at::scalar_tensor(count_, at::kLong);
  s["nonfinite_count"] = at::scalar_tensor(nonfinite_count_, at::kLong);
  return s;
}

void Observer::load_state(const std::map<std::string, at::Tensor>& state) {
  std::map<std::string, at::Tensor> expected = kind_state();
  expected["count"] = at::Tensor();
  expected["nonfinite_count"] = at::Tensor();
  for (const auto& [name, t] : expected) {
    QF_REQUIRE(state.count(name), kind(), " observer: load_state is missing tensor '", name,
               "' (expects ", expected.size(), " tensors)");
  }
  for (const auto& [name, t] : state) {
    if (expected.count(name)) continue;
    std::string names;
    for (const auto& [n, u] : expected) names += (names.empty() ? "" : ", ") + n;
    throw Error(detail::str_cat(kind(), " observer: load_state got unexpected tensor '", name,
                                "'; expected exactly: ", names));
  }
  const std::string who = kind() + " observer: load_state";
  detail::require_tensor(state, "count", at::kLong, {}, who);
  detail::require_tensor(state, "nonfinite_count", at::kLong, {}, who);
  const int64_t count = state.at("count").item<int64_t>();
  const int64_t nonfinite = state.at("nonfinite_count").item<int64_t>();
  QF_REQUIRE(count >= 0 && nonfinite >= 0, who, ": negative count (count ", count,
             ", nonfinite_count ", nonfinite, ")");
  std::map<std::string, at::Tensor> kind_part = state;
  kind_part.erase("count");
  kind_part.erase("nonfinite_count");
  load_kind_state(kind_part);  // throws before changing anything
  count_ = count;
  nonfinite_count_ = nonfinite;
}

void Observer::reset() {
  reset_kind();
  count_ = 0;
  nonfinite_count_ = 0;
}

void Observer::require_data() const {
  QF_REQUIRE(has_data(), kind(), " observer has seen no finite values (",
             nonfinite_count_ == 0
                 ? std::string("no update() with data yet")
                 : detail::str_cat("only ", nonfinite_count_, " NaN/inf values"),
             "); cannot choose a range");
}

void Observer::require_granularity(const QSpec& spec, Granularity expected) const {
  QF_REQUIRE(spec.granularity == expected, kind(), " observer gives ", qforge::to_string(expected),
             " ranges; asked for ", spec.to_string());
}

namespace {
struct KindEntry {
  const char* name;
  const char* pytorch_name;
};
constexpr KindEntry kKinds[] = {
    {"minmax", "MinMaxObserver"},
    {"moving_average_minmax", "MovingAverageMinMaxObserver"},
    {"per_channel_minmax", "PerChannelMinMaxObserver"},
    {"moving_average_per_channel_minmax", "MovingAveragePerChannelMinMaxObserver"},
    {"histogram", "HistogramObserver"},
    {"per_channel_histogram", "PerChannelHistogramObserver"},
};
}  // namespace

const std::vector<std::string>& observer_kinds() {
  static const std::vector<std::string> kinds = [] {
    std::vector<std::string> v;
    for (const KindEntry& k : kKinds) v.emplace_back(k.name);
    return v;
  }();
  return kinds;
}

std::string per_channel_observer_kind(const std::string& kind_in) {
  std::string kind = kind_in;
  for (const KindEntry& k : kKinds)
    if (kind_in == k.pytorch_name) kind = k.name;
  if (kind == "minmax") return "per_channel_minmax";
  if (kind == "moving_average_minmax") return "moving_average_per_channel_minmax";
  if (kind == "histogram") return "per_channel_histogram";
  for (const KindEntry& k : kKinds)
    if (kind == k.name) return kind;  // already per channel
  (void)make_observer(kind_in);  // throws naming the closest valid kind
  return kind;
}

ObserverOptionUse observer_option_use(const std::string& kind, const ObserverOptions& options) {
  ObserverOptionUse u;
  u.averaging_constant = kind.find("moving_average") != std::string::npos;
  u.channel = kind.find("per_channel") != std::string::npos;
  u.histogram = kind.find("histogram") != std::string::npos;
  u.percentile = u.histogram && options.method == HistogramMethod::kPercentile;
  return u;
}

std::unique_ptr<Observer> make_observer(const std::string& kind_in, const ObserverOptions& options) {
  std::string kind = kind_in;
  for (const KindEntry& k : kKinds) {
    if (kind_in == k.pytorch_name) kind = k.name;
  }
  if (kind == "minmax") return std::make_unique<MinMaxObserver>();
  if (kind == "moving_average_minmax")
    return std::make_unique<MovingAverageMinMaxObserver>(options.averaging_constant);
  if (kind == "per_channel_minmax")
    return std::make_unique<PerChannelMinMaxObserver>(options.ch_axis, options.group_size);
  if (kind == "moving_average_per_channel_minmax")
    return std::make_unique<MovingAveragePerChannelMinMaxObserver>(options.averaging_constant,
                                                                    options.ch_axis);
  if (kind == "histogram") return std::make_unique<HistogramObserver>(options);
  if (kind == "per_channel_histogram") return std::make_unique<PerChannelHistogramObserver>(options);
  const std::string hint = closest_match(
      kind, {"minmax", "moving_average_minmax", "per_channel_minmax",
             "moving_average_per_channel_minmax", "histogram", "per_channel_histogram"});
  std::string valid;
  for (const std::string& k : observer_kinds()) valid += (valid.empty() ? "" : ", ") + k;
  throw Error(detail::str_cat("observers: unknown observer kind '", kind_in, "'",
                              hint.empty() ? std::string() : " (did you mean '" + hint + "'?)",
                              "; valid kinds: ", valid));
}

namespace detail {

FiniteMinMax finite_aminmax(const at::Tensor& x) {
  FiniteMinMax r;
  auto mm = at::aminmax(x);
  r.min = std::get<0>(mm);
  r.max = std::get<1>(mm);
  // aminmax propagates NaN and returns inf when one is present, so finite extremes mean all finite.
  if (std::isfinite(r.min.item<float>()) && std::isfinite(r.max.item<float>())) return r;
  const at::Tensor finite = at::isfinite(x);
  r.nonfinite = x.numel() - finite.sum().item<int64_t>();
  r.min = at::where(finite, x, at::scalar_tensor(INFINITY, x.options())).min();
  r.max = at::where(finite, x, at::scalar_tensor(-INFINITY, x.options())).max();
  return r;
}

FiniteMinMax finite_aminmax_rows(const at::Tensor& y) {
  QF_CHECK(y.dim() == 2);
  FiniteMinMax r;
  auto mm = at::aminmax(y, 1);
  r.min = std::get<0>(mm);
  r.max = std::get<1>(mm);
  if (at::isfinite(r.min).all().item<bool>() && at::isfinite(r.max).all().item<bool>()) return r;
  const at::Tensor finite = at::isfinite(y);
  r.nonfinite = y.numel() - finite.sum().item<int64_t>();
  r.min = std::get<0>(at::where(finite, y, at::scalar_tensor(INFINITY, y.options())).min(1));
  r.max = std::get<0>(at::where(finite, y, at::scalar_tensor(-INFINITY, y.options())).max(1));
  return r;
}

int64_t wrap_axis(int64_t axis, at::IntArrayRef sizes, const char* who) {
  const int64_t dim = static_cast<int64_t>(sizes.size());
  QF_REQUIRE(dim > 0, who, ": ch_axis ", axis, " needs a tensor with at least 1 dimension, got shape ",
             sizes);
  QF_REQUIRE(axis >= -dim && axis < dim, who, ": ch_axis ", axis,
             " is out of range for input of shape ", sizes, " (", dim, " dimensions)");
  return axis < 0 ? axis + dim : axis;
}

void require_tensor(const std::map<std::string, at::Tensor>& state, const std::string& name,
                    at::ScalarType dtype, at::IntArrayRef sizes, const std::string& who) {
  const auto it = state.find(name);
  QF_REQUIRE(it != state.end(), who, ": missing tensor '", name, "'");
  const at::Tensor& t = it->second;
  QF_REQUIRE(t.defined(), who, ": tensor '", name, "' is undefined");
  QF_REQUIRE(t.scalar_type() == dtype, who, ": tensor '", name, "' has dtype ", t.scalar_type(),
             ", expected ", dtype);
  QF_REQUIRE(t.sizes() == sizes, who, ": tensor '", name, "' has shape ", t.sizes(), ", expected ",
             sizes);
}

}  // namespace detail

}  // namespace qforge
