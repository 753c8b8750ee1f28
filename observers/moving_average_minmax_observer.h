// MovingAverageMinMaxObserver: exponential moving average of each batch's min and max, as
// PyTorch's torch.ao.quantization.MovingAverageMinMaxObserver (the first batch initialises).
#pragma once

#include "observers/minmax_observer.h"

namespace qforge {

class MovingAverageMinMaxObserver : public MinMaxObserver {
 public:
  explicit MovingAverageMinMaxObserver(double averaging_constant = kDefaultAveragingConstant);

  std::string kind() const override { return "moving_average_minmax"; }
  std::unique_ptr<Observer> clone() const override;
  double averaging_constant() const { return averaging_constant_; }

 protected:
  int64_t observe(const at::Tensor& x) override;
  // Count-weighted mean of the two averages: a moving average has no order-free merge.
  void merge_from(const Observer& other) override;
  void check_compatible(const Observer& other) const override;

 private:
  double averaging_constant_;
};

}  // namespace qforge
