// Range searches on a Histogram: given the histogram of everything observed and a target grid,
// choose the [min, max] to quantize to. l2 is PyTorch HistogramObserver's search (bit-identical),
// entropy is TensorRT's KL-divergence calibration, percentile clips the tails, mse minimises the
// expected quantization error. Objectives: docs/observers.md.
#pragma once

#include <cstdint>
#include <utility>

#include "framework/core/qparams.h"
#include "observers/histogram.h"
#include "observers/observer.h"

namespace qforge {

// The range `method` picks for `spec` (per-tensor) from a non-empty histogram.
std::pair<float, float> histogram_range(const Histogram& h, const QSpec& spec, HistogramMethod method,
                                        double percentile);

// PyTorch's HistogramObserver._non_linear_param_search with dst_nbins = 2^bits.
std::pair<float, float> l2_range(const Histogram& h, int64_t dst_nbins);
// PyTorch's _compute_quantization_error(start_bin, end_bin): scalar float32 code doing the same
// operations, summed by at::sum so the reduction order is PyTorch's too.
double l2_quantization_error(const Histogram& h, int64_t start_bin, int64_t end_bin, int64_t dst_nbins);
// The same, written with ATen tensor ops line by line as the Python: the reference twin.
double l2_quantization_error_reference(const Histogram& h, int64_t start_bin, int64_t end_bin,
                                       int64_t dst_nbins);

// TensorRT entropy calibration: threshold t minimising KL(P || Q) between the |x| histogram
// clipped at t and its quantization to `levels` levels; returns [max(min, -t), min(max, t)].
std::pair<float, float> entropy_range(const Histogram& h, int64_t levels);

// Percentile clipping: symmetric -> t = percentile of |x|, range [-t, t] within [min, max];
// affine -> [quantile((100 - p) / 100), quantile(p / 100)] of x.
std::pair<float, float> percentile_range(const Histogram& h, double percentile, bool symmetric);

// The clip range (on bin edges) minimising clipping error + rounding noise estimated from the
// histogram for `spec`'s grid.
std::pair<float, float> mse_range(const Histogram& h, const QSpec& spec);

// Expected squared quantization error, summed over the histogram's data (uniform density within
// each bin), on the grid `spec` gives the range [lo, hi]: clipping error outside the grid's range
// plus rounding error inside it, integrated exactly per bin (float8: clipping plus a relative
// rounding noise of one mantissa step). Divide by total() for the mean.
double histogram_expected_sq_error(const Histogram& h, double lo, double hi, const QSpec& spec);
// Sum of x^2 over the histogram's data (uniform density within each bin).
double histogram_second_moment(const Histogram& h);

// The |x| histogram over [0, max(|min|, |max|)] with h.bins() bins, folded from h assuming
// uniform density within each bin.
std::vector<double> abs_histogram(const Histogram& h, double* abs_max);

}  // namespace qforge
