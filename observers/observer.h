// Observer: the common base of every statistics collector used during calibration. An observer
// sees float tensors (update), remembers a small state (min/max or a histogram), chooses a range
// for a quantization grid (range) and turns it into QParams (qparams). Observers over parts of the
// data merge into the observer over all of it; their state is a map of plain named tensors so the
// HDF5 dumps in framework/ can write it without knowing the kind. Formulas: docs/observers.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "framework/core/qparams.h"

namespace qforge {

// Bins of every histogram observer, as PyTorch's HistogramObserver default.
inline constexpr int64_t kHistogramBins = 2048;
// Upsampling factor used when a histogram is re-binned onto a wider range (PyTorch's default).
inline constexpr int64_t kHistogramUpsampleRate = 128;
inline constexpr int64_t kMaxHistogramBins = int64_t{1} << 20;
inline constexpr int64_t kMaxHistogramUpsampleRate = int64_t{1} << 16;
// MovingAverage*MinMaxObserver's default averaging_constant, as in PyTorch.
inline constexpr double kDefaultAveragingConstant = 0.01;
// Default percentile of the `percentile` histogram method.
inline constexpr double kDefaultPercentile = 99.99;

// How a histogram observer picks its range from the histogram.
enum class HistogramMethod : uint8_t {
  kL2,          // PyTorch HistogramObserver._non_linear_param_search (approximate L2 minimisation)
  kEntropy,     // TensorRT KL-divergence calibration on the |x| histogram
  kPercentile,  // clip at a percentile (of |x| when symmetric, of each tail when affine)
  kMse,         // clip range minimising the expected quantization MSE estimated from the histogram
};

const char* to_string(HistogramMethod m);
std::vector<std::string> histogram_method_names();  // "l2", "entropy", "percentile", "mse"
// "l2", "entropy", "percentile", "mse"; throws qforge::Error with a closest-match hint otherwise.
HistogramMethod histogram_method_from_name(const std::string& name);

// Options of every observer kind; each kind reads the fields that concern it.
struct ObserverOptions {
  double averaging_constant = kDefaultAveragingConstant;  // moving-average kinds
  int64_t ch_axis = 0;                                    // per-channel kinds
  int64_t group_size = 0;  // per_channel_minmax: > 0 means per-group along the last dimension
  HistogramMethod method = HistogramMethod::kL2;          // histogram kinds
  double percentile = kDefaultPercentile;                 // method kPercentile, in (0, 100]
  int64_t bins = kHistogramBins;                          // histogram kinds
  int64_t upsample_rate = kHistogramUpsampleRate;         // histogram kinds
};

// Which ObserverOptions fields an observer kind reads (files write and compare only those).
struct ObserverOptionUse {
  bool averaging_constant = false;  // moving-average kinds
  bool channel = false;             // per-channel kinds: ch_axis, group_size
  bool histogram = false;           // histogram kinds: method, bins, upsample_rate
  bool percentile = false;          // histogram kinds with method percentile
};
ObserverOptionUse observer_option_use(const std::string& kind, const ObserverOptions& options);

class Observer {
 public:
  virtual ~Observer() = default;

  // Records statistics of `x` (any floating dtype, any shape). NaN and +-inf are left out of the
  // statistics and counted in nonfinite_count(). Empty tensors are no-ops. Throws qforge::Error
  // for non-floating dtypes or shapes the observer cannot handle (bad ch_axis, group_size).
  void update(const at::Tensor& x);

  // The [min, max] this observer chooses for `spec`'s grid (float32 tensors of the QParams shape).
  // Histogram methods run their range search here. Throws when nothing finite was seen or the
  // spec's granularity does not match the observer.
  virtual std::pair<at::Tensor, at::Tensor> range(const QSpec& spec) const = 0;

  // calculate_qparams(range(spec), spec).
  QParams qparams(const QSpec& spec) const;

  // Folds `other` (same kind and options) into this observer, as if this observer had also seen
  // other's data. Exact for min/max kinds; see docs/observers.md for histograms.
  void merge(const Observer& other);

  // Plain named tensors: "min", "max", "count", "nonfinite_count" and, for histogram kinds,
  // "histogram". load_state validates names, dtypes and shapes and throws qforge::Error on any
  // mismatch, leaving the observer unchanged.
  std::map<std::string, at::Tensor> state() const;
  void load_state(const std::map<std::string, at::Tensor>& state);

  virtual std::string kind() const = 0;
  virtual std::unique_ptr<Observer> clone() const = 0;
  void reset();

  // Number of NaN / +-inf values seen (and excluded).
  int64_t nonfinite_count() const { return nonfinite_count_; }
  // Number of finite values seen.
  int64_t count() const { return count_; }
  // True once at least one finite value was seen.
  bool has_data() const { return count_ > 0; }

 protected:
  // Records a float32 contiguous, non-empty tensor; returns how many values were not finite.
  virtual int64_t observe(const at::Tensor& x) = 0;
  // Merge of the kind-specific statistics; `other` has the same dynamic type and passed
  // check_compatible. Counts are merged by the base.
  virtual void merge_from(const Observer& other) = 0;
  // Throws qforge::Error when `other` was configured differently (axis, bins, ...).
  virtual void check_compatible(const Observer& other) const {}
  // Kind-specific state tensors (without the counts).
  virtual std::map<std::string, at::Tensor> kind_state() const = 0;
  // Validates `state` (already checked to hold exactly the names of kind_state()) and applies it;
  // must throw before changing anything.
  virtual void load_kind_state(const std::map<std::string, at::Tensor>& state) = 0;
  virtual void reset_kind() = 0;

  // Throws the "saw nothing" error naming this kind.
  void require_data() const;
  // Throws unless spec.granularity is `expected`.
  void require_granularity(const QSpec& spec, Granularity expected) const;

 private:
  int64_t count_ = 0;
  int64_t nonfinite_count_ = 0;
};

// Kind names make_observer accepts.
const std::vector<std::string>& observer_kinds();

// The per-channel twin of a kind ("minmax" → "per_channel_minmax", "moving_average_minmax" →
// "moving_average_per_channel_minmax", "histogram" → "per_channel_histogram"; PyTorch class names
// accepted; a per-channel kind is its own twin). Unknown kinds throw as make_observer does.
std::string per_channel_observer_kind(const std::string& kind);

// Creates an observer by kind name: "minmax", "moving_average_minmax", "per_channel_minmax",
// "moving_average_per_channel_minmax", "histogram", "per_channel_histogram". PyTorch class names
// ("MinMaxObserver", "HistogramObserver", ...) are accepted too. Unknown names throw
// qforge::Error naming the closest valid kind.
std::unique_ptr<Observer> make_observer(const std::string& kind, const ObserverOptions& options = {});

namespace detail {
// Min and max of the finite values of a float32 tensor (0-dim tensors, +inf/-inf when none) and
// the number of non-finite values.
struct FiniteMinMax {
  at::Tensor min, max;
  int64_t nonfinite = 0;
};
FiniteMinMax finite_aminmax(const at::Tensor& x);
// Same along dim 1 of a 2-d float32 tensor: shapes [rows].
FiniteMinMax finite_aminmax_rows(const at::Tensor& y);
// Wrap a possibly negative axis, or throw naming the shape.
int64_t wrap_axis(int64_t axis, at::IntArrayRef sizes, const char* who);
// Throws unless `t` is a defined tensor with `dtype` and `sizes`.
void require_tensor(const std::map<std::string, at::Tensor>& state, const std::string& name,
                    at::ScalarType dtype, at::IntArrayRef sizes, const std::string& who);
}  // namespace detail

}  // namespace qforge
