// MovingAveragePerChannelMinMaxObserver: per-channel min += c * (batch_min - min), reproducing
// PyTorch's forward; channels without finite values in a batch keep their average.
#include "observers/moving_average_per_channel_minmax_observer.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"

namespace qforge {

MovingAveragePerChannelMinMaxObserver::MovingAveragePerChannelMinMaxObserver(
    double averaging_constant, int64_t ch_axis)
    : PerChannelMinMaxObserver(ch_axis, 0), averaging_constant_(averaging_constant) {
  QF_REQUIRE(averaging_constant > 0.0 && averaging_constant <= 1.0,
             "moving_average_per_channel_minmax observer: averaging_constant must be in (0, 1], got ",
             averaging_constant);
}

std::unique_ptr<Observer> MovingAveragePerChannelMinMaxObserver::clone() const {
  auto c = std::make_unique<MovingAveragePerChannelMinMaxObserver>(*this);
  c->min_val_ = min_val_.clone();
  c->max_val_ = max_val_.clone();
  return c;
}

int64_t MovingAveragePerChannelMinMaxObserver::observe(const at::Tensor& x) {
  detail::FiniteMinMax cur = current_min_max(x);
  if (min_val_.numel() == 0) {
    min_val_ = cur.min;
    max_val_ = cur.max;
    return cur.nonfinite;
  }
  // Same float32 tensor ops as PyTorch, so results are bit-identical on finite data.
  at::Tensor new_min = min_val_ + averaging_constant_ * (cur.min - min_val_);
  at::Tensor new_max = max_val_ + averaging_constant_ * (cur.max - max_val_);
  if (cur.nonfinite > 0 || !at::isfinite(min_val_).all().item<bool>()) {
    // Channels unseen so far take the batch value; channels without finite values keep theirs.
    const at::Tensor seen_before = at::isfinite(min_val_), seen_now = at::isfinite(cur.min);
    new_min = at::where(seen_now, at::where(seen_before, new_min, cur.min), min_val_);
    new_max = at::where(seen_now, at::where(seen_before, new_max, cur.max), max_val_);
  }
  min_val_ = new_min;
  max_val_ = new_max;
  return cur.nonfinite;
}

void MovingAveragePerChannelMinMaxObserver::check_compatible(const Observer& other) const {
  PerChannelMinMaxObserver::check_compatible(other);
  const auto& o = static_cast<const MovingAveragePerChannelMinMaxObserver&>(other);
  QF_REQUIRE(o.averaging_constant_ == averaging_constant_, kind(),
             " observer: cannot merge averaging_constant ", o.averaging_constant_, " into ",
             averaging_constant_);
}

void MovingAveragePerChannelMinMaxObserver::merge_from(const Observer& other) {
  const auto& o = static_cast<const MovingAveragePerChannelMinMaxObserver&>(other);
  if (o.min_val_.numel() == 0) return;
  if (min_val_.numel() == 0) {
    min_val_ = o.min_val_.clone();
    max_val_ = o.max_val_.clone();
    return;
  }
  const double w = static_cast<double>(o.count()) / static_cast<double>(count() + o.count());
  const at::Tensor a = at::isfinite(min_val_), b = at::isfinite(o.min_val_);
  const at::Tensor both = at::logical_and(a, b);
  at::Tensor mn = at::where(both, min_val_ + w * (o.min_val_ - min_val_), at::where(a, min_val_, o.min_val_));
  at::Tensor mx = at::where(both, max_val_ + w * (o.max_val_ - max_val_), at::where(a, max_val_, o.max_val_));
  min_val_ = mn;
  max_val_ = mx;
}

}  // namespace qforge
