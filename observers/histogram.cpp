// Histogram: torch.histc binning (reference + fast path) and PyTorch HistogramObserver's range
// growth and re-binning, written as scalar float32/float64 code that performs the same IEEE
// operations in the same order as PyTorch's tensor code, so results are bit-identical.
#include "observers/histogram.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "framework/core/error.h"

namespace qforge {

namespace {
// Elements whose bin indices are computed in one vector pass (fits L1 with the counters).
constexpr int64_t kBinBlock = 1024;
// Elements per at::parallel_for task: large enough to amortise the per-task counters.
constexpr int64_t kBinGrain = int64_t{1} << 16;
// Interleaved counter copies, so runs of equal bins do not serialise on one memory location.
constexpr int kSubHistograms = 4;
// uint32 counters are flushed before they can overflow.
constexpr int64_t kFlushEvery = int64_t{1} << 30;

// Bin index of every value, `trash` for values torch.histc skips. Same float ops as
// histc_reference, so the result is identical; compiled for AVX-512/AVX2 with a run-time choice.
__attribute__((target_clones("avx512f", "avx2", "default"))) void bin_indices(
    const float* x, int64_t n, float lo, float hi, float nbins, int32_t last, int32_t trash,
    int32_t* idx) {
  const float width = hi - lo;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const bool in = (v >= lo) & (v <= hi);
    // Selecting before the conversion keeps NaN/out-of-range values out of the int cast.
    const float p = in ? (v - lo) / width * nbins : 0.0f;
    int32_t b = static_cast<int32_t>(p);
    b = b > last ? last : b;  // v == hi lands in the last bin, as torch.histc
    idx[i] = in ? b : trash;
  }
}

// Lanes of the running finite min/max and non-finite count, one per vector element.
constexpr int kLanes = 16;

struct LaneStats {
  float min[kLanes];
  float max[kLanes];
  int64_t nonfinite[kLanes];
  LaneStats() {
    std::fill(min, min + kLanes, kInf);
    std::fill(max, max + kLanes, -kInf);
    std::fill(nonfinite, nonfinite + kLanes, int64_t{0});
  }
  static constexpr float kInf = std::numeric_limits<float>::infinity();
};

// Lane-wise finite min/max and non-finite count of a block (kept in vector registers; the
// block is then binned while still in L1, so statistics and binning cost one memory pass).
__attribute__((target_clones("avx512f", "avx2", "default"))) void block_stats(
    const float* __restrict x, int64_t n, LaneStats& stats) {
  float mn[kLanes], mx[kLanes];
  int32_t nf[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    mn[l] = stats.min[l];
    mx[l] = stats.max[l];
    nf[l] = 0;
  }
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float v = x[i + l];
      const bool finite = std::fabs(v) <= std::numeric_limits<float>::max();  // false for NaN, inf
      const float vmin = finite ? v : mn[l], vmax = finite ? v : mx[l];
      mn[l] = vmin < mn[l] ? vmin : mn[l];
      mx[l] = vmax > mx[l] ? vmax : mx[l];
      nf[l] += finite ? 0 : 1;
    }
  }
  for (; i < n; ++i) {
    const float v = x[i];
    const bool finite = std::fabs(v) <= std::numeric_limits<float>::max();
    if (finite) {
      mn[0] = std::min(mn[0], v);
      mx[0] = std::max(mx[0], v);
    } else {
      ++nf[0];
    }
  }
  for (int l = 0; l < kLanes; ++l) {
    stats.min[l] = mn[l];
    stats.max[l] = mx[l];
    stats.nonfinite[l] += nf[l];
  }
}

void count_block(const int32_t* idx, int64_t n, uint32_t* sub, int64_t stride) {
  int64_t i = 0;
  for (; i + kSubHistograms <= n; i += kSubHistograms) {
    ++sub[idx[i]];
    ++sub[stride + idx[i + 1]];
    ++sub[2 * stride + idx[i + 2]];
    ++sub[3 * stride + idx[i + 3]];
  }
  for (; i < n; ++i) ++sub[idx[i]];
}

// torch.histc bin of one value on [lo, hi] (lo < hi), or -1 when skipped.
int64_t histc_bin(float v, float lo, float hi, int64_t bins) {
  if (!(v >= lo && v <= hi)) return -1;
  int64_t pos = static_cast<int64_t>((v - lo) / (hi - lo) * static_cast<float>(bins));
  if (pos == bins) pos -= 1;
  return pos;
}
}  // namespace

std::pair<float, float> histc_edges(float min, float max) {
  // torch.histc widens a degenerate range by 1 in double, then linspace rounds to float.
  if (min == max) {
    float lo = static_cast<float>(static_cast<double>(min) - 1.0);
    float hi = static_cast<float>(static_cast<double>(max) + 1.0);
    // Above 2^24 the widening by 1 rounds away in float (a constant 3e7 would give an empty
    // range): widen by one float step instead, staying finite.
    if (!(lo < hi)) {
      lo = std::nextafter(min, -std::numeric_limits<float>::max());
      hi = std::nextafter(max, std::numeric_limits<float>::max());
    }
    return {lo, hi};
  }
  return {min, max};
}

void histc_reference(const float* x, int64_t n, float lo, float hi, int64_t bins, float* counts) {
  QF_CHECK(bins > 0 && lo < hi, "lo ", lo, " hi ", hi);
  std::fill(counts, counts + bins, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (!(v >= lo && v <= hi)) continue;  // skips out-of-range values, NaN and inf
    // Divide, then multiply: PyTorch 1.13's order (2.x multiplies first; see docs/observers.md).
    int64_t pos = static_cast<int64_t>((v - lo) / (hi - lo) * static_cast<float>(bins));
    if (pos == bins) pos -= 1;  // the last bin includes its right edge
    counts[pos] += 1.0f;
  }
}

namespace {
// The parallel driver of the fast path: per-task counters (and lane statistics), summed at the
// end. `counts` may be null (statistics only); `stats` may be null (binning only).
void histc_driver(const float* x, int64_t n, float lo, float hi, int64_t bins, float* counts,
                  FiniteStats* stats) {
  const bool bin = counts != nullptr;
  QF_CHECK(!bin || (bins > 0 && bins < std::numeric_limits<int32_t>::max() && lo < hi));
  const int64_t stride = bins + 1;  // one extra "trash" counter for skipped values
  const int threads = std::max(1, at::get_num_threads());
  std::vector<int64_t> totals(bin ? static_cast<size_t>(threads * bins) : 0, 0);
  std::vector<LaneStats> lane_stats(static_cast<size_t>(threads));
  at::parallel_for(0, n, kBinGrain, [&](int64_t begin, int64_t end) {
    const int tid = std::min(at::get_thread_num(), threads - 1);
    std::vector<uint32_t> sub(bin ? static_cast<size_t>(kSubHistograms * stride) : 0, 0);
    alignas(64) int32_t idx[kBinBlock];
    int64_t* total = bin ? totals.data() + tid * bins : nullptr;
    auto flush = [&] {
      for (int64_t b = 0; b < bins; ++b) {
        int64_t s = 0;
        for (int k = 0; k < kSubHistograms; ++k) s += sub[k * stride + b];
        total[b] += s;
      }
      std::fill(sub.begin(), sub.end(), 0u);
    };
    int64_t pending = 0;
    for (int64_t i = begin; i < end; i += kBinBlock) {
      const int64_t m = std::min(kBinBlock, end - i);
      const float nbins = static_cast<float>(bins);
      const auto last = static_cast<int32_t>(bins - 1), trash = static_cast<int32_t>(bins);
      if (stats != nullptr) block_stats(x + i, m, lane_stats[tid]);
      if (!bin) continue;
      bin_indices(x + i, m, lo, hi, nbins, last, trash, idx);
      count_block(idx, m, sub.data(), stride);
      pending += m;
      if (pending >= kFlushEvery) {
        flush();
        pending = 0;
      }
    }
    if (bin) flush();
  });
  if (bin) {
    for (int64_t b = 0; b < bins; ++b) {
      int64_t s = 0;
      for (int t = 0; t < threads; ++t) s += totals[t * bins + b];
      counts[b] = static_cast<float>(s);
    }
  }
  if (stats != nullptr) {
    *stats = FiniteStats{};
    for (const LaneStats& ls : lane_stats) {
      for (int l = 0; l < kLanes; ++l) {
        stats->min = std::min(stats->min, ls.min[l]);
        stats->max = std::max(stats->max, ls.max[l]);
        stats->nonfinite += ls.nonfinite[l];
      }
    }
  }
}
}  // namespace

void histc_fast(const float* x, int64_t n, float lo, float hi, int64_t bins, float* counts) {
  histc_driver(x, n, lo, hi, bins, counts, nullptr);
}

FiniteStats finite_stats(const float* x, int64_t n) {
  FiniteStats s;
  histc_driver(x, n, 0.0f, 1.0f, 0, nullptr, &s);
  return s;
}

FiniteStats histc_fast_with_stats(const float* x, int64_t n, float lo, float hi, int64_t bins,
                                  float* counts) {
  FiniteStats s;
  histc_driver(x, n, lo, hi, bins, counts, &s);
  return s;
}

Histogram::Histogram(int64_t bins, int64_t upsample_rate)
    : bins_(bins), upsample_rate_(upsample_rate) {
  QF_REQUIRE(bins >= 2, "histogram: bins must be >= 2, got ", bins);
  QF_REQUIRE(upsample_rate >= 1, "histogram: upsample_rate must be >= 1, got ", upsample_rate);
  // Caps (far above PyTorch's 2048 bins x 128): a file or recipe declaring more is refused before
  // anything is allocated, and bins * upsample_rate stays far from int64 overflow.
  QF_REQUIRE(bins <= kMaxHistogramBins, "histogram: bins must be <= ", kMaxHistogramBins, ", got ", bins);
  QF_REQUIRE(upsample_rate <= kMaxHistogramUpsampleRate, "histogram: upsample_rate must be <= ",
             kMaxHistogramUpsampleRate, ", got ", upsample_rate);
  counts_.assign(static_cast<size_t>(bins_), 0.0f);
}

double Histogram::total() const {
  double s = 0.0;
  for (float c : counts_) s += c;
  return s;
}

void Histogram::clear() {
  min_ = kEmptyMin;
  max_ = kEmptyMax;
  std::fill(counts_.begin(), counts_.end(), 0.0f);
}

void Histogram::assign(float min, float max, std::vector<float> counts) {
  QF_REQUIRE(static_cast<int64_t>(counts.size()) == bins_, "histogram: ", counts.size(),
             " counts for a histogram of ", bins_, " bins");
  const bool empty_pair = min == kEmptyMin && max == kEmptyMax;
  QF_REQUIRE(empty_pair || (std::isfinite(min) && std::isfinite(max) && min <= max),
             "histogram: range [", min, ", ", max, "] is neither finite nor the empty (+inf, -inf) pair");
  // Re-binning onto a wider range (PyTorch's _combine_histograms) takes differences of a float32
  // cumulative sum, so a histogram of tens of millions of values carries counts slightly below
  // zero (about -1 for 2.6e7 values); they are kept, as PyTorch keeps them. Anything beyond that
  // rounding (16 float32 epsilons of the positive counts' sum) is not a histogram.
  double positive = 0.0;
  for (float c : counts) {
    QF_REQUIRE(std::isfinite(c), "histogram: counts must be finite, got ", c);
    if (c > 0) positive += c;
  }
  const double tolerance = 16.0 * std::numeric_limits<float>::epsilon() * positive;
  for (float c : counts)
    QF_REQUIRE(c >= -tolerance, "histogram: counts must be >= 0 (up to float32 rounding, -", tolerance, "), got ", c);
  min_ = min;
  max_ = max;
  counts_ = std::move(counts);
}

void Histogram::histc(const float* x, int64_t n, float lo, float hi, std::vector<float>& out) const {
  out.assign(static_cast<size_t>(bins_), 0.0f);
  histc_fast(x, n, lo, hi, bins_, out.data());
}

void Histogram::add_point_mass(std::vector<float>& out, float lo, float hi, float value,
                               double mass) const {
  const auto [elo, ehi] = histc_edges(lo, hi);
  const int64_t b = histc_bin(value, elo, ehi, bins_);
  QF_CHECK(b >= 0, "value ", value, " outside [", elo, ", ", ehi, "]");
  out[b] += static_cast<float>(mass);
}

void Histogram::adjust_min_max(float& combined_min, float& combined_max, int64_t& downsample_rate,
                               int64_t& start_idx) const {
  // PyTorch's _adjust_min_max on float32 0-dim tensors: the old bins, up-sampled by
  // upsample_rate, must tile the new range exactly `downsample_rate` times per new bin.
  const float hist_bin_width = (max_ - min_) / static_cast<float>(bins_ * upsample_rate_);
  const float old_span = static_cast<float>(bins_) * hist_bin_width;
  const float width = combined_max - combined_min;
  const float ratio = std::ceil(width / old_span);
  QF_REQUIRE(hist_bin_width > 0.0f && std::isfinite(ratio) &&
                 ratio <= static_cast<float>(std::numeric_limits<int64_t>::max() / (2 * bins_)),
             "histogram: cannot grow range [", min_, ", ", max_, "] to [", combined_min, ", ",
             combined_max, "]: the ranges differ by too many orders of magnitude");
  downsample_rate = static_cast<int64_t>(ratio);
  const float e = static_cast<float>(downsample_rate) * old_span - width;
  // Only the max is relaxed, so a one-sided distribution keeps min at zero.
  combined_max = combined_max + e;
  start_idx = static_cast<int64_t>(std::nearbyint((min_ - combined_min) / hist_bin_width));
}

void Histogram::combine_histograms(std::vector<float>& out, const std::vector<float>& old,
                                   int64_t downsample_rate, int64_t start_idx) const {
  // PyTorch materialises the up-sampled histogram (bins * downsample_rate values) and takes a
  // float64 cumsum; streaming the same sequential additions gives the same integral without it.
  const int64_t d = downsample_rate, u = upsample_rate_;
  const int64_t fine = bins_ * d;
  std::vector<double> integral(static_cast<size_t>(bins_));
  double run = 0.0;
  int64_t k = 0;
  for (int64_t j = 0; j < bins_; ++j) {
    const double h = static_cast<double>(old[j]);
    const int64_t base = start_idx + j * u;
    if (base >= fine) break;  // past the fine grid (PyTorch would fail on the slice assignment)
    const int64_t stop = std::min(base + u, fine);
    for (int64_t p = base; p < stop; ++p) {
      while (k < bins_ && (k + 1) * d - 1 < p) integral[k++] = run;
      run += h;
    }
  }
  while (k < bins_) integral[k++] = run;
  for (int64_t b = 0; b < bins_; ++b) {
    // PyTorch stores the shifted integral in a float32 tensor: round it the same way.
    const double shifted = b == 0 ? 0.0 : static_cast<double>(static_cast<float>(integral[b - 1]));
    out[b] = out[b] + static_cast<float>((integral[b] - shifted) / static_cast<double>(u));
  }
}

bool Histogram::update_if_in_range(const float* x, int64_t n, FiniteStats* stats) {
  if (empty() || min_ == max_) {
    *stats = finite_stats(x, n);
    return false;
  }
  // In range, PyTorch's update keeps [min, max] and adds the new counts; check that
  // _adjust_min_max indeed leaves the range alone (it does unless the bin width underflows).
  float cmin = min_, cmax = max_;
  int64_t downsample_rate = 0, start_idx = 0;
  adjust_min_max(cmin, cmax, downsample_rate, start_idx);
  if (cmin != min_ || cmax != max_) {
    *stats = finite_stats(x, n);
    return false;
  }
  std::vector<float> fresh(static_cast<size_t>(bins_));
  *stats = histc_fast_with_stats(x, n, min_, max_, bins_, fresh.data());
  if (!(stats->min >= min_ && stats->max <= max_)) return false;  // range grows: caller re-bins
  for (int64_t b = 0; b < bins_; ++b) counts_[b] = fresh[b] + counts_[b];
  return true;
}

void Histogram::observe(const float* x, int64_t n, int64_t* nonfinite) {
  FiniteStats stats;
  if (!update_if_in_range(x, n, &stats) && stats.min <= stats.max) update(x, n, stats.min, stats.max);
  *nonfinite = stats.nonfinite;
}

void Histogram::update(const float* x, int64_t n, float xmin, float xmax) {
  QF_CHECK(std::isfinite(xmin) && std::isfinite(xmax) && xmin <= xmax, xmin, " ", xmax);
  // Bin positions are (x - lo) / (hi - lo): a range wider than float can hold has no bins.
  const float lo_all = empty() ? xmin : std::min(min_, xmin), hi_all = empty() ? xmax : std::max(max_, xmax);
  QF_REQUIRE(std::isfinite(hi_all - lo_all), "histogram: values span [", lo_all, ", ", hi_all,
             "], wider than float32 can represent (the width overflows); no integer grid covers them");
  std::vector<float> fresh;
  if (empty()) {
    const auto [lo, hi] = histc_edges(xmin, xmax);
    histc(x, n, lo, hi, fresh);
    min_ = xmin;
    max_ = xmax;
    counts_ = std::move(fresh);
    return;
  }
  if (min_ == max_) {
    // Constant so far. PyTorch re-initialises here and drops the earlier batches; we keep them
    // as the point mass they are, so merge and multi-batch counts stay right.
    if (xmin == xmax && xmin == min_) {
      const auto [lo, hi] = histc_edges(xmin, xmax);
      histc(x, n, lo, hi, fresh);
      for (int64_t b = 0; b < bins_; ++b) counts_[b] = fresh[b] + counts_[b];
      return;
    }
    const float lo = std::min(min_, xmin), hi = std::max(max_, xmax);
    const double mass = total();
    histc(x, n, lo, hi, fresh);
    add_point_mass(fresh, lo, hi, min_, mass);
    min_ = lo;
    max_ = hi;
    counts_ = std::move(fresh);
    return;
  }
  float cmin = std::min(xmin, min_), cmax = std::max(xmax, max_);
  int64_t downsample_rate = 0, start_idx = 0;
  adjust_min_max(cmin, cmax, downsample_rate, start_idx);
  histc(x, n, cmin, cmax, fresh);
  if (cmin == min_ && cmax == max_) {
    for (int64_t b = 0; b < bins_; ++b) fresh[b] = fresh[b] + counts_[b];
  } else {
    combine_histograms(fresh, counts_, downsample_rate, start_idx);
  }
  min_ = cmin;
  max_ = cmax;
  counts_ = std::move(fresh);
}

void Histogram::rebin_into(const Histogram& src, float lo, float hi, std::vector<float>& out) {
  const int64_t bins = static_cast<int64_t>(out.size());
  if (src.min_ == src.max_) {
    src.add_point_mass(out, lo, hi, src.min_, src.total());
    return;
  }
  if (src.min_ == lo && src.max_ == hi && src.bins_ == bins) {
    for (int64_t b = 0; b < bins; ++b) out[b] = out[b] + src.counts_[b];
    return;
  }
  // Uniform density within each source bin: its count is split by overlap length.
  std::vector<double> acc(static_cast<size_t>(bins), 0.0);
  const double s0 = src.min_, ws = (static_cast<double>(src.max_) - s0) / src.bins_;
  const double d0 = lo, wd = (static_cast<double>(hi) - d0) / bins;
  for (int64_t j = 0; j < src.bins_; ++j) {
    const double c = src.counts_[j];
    if (c == 0.0) continue;
    const double a = (s0 + j * ws - d0) / wd, z = (s0 + (j + 1) * ws - d0) / wd;  // in dst bins
    const int64_t first = std::clamp<int64_t>(static_cast<int64_t>(std::floor(a)), 0, bins - 1);
    const int64_t last = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(z)) - 1, 0, bins - 1);
    if (first >= last || z <= a) {
      acc[first] += c;
      continue;
    }
    for (int64_t b = first; b <= last; ++b) {
      const double lo_b = std::max(a, static_cast<double>(b)), hi_b = std::min(z, static_cast<double>(b + 1));
      if (hi_b > lo_b) acc[b] += c * (hi_b - lo_b) / (z - a);
    }
  }
  for (int64_t b = 0; b < bins; ++b) out[b] = out[b] + static_cast<float>(acc[b]);
}

void Histogram::merge(const Histogram& other) {
  QF_REQUIRE(other.bins_ == bins_ && other.upsample_rate_ == upsample_rate_,
             "histogram: cannot merge a histogram of ", other.bins_, " bins (upsample_rate ",
             other.upsample_rate_, ") into one of ", bins_, " bins (upsample_rate ", upsample_rate_, ")");
  if (other.empty()) return;
  if (empty()) {
    min_ = other.min_;
    max_ = other.max_;
    counts_ = other.counts_;
    return;
  }
  std::vector<float> fresh(static_cast<size_t>(bins_), 0.0f);
  if (min_ == max_) {
    if (other.min_ == other.max_ && other.min_ == min_) {
      for (int64_t b = 0; b < bins_; ++b) counts_[b] = other.counts_[b] + counts_[b];
      return;
    }
    const float lo = std::min(min_, other.min_), hi = std::max(max_, other.max_);
    rebin_into(other, lo, hi, fresh);
    add_point_mass(fresh, lo, hi, min_, total());
    min_ = lo;
    max_ = hi;
    counts_ = std::move(fresh);
    return;
  }
  // As update() with data spanning other's range: the same grid growth, then other's counts
  // (instead of histc of raw data) are re-binned onto the new grid.
  float cmin = std::min(other.min_, min_), cmax = std::max(other.max_, max_);
  int64_t downsample_rate = 0, start_idx = 0;
  adjust_min_max(cmin, cmax, downsample_rate, start_idx);
  rebin_into(other, cmin, cmax, fresh);
  if (cmin == min_ && cmax == max_) {
    for (int64_t b = 0; b < bins_; ++b) fresh[b] = fresh[b] + counts_[b];
  } else {
    combine_histograms(fresh, counts_, downsample_rate, start_idx);
  }
  min_ = cmin;
  max_ = cmax;
  counts_ = std::move(fresh);
}

}  // namespace qforge
