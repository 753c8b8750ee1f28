// HistogramObserver: a 2048-bin running histogram of everything seen (PyTorch's
// HistogramObserver update and re-binning, bit for bit) and a range search run when a range is
// asked for: l2 (PyTorch's non-linear search), entropy (TensorRT KL), percentile or mse.
#pragma once

#include "observers/histogram.h"
#include "observers/observer.h"

namespace qforge {

class HistogramObserver : public Observer {
 public:
  explicit HistogramObserver(const ObserverOptions& options = {});

  // Per-tensor specs only; the search depends on the spec's qtype bits and symmetry.
  std::pair<at::Tensor, at::Tensor> range(const QSpec& spec) const override;
  std::string kind() const override { return "histogram"; }
  std::unique_ptr<Observer> clone() const override;

  const Histogram& histogram() const { return histogram_; }
  HistogramMethod method() const { return method_; }
  double percentile() const { return percentile_; }

 protected:
  int64_t observe(const at::Tensor& x) override;
  void merge_from(const Observer& other) override;
  void check_compatible(const Observer& other) const override;
  std::map<std::string, at::Tensor> kind_state() const override;
  void load_kind_state(const std::map<std::string, at::Tensor>& state) override;
  void reset_kind() override { histogram_.clear(); }

 private:
  HistogramMethod method_;
  double percentile_;
  Histogram histogram_;
};

namespace detail {
// Validates observer options shared by the histogram kinds.
void check_histogram_options(const ObserverOptions& options, const char* who);
}  // namespace detail

}  // namespace qforge
