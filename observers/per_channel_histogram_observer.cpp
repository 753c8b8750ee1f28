// PerChannelHistogramObserver: per-channel histograms, updated and searched in parallel.
#include "observers/per_channel_histogram_observer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>

#include "framework/core/error.h"
#include "observers/histogram_observer.h"
#include "observers/histogram_search.h"

namespace qforge {

PerChannelHistogramObserver::PerChannelHistogramObserver(const ObserverOptions& options)
    : ch_axis_(options.ch_axis),
      bins_(options.bins),
      upsample_rate_(options.upsample_rate),
      method_(options.method),
      percentile_(options.percentile) {
  detail::check_histogram_options(options, "per_channel_histogram observer");
}

std::unique_ptr<Observer> PerChannelHistogramObserver::clone() const {
  return std::make_unique<PerChannelHistogramObserver>(*this);
}

int64_t PerChannelHistogramObserver::observe(const at::Tensor& x) {
  const int64_t axis = detail::wrap_axis(ch_axis_, x.sizes(), "per_channel_histogram observer");
  const int64_t channels = x.size(axis);
  QF_REQUIRE(histograms_.empty() || static_cast<int64_t>(histograms_.size()) == channels, kind(),
             " observer: input of shape ", x.sizes(), " has ", channels, " channels along ch_axis ",
             ch_axis_, " but earlier inputs had ", histograms_.size());
  const at::Tensor y = x.movedim(axis, 0).reshape({channels, -1}).contiguous();
  if (histograms_.empty()) histograms_.assign(static_cast<size_t>(channels), Histogram(bins_, upsample_rate_));
  const int64_t row = y.size(1);
  const float* data = y.data_ptr<float>();
  std::vector<int64_t> nonfinite(static_cast<size_t>(channels), 0);
  // One channel per task; the binning inside runs serially in a parallel region.
  at::parallel_for(0, channels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) histograms_[c].observe(data + c * row, row, &nonfinite[c]);
  });
  int64_t total = 0;
  for (int64_t v : nonfinite) total += v;
  return total;
}

std::pair<at::Tensor, at::Tensor> PerChannelHistogramObserver::range(const QSpec& spec) const {
  require_granularity(spec, Granularity::kPerChannel);
  QF_REQUIRE(spec.axis == ch_axis_, kind(), " observer collects ch_axis ", ch_axis_, "; asked for ",
             spec.to_string());
  spec.validate();
  require_data();
  const int64_t channels = static_cast<int64_t>(histograms_.size());
  for (int64_t c = 0; c < channels; ++c) {
    QF_REQUIRE(!histograms_[c].empty(), kind(), " observer: channel ", c, " of ", channels,
               " saw no finite values; cannot choose a range");
  }
  at::Tensor lo = at::empty({channels}, at::kFloat), hi = at::empty({channels}, at::kFloat);
  float* lo_p = lo.data_ptr<float>();
  float* hi_p = hi.data_ptr<float>();
  at::parallel_for(0, channels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      std::tie(lo_p[c], hi_p[c]) = histogram_range(histograms_[c], spec, method_, percentile_);
    }
  });
  return {lo, hi};
}

void PerChannelHistogramObserver::check_compatible(const Observer& other) const {
  const auto& o = static_cast<const PerChannelHistogramObserver&>(other);
  QF_REQUIRE(o.ch_axis_ == ch_axis_ && o.bins_ == bins_ && o.upsample_rate_ == upsample_rate_, kind(),
             " observer: cannot merge (ch_axis ", o.ch_axis_, ", bins ", o.bins_, ", upsample_rate ",
             o.upsample_rate_, ") into (ch_axis ", ch_axis_, ", bins ", bins_, ", upsample_rate ",
             upsample_rate_, ")");
  QF_REQUIRE(histograms_.empty() || o.histograms_.empty() || histograms_.size() == o.histograms_.size(),
             kind(), " observer: cannot merge ", o.histograms_.size(), " channels into ",
             histograms_.size());
}

void PerChannelHistogramObserver::merge_from(const Observer& other) {
  const auto& o = static_cast<const PerChannelHistogramObserver&>(other);
  if (o.histograms_.empty()) return;
  if (histograms_.empty()) {
    histograms_ = o.histograms_;
    return;
  }
  at::parallel_for(0, static_cast<int64_t>(histograms_.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) histograms_[c].merge(o.histograms_[c]);
  });
}

std::map<std::string, at::Tensor> PerChannelHistogramObserver::kind_state() const {
  const int64_t channels = static_cast<int64_t>(histograms_.size());
  at::Tensor mn = at::empty({channels}, at::kFloat), mx = at::empty({channels}, at::kFloat);
  at::Tensor counts = at::empty({channels, bins_}, at::kFloat);
  for (int64_t c = 0; c < channels; ++c) {
    mn.data_ptr<float>()[c] = histograms_[c].min();
    mx.data_ptr<float>()[c] = histograms_[c].max();
    std::copy(histograms_[c].counts().begin(), histograms_[c].counts().end(),
              counts.data_ptr<float>() + c * bins_);
  }
  return {{"min", mn}, {"max", mx}, {"histogram", counts}};
}

void PerChannelHistogramObserver::load_kind_state(const std::map<std::string, at::Tensor>& state) {
  const std::string who = kind() + " observer: load_state";
  const at::Tensor& mn_in = state.at("min");
  QF_REQUIRE(mn_in.defined() && mn_in.dim() == 1, who, ": tensor 'min' must be 1-d [C]");
  const int64_t channels = mn_in.size(0);
  detail::require_tensor(state, "min", at::kFloat, {channels}, who);
  detail::require_tensor(state, "max", at::kFloat, {channels}, who);
  detail::require_tensor(state, "histogram", at::kFloat, {channels, bins_}, who);
  const at::Tensor mn = mn_in.contiguous(), mx = state.at("max").contiguous();
  const at::Tensor counts = state.at("histogram").contiguous();
  std::vector<Histogram> loaded(static_cast<size_t>(channels), Histogram(bins_, upsample_rate_));
  for (int64_t c = 0; c < channels; ++c) {
    const float* p = counts.data_ptr<float>() + c * bins_;
    loaded[c].assign(mn.data_ptr<float>()[c], mx.data_ptr<float>()[c], std::vector<float>(p, p + bins_));
  }
  histograms_ = std::move(loaded);
}

}  // namespace qforge
