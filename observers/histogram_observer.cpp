// HistogramObserver: running histogram + range search; see histogram_observer.h.
#include "observers/histogram_observer.h"

#include <ATen/ATen.h>

#include <cmath>

#include "framework/core/error.h"
#include "observers/histogram_search.h"
#include "observers/minmax_observer.h"

namespace qforge {

namespace detail {
void check_histogram_options(const ObserverOptions& options, const char* who) {
  QF_REQUIRE(options.bins >= 2, who, ": bins must be >= 2, got ", options.bins);
  QF_REQUIRE(options.upsample_rate >= 1, who, ": upsample_rate must be >= 1, got ", options.upsample_rate);
  QF_REQUIRE(options.percentile > 0.0 && options.percentile <= 100.0, who,
             ": percentile must be in (0, 100], got ", options.percentile);
}
}  // namespace detail

HistogramObserver::HistogramObserver(const ObserverOptions& options)
    : method_(options.method),
      percentile_(options.percentile),
      histogram_((detail::check_histogram_options(options, "histogram observer"), options.bins),
                 options.upsample_rate) {}

std::unique_ptr<Observer> HistogramObserver::clone() const {
  return std::make_unique<HistogramObserver>(*this);
}

int64_t HistogramObserver::observe(const at::Tensor& x) {
  int64_t nonfinite = 0;
  histogram_.observe(x.data_ptr<float>(), x.numel(), &nonfinite);
  return nonfinite;
}

std::pair<at::Tensor, at::Tensor> HistogramObserver::range(const QSpec& spec) const {
  require_granularity(spec, Granularity::kPerTensor);
  spec.validate();
  require_data();
  const auto [lo, hi] = histogram_range(histogram_, spec, method_, percentile_);
  return {at::scalar_tensor(lo, at::kFloat), at::scalar_tensor(hi, at::kFloat)};
}

void HistogramObserver::check_compatible(const Observer& other) const {
  const auto& o = static_cast<const HistogramObserver&>(other);
  QF_REQUIRE(o.histogram_.bins() == histogram_.bins() &&
                 o.histogram_.upsample_rate() == histogram_.upsample_rate(),
             "histogram observer: cannot merge bins ", o.histogram_.bins(), " / upsample_rate ",
             o.histogram_.upsample_rate(), " into bins ", histogram_.bins(), " / upsample_rate ",
             histogram_.upsample_rate());
}

void HistogramObserver::merge_from(const Observer& other) {
  histogram_.merge(static_cast<const HistogramObserver&>(other).histogram_);
}

std::map<std::string, at::Tensor> HistogramObserver::kind_state() const {
  at::Tensor counts = at::empty({histogram_.bins()}, at::kFloat);
  std::copy(histogram_.counts().begin(), histogram_.counts().end(), counts.data_ptr<float>());
  return {{"min", at::scalar_tensor(histogram_.min(), at::kFloat)},
          {"max", at::scalar_tensor(histogram_.max(), at::kFloat)},
          {"histogram", counts}};
}

void HistogramObserver::load_kind_state(const std::map<std::string, at::Tensor>& state) {
  const std::string who = kind() + " observer: load_state";
  detail::require_scalar_min_max(state, who);
  detail::require_tensor(state, "histogram", at::kFloat, {histogram_.bins()}, who);
  const at::Tensor c = state.at("histogram").contiguous();
  Histogram h(histogram_.bins(), histogram_.upsample_rate());
  h.assign(state.at("min").item<float>(), state.at("max").item<float>(),
           std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel()));
  histogram_ = std::move(h);
}

}  // namespace qforge
