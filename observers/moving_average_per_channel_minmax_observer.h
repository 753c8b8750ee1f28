// MovingAveragePerChannelMinMaxObserver: per-channel exponential moving average of min and max,
// as PyTorch's torch.ao.quantization.MovingAveragePerChannelMinMaxObserver.
#pragma once

#include "observers/per_channel_minmax_observer.h"

namespace qforge {

class MovingAveragePerChannelMinMaxObserver : public PerChannelMinMaxObserver {
 public:
  explicit MovingAveragePerChannelMinMaxObserver(
      double averaging_constant = kDefaultAveragingConstant, int64_t ch_axis = 0);

  std::string kind() const override { return "moving_average_per_channel_minmax"; }
  std::unique_ptr<Observer> clone() const override;
  double averaging_constant() const { return averaging_constant_; }

 protected:
  int64_t observe(const at::Tensor& x) override;
  // Count-weighted mean of the two averages, per channel.
  void merge_from(const Observer& other) override;
  void check_compatible(const Observer& other) const override;

 private:
  double averaging_constant_;
};

}  // namespace qforge
