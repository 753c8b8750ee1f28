// PerChannelMinMaxObserver: per-channel / per-group running min/max, reproducing PyTorch's
// PerChannelMinMaxObserver._forward (permute ch_axis to the front, flatten, aminmax(dim=1)).
#include "observers/per_channel_minmax_observer.h"

#include <ATen/ATen.h>

#include <cmath>

#include "framework/core/error.h"

namespace qforge {

PerChannelMinMaxObserver::PerChannelMinMaxObserver(int64_t ch_axis, int64_t group_size)
    : ch_axis_(ch_axis), group_size_(group_size) {
  QF_REQUIRE(group_size >= 0, "per_channel_minmax observer: group_size must be >= 0, got ",
             group_size);
  reset_kind();
}

std::unique_ptr<Observer> PerChannelMinMaxObserver::clone() const {
  auto c = std::make_unique<PerChannelMinMaxObserver>(*this);
  c->min_val_ = min_val_.clone();
  c->max_val_ = max_val_.clone();
  return c;
}

detail::FiniteMinMax PerChannelMinMaxObserver::current_min_max(const at::Tensor& x) const {
  detail::FiniteMinMax cur;
  std::vector<int64_t> out_shape;
  if (group_size_ > 0) {
    QF_REQUIRE(x.dim() >= 1 && x.size(-1) % group_size_ == 0, kind(),
               " observer: last dimension of input shape ", x.sizes(),
               " is not a multiple of group_size ", group_size_);
    out_shape = x.sizes().vec();
    out_shape.back() /= group_size_;
    cur = detail::finite_aminmax_rows(x.reshape({-1, group_size_}));
  } else {
    const int64_t axis = detail::wrap_axis(ch_axis_, x.sizes(), "per_channel_minmax observer");
    const int64_t channels = x.size(axis);
    out_shape = {channels};
    // Channels first, everything else flattened, as PyTorch's permute + flatten(start_dim=1).
    cur = detail::finite_aminmax_rows(x.movedim(axis, 0).reshape({channels, -1}));
  }
  cur.min = cur.min.reshape(out_shape);
  cur.max = cur.max.reshape(out_shape);
  if (min_val_.numel() > 0) {
    QF_REQUIRE(min_val_.sizes() == cur.min.sizes(), kind(), " observer: input of shape ", x.sizes(),
               group_size_ > 0 ? detail::str_cat(" gives groups of shape ", cur.min.sizes())
                               : detail::str_cat(" has ", cur.min.size(0), " channels along ch_axis ",
                                                 ch_axis_),
               " but earlier inputs gave ", min_val_.sizes());
  }
  return cur;
}

int64_t PerChannelMinMaxObserver::observe(const at::Tensor& x) {
  detail::FiniteMinMax cur = current_min_max(x);
  if (min_val_.numel() == 0) {
    min_val_ = cur.min;
    max_val_ = cur.max;
  } else {
    min_val_ = at::minimum(cur.min, min_val_);
    max_val_ = at::maximum(cur.max, max_val_);
  }
  return cur.nonfinite;
}

std::pair<at::Tensor, at::Tensor> PerChannelMinMaxObserver::range(const QSpec& spec) const {
  if (group_size_ > 0) {
    require_granularity(spec, Granularity::kPerGroup);
    QF_REQUIRE(spec.group_size == group_size_, kind(), " observer collects groups of ", group_size_,
               "; asked for ", spec.to_string());
  } else {
    require_granularity(spec, Granularity::kPerChannel);
    QF_REQUIRE(spec.axis == ch_axis_, kind(), " observer collects ch_axis ", ch_axis_,
               "; asked for ", spec.to_string());
  }
  require_data();
  const at::Tensor unseen = at::logical_not(at::isfinite(min_val_)).flatten();
  if (unseen.any().item<bool>()) {
    throw Error(detail::str_cat(kind(), " observer: ", unseen.sum().item<int64_t>(), " of ",
                                unseen.numel(), " channels/groups saw no finite values (first: index ",
                                unseen.nonzero()[0][0].item<int64_t>(), "); cannot choose a range"));
  }
  return {min_val_.clone(), max_val_.clone()};
}

void PerChannelMinMaxObserver::check_compatible(const Observer& other) const {
  const auto& o = static_cast<const PerChannelMinMaxObserver&>(other);
  QF_REQUIRE(o.ch_axis_ == ch_axis_ && o.group_size_ == group_size_, kind(),
             " observer: cannot merge (ch_axis ", o.ch_axis_, ", group_size ", o.group_size_,
             ") into (ch_axis ", ch_axis_, ", group_size ", group_size_, ")");
  QF_REQUIRE(min_val_.numel() == 0 || o.min_val_.numel() == 0 ||
                 min_val_.sizes() == o.min_val_.sizes(),
             kind(), " observer: cannot merge statistics of shape ", o.min_val_.sizes(), " into ",
             min_val_.sizes());
}

void PerChannelMinMaxObserver::merge_from(const Observer& other) {
  const auto& o = static_cast<const PerChannelMinMaxObserver&>(other);
  if (o.min_val_.numel() == 0) return;
  if (min_val_.numel() == 0) {
    min_val_ = o.min_val_.clone();
    max_val_ = o.max_val_.clone();
    return;
  }
  min_val_ = at::minimum(min_val_, o.min_val_);
  max_val_ = at::maximum(max_val_, o.max_val_);
}

std::map<std::string, at::Tensor> PerChannelMinMaxObserver::kind_state() const {
  return {{"min", min_val_.clone()}, {"max", max_val_.clone()}};
}

void PerChannelMinMaxObserver::load_kind_state(const std::map<std::string, at::Tensor>& state) {
  const std::string who = kind() + " observer: load_state";
  const at::Tensor& mn = state.at("min");
  QF_REQUIRE(mn.defined() && mn.dim() >= 1, who, ": tensor 'min' must have at least 1 dimension");
  if (group_size_ == 0) {
    QF_REQUIRE(mn.dim() == 1, who, ": per-channel tensor 'min' must be 1-d [C], got shape ",
               mn.sizes());
  }
  detail::require_tensor(state, "min", at::kFloat, mn.sizes(), who);
  detail::require_tensor(state, "max", at::kFloat, mn.sizes(), who);
  const at::Tensor& mx = state.at("max");
  const at::Tensor both_finite = at::logical_and(at::isfinite(mn), at::isfinite(mx));
  const at::Tensor unseen = at::logical_and(at::eq(mn, INFINITY), at::eq(mx, -INFINITY));
  QF_REQUIRE(at::logical_or(at::logical_and(both_finite, at::le(mn, mx)), unseen).all().item<bool>(),
             who, ": every channel needs min <= max (finite) or the unseen pair (+inf, -inf)");
  min_val_ = mn.clone();
  max_val_ = mx.clone();
}

void PerChannelMinMaxObserver::reset_kind() {
  min_val_ = at::empty({0}, at::kFloat);
  max_val_ = at::empty({0}, at::kFloat);
}

}  // namespace qforge
