// MinMaxObserver: running min/max, reproducing torch.ao.quantization.MinMaxObserver.forward.
#include "observers/minmax_observer.h"

#include <ATen/ATen.h>

#include <cmath>

#include "framework/core/error.h"

namespace qforge {

MinMaxObserver::MinMaxObserver() { reset_kind(); }

std::unique_ptr<Observer> MinMaxObserver::clone() const {
  auto c = std::make_unique<MinMaxObserver>(*this);
  c->min_val_ = min_val_.clone();
  c->max_val_ = max_val_.clone();
  return c;
}

int64_t MinMaxObserver::observe(const at::Tensor& x) {
  const detail::FiniteMinMax cur = detail::finite_aminmax(x);
  // torch.min/torch.max of the running and current values: exact, so merge is exact too.
  min_val_ = at::minimum(cur.min, min_val_);
  max_val_ = at::maximum(cur.max, max_val_);
  return cur.nonfinite;
}

std::pair<at::Tensor, at::Tensor> MinMaxObserver::range(const QSpec& spec) const {
  require_granularity(spec, Granularity::kPerTensor);
  require_data();
  return {min_val_.clone(), max_val_.clone()};
}

void MinMaxObserver::merge_from(const Observer& other) {
  const auto& o = static_cast<const MinMaxObserver&>(other);
  min_val_ = at::minimum(min_val_, o.min_val_);
  max_val_ = at::maximum(max_val_, o.max_val_);
}

std::map<std::string, at::Tensor> MinMaxObserver::kind_state() const {
  return {{"min", min_val_.clone()}, {"max", max_val_.clone()}};
}

void MinMaxObserver::load_kind_state(const std::map<std::string, at::Tensor>& state) {
  detail::require_scalar_min_max(state, kind() + " observer: load_state");
  min_val_ = state.at("min").clone();
  max_val_ = state.at("max").clone();
}

void MinMaxObserver::reset_kind() {
  min_val_ = at::scalar_tensor(INFINITY, at::kFloat);
  max_val_ = at::scalar_tensor(-INFINITY, at::kFloat);
}

namespace detail {
void require_scalar_min_max(const std::map<std::string, at::Tensor>& state, const std::string& who) {
  require_tensor(state, "min", at::kFloat, {}, who);
  require_tensor(state, "max", at::kFloat, {}, who);
  const float mn = state.at("min").item<float>(), mx = state.at("max").item<float>();
  const bool empty = mn == INFINITY && mx == -INFINITY;
  QF_REQUIRE(empty || (std::isfinite(mn) && std::isfinite(mx) && mn <= mx), who, ": min ", mn,
             " / max ", mx, " are neither a finite range nor the empty (+inf, -inf) pair");
}
}  // namespace detail

}  // namespace qforge
