// Histogram: the running histogram behind the histogram observers. It bins float data with
// torch.histc's rule and grows its range exactly as PyTorch's HistogramObserver.forward does
// (_adjust_min_max + _combine_histograms with upsample_rate), so the counts match PyTorch bit for
// bit. Binning has a scalar reference (histc_reference) and a vectorised, parallel fast path
// (histc_fast) that must give identical counts. Formulas: docs/observers.md.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "observers/observer.h"

namespace qforge {

// Outer bin edges torch.histc uses for [min, max]: a degenerate range is widened by 1 each side.
std::pair<float, float> histc_edges(float min, float max);

// torch.histc(x, bins, lo, hi) on CPU (PyTorch 1.13): value v in [lo, hi] goes to bin
// trunc((v - lo) / (hi - lo) * bins) computed in float32, the last bin also holding v == hi;
// values outside [lo, hi], NaN and inf are skipped (1.13's histc puts NaN in bin 0, a bug).
// Writes `bins` counts to `counts`.
// The reference: one scalar loop, the definition of the result.
void histc_reference(const float* x, int64_t n, float lo, float hi, int64_t bins, float* counts);
// Same counts, vectorised and parallel (at::parallel_for over chunks, per-thread counters).
void histc_fast(const float* x, int64_t n, float lo, float hi, int64_t bins, float* counts);

// Finite minimum / maximum of some values (+inf / -inf when none) and how many were not finite.
struct FiniteStats {
  float min = __builtin_inff();
  float max = -__builtin_inff();
  int64_t nonfinite = 0;
};
// The same statistics from the fast path's vectorised, parallel kernel.
FiniteStats finite_stats(const float* x, int64_t n);
// histc_fast and finite_stats in one pass over the data.
FiniteStats histc_fast_with_stats(const float* x, int64_t n, float lo, float hi, int64_t bins, float* counts);

class Histogram {
 public:
  explicit Histogram(int64_t bins = kHistogramBins, int64_t upsample_rate = kHistogramUpsampleRate);

  // Adds `n` values whose finite minimum / maximum are `xmin` / `xmax` (non-finite values are
  // skipped by the binning rule). PyTorch's HistogramObserver.forward on the finite values.
  void update(const float* x, int64_t n, float xmin, float xmax);
  // Adds `n` raw values (NaN/inf skipped, their number written to *nonfinite). When the values
  // fall inside the current range this is a single fused pass (statistics + binning), otherwise
  // a statistics pass followed by update(). Same result as update() either way.
  void observe(const float* x, int64_t n, int64_t* nonfinite);
  // The single-pass case of observe(): bins on the current range and keeps the counts only if
  // every finite value was inside it. Always fills *stats; returns whether the counts were added.
  bool update_if_in_range(const float* x, int64_t n, FiniteStats* stats);
  // Adds another histogram: the range grows as update() would for data spanning other's range,
  // and other's counts are re-binned onto the new grid assuming uniform density within a bin.
  void merge(const Histogram& other);

  bool empty() const { return min_ == kEmptyMin && max_ == kEmptyMax; }
  // The histogram's range (PyTorch's min_val / max_val); +inf / -inf when empty.
  float min() const { return min_; }
  float max() const { return max_; }
  int64_t bins() const { return bins_; }
  int64_t upsample_rate() const { return upsample_rate_; }
  const std::vector<float>& counts() const { return counts_; }
  // Bin edges of the counts: [min, max] except for a degenerate (constant) range, where the
  // counts live on torch.histc's widened edges [min - 1, max + 1].
  std::pair<float, float> edges() const { return histc_edges(min_, max_); }
  double total() const;

  // Replaces the state; throws qforge::Error on a wrong size or an invalid range.
  void assign(float min, float max, std::vector<float> counts);
  void clear();

 private:
  static constexpr float kEmptyMin = __builtin_inff();
  static constexpr float kEmptyMax = -__builtin_inff();

  void histc(const float* x, int64_t n, float lo, float hi, std::vector<float>& out) const;
  // Adds `mass` at the bin torch.histc would give `value` on [lo, hi].
  void add_point_mass(std::vector<float>& out, float lo, float hi, float value, double mass) const;
  // Adds this->counts_ (on [src_lo, src_hi]) re-binned onto [lo, hi] by overlap.
  static void rebin_into(const Histogram& src, float lo, float hi, std::vector<float>& out);
  // PyTorch's _combine_histograms: up-samples `old` by upsample_rate, shifts it by start_idx,
  // down-samples by downsample_rate, and adds it to `out`.
  void combine_histograms(std::vector<float>& out, const std::vector<float>& old,
                          int64_t downsample_rate, int64_t start_idx) const;
  // PyTorch's _adjust_min_max: relaxes the combined max so the old grid aligns with the new one.
  void adjust_min_max(float& combined_min, float& combined_max, int64_t& downsample_rate,
                      int64_t& start_idx) const;

  int64_t bins_;
  int64_t upsample_rate_;
  float min_ = kEmptyMin;
  float max_ = kEmptyMax;
  std::vector<float> counts_;
};

}  // namespace qforge
