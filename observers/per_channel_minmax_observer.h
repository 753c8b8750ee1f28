// PerChannelMinMaxObserver: running min/max per channel along ch_axis, as PyTorch's
// torch.ao.quantization.PerChannelMinMaxObserver. With group_size > 0 it is the per-group
// observer instead: min/max of each group of group_size consecutive elements along the last
// dimension, giving the input's shape with the last dimension divided by group_size.
#pragma once

#include "observers/observer.h"

namespace qforge {

class PerChannelMinMaxObserver : public Observer {
 public:
  explicit PerChannelMinMaxObserver(int64_t ch_axis = 0, int64_t group_size = 0);

  std::pair<at::Tensor, at::Tensor> range(const QSpec& spec) const override;
  std::string kind() const override { return "per_channel_minmax"; }
  std::unique_ptr<Observer> clone() const override;

  int64_t ch_axis() const { return ch_axis_; }
  int64_t group_size() const { return group_size_; }
  // Per-channel [C] (per-group: input shape with last dim / group_size); empty before data.
  const at::Tensor& min_val() const { return min_val_; }
  const at::Tensor& max_val() const { return max_val_; }

 protected:
  int64_t observe(const at::Tensor& x) override;
  void merge_from(const Observer& other) override;
  void check_compatible(const Observer& other) const override;
  std::map<std::string, at::Tensor> kind_state() const override;
  void load_kind_state(const std::map<std::string, at::Tensor>& state) override;
  void reset_kind() override;

  // Finite min/max of the current input per channel (or group), in the state's shape; checks
  // that the shape agrees with what was seen before.
  detail::FiniteMinMax current_min_max(const at::Tensor& x) const;

  int64_t ch_axis_;
  int64_t group_size_;
  at::Tensor min_val_;
  at::Tensor max_val_;
};

}  // namespace qforge
