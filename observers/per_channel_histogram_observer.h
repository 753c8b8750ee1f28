// PerChannelHistogramObserver: one HistogramObserver-style histogram per channel along ch_axis,
// each updated and searched exactly as the per-tensor histogram observer would on that channel.
#pragma once

#include <vector>

#include "observers/histogram.h"
#include "observers/observer.h"

namespace qforge {

class PerChannelHistogramObserver : public Observer {
 public:
  explicit PerChannelHistogramObserver(const ObserverOptions& options = {});

  // Per-channel specs with axis == ch_axis; returns [C] tensors.
  std::pair<at::Tensor, at::Tensor> range(const QSpec& spec) const override;
  std::string kind() const override { return "per_channel_histogram"; }
  std::unique_ptr<Observer> clone() const override;

  int64_t ch_axis() const { return ch_axis_; }
  const std::vector<Histogram>& histograms() const { return histograms_; }

 protected:
  int64_t observe(const at::Tensor& x) override;
  void merge_from(const Observer& other) override;
  void check_compatible(const Observer& other) const override;
  std::map<std::string, at::Tensor> kind_state() const override;
  void load_kind_state(const std::map<std::string, at::Tensor>& state) override;
  void reset_kind() override { histograms_.clear(); }

 private:
  int64_t ch_axis_;
  int64_t bins_;
  int64_t upsample_rate_;
  HistogramMethod method_;
  double percentile_;
  std::vector<Histogram> histograms_;  // one per channel; empty before the first update
};

}  // namespace qforge
