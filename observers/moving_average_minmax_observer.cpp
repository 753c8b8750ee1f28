// MovingAverageMinMaxObserver: min += c * (batch_min - min), reproducing PyTorch's forward.
#include "observers/moving_average_minmax_observer.h"

#include <ATen/ATen.h>

#include <cmath>

#include "framework/core/error.h"

namespace qforge {

MovingAverageMinMaxObserver::MovingAverageMinMaxObserver(double averaging_constant)
    : averaging_constant_(averaging_constant) {
  QF_REQUIRE(averaging_constant > 0.0 && averaging_constant <= 1.0,
             "moving_average_minmax observer: averaging_constant must be in (0, 1], got ",
             averaging_constant);
}

std::unique_ptr<Observer> MovingAverageMinMaxObserver::clone() const {
  auto c = std::make_unique<MovingAverageMinMaxObserver>(*this);
  c->min_val_ = min_val_.clone();
  c->max_val_ = max_val_.clone();
  return c;
}

int64_t MovingAverageMinMaxObserver::observe(const at::Tensor& x) {
  const detail::FiniteMinMax cur = detail::finite_aminmax(x);
  // A batch of only NaN/inf carries no range: it leaves the average alone.
  if (!std::isfinite(cur.min.item<float>())) return cur.nonfinite;
  if (min_val_.item<float>() == INFINITY && max_val_.item<float>() == -INFINITY) {
    min_val_ = cur.min;
    max_val_ = cur.max;
  } else {
    // Same float32 tensor ops as PyTorch (scalar rounded to float), so results are bit-identical.
    min_val_ = min_val_ + averaging_constant_ * (cur.min - min_val_);
    max_val_ = max_val_ + averaging_constant_ * (cur.max - max_val_);
  }
  return cur.nonfinite;
}

void MovingAverageMinMaxObserver::check_compatible(const Observer& other) const {
  const auto& o = static_cast<const MovingAverageMinMaxObserver&>(other);
  QF_REQUIRE(o.averaging_constant_ == averaging_constant_,
             "moving_average_minmax observer: cannot merge averaging_constant ",
             o.averaging_constant_, " into ", averaging_constant_);
}

void MovingAverageMinMaxObserver::merge_from(const Observer& other) {
  const auto& o = static_cast<const MovingAverageMinMaxObserver&>(other);
  if (!o.has_data()) return;
  if (!has_data()) {
    min_val_ = o.min_val_.clone();
    max_val_ = o.max_val_.clone();
    return;
  }
  const double w = static_cast<double>(o.count()) / static_cast<double>(count() + o.count());
  min_val_ = min_val_ + w * (o.min_val_ - min_val_);
  max_val_ = max_val_ + w * (o.max_val_ - max_val_);
}

}  // namespace qforge
