// Range searches on a histogram (l2 / entropy / percentile / mse); see histogram_search.h.
#include "observers/histogram_search.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "framework/core/error.h"

namespace qforge {

namespace {
// PyTorch's search granularity in _non_linear_param_search.
constexpr double kL2StepSize = 1e-5;

// Python's float floor division as torch.div(a, b, rounding_mode='floor') computes it.
float div_floor(float a, float b) {
  if (b == 0.0f) return a / b;
  const float mod = std::fmod(a, b);
  float div = (a - mod) / b;
  if ((mod != 0.0f) && ((b < 0.0f) != (mod < 0.0f))) div -= 1.0f;
  if (div == 0.0f) return std::copysign(0.0f, a / b);
  float floordiv = std::floor(div);
  if (div - floordiv > 0.5f) floordiv += 1.0f;
  return floordiv;
}

// [-t, t] within [min, max]; data entirely beyond t on one side collapses to the point t,
// which still gives the symmetric grid of half-width t.
std::pair<float, float> symmetric_clip(const Histogram& h, float t) {
  const float hi = std::min(h.max(), t), lo = std::max(h.min(), -t);
  if (lo > hi) return h.min() > 0.0f ? std::pair<float, float>{t, t} : std::pair<float, float>{-t, -t};
  return {lo, hi};
}

at::Tensor counts_tensor(const Histogram& h) {
  at::Tensor t = at::empty({h.bins()}, at::kFloat);
  std::copy(h.counts().begin(), h.counts().end(), t.data_ptr<float>());
  return t;
}

// Fraction of the mass the percentile/quantile lookups treat as "everything".
double quantile_position(const std::vector<double>& counts, double lo_edge, double width, double q) {
  double total = 0.0;
  for (double c : counts) total += c;
  const double target = q * total;
  double cum = 0.0;
  for (size_t b = 0; b < counts.size(); ++b) {
    if (counts[b] > 0.0 && cum + counts[b] >= target) {
      // Linear interpolation inside the bin: the CDF is piecewise linear under uniform density.
      const double frac = std::clamp((target - cum) / counts[b], 0.0, 1.0);
      return lo_edge + (static_cast<double>(b) + frac) * width;
    }
    cum += counts[b];
  }
  return lo_edge + static_cast<double>(counts.size()) * width;
}
}  // namespace

double l2_quantization_error(const Histogram& h, int64_t start_bin, int64_t end_bin, int64_t dst_nbins) {
  const int64_t bins = h.bins();
  // Python floats (double) where PyTorch uses .item(); float32 where it uses tensors.
  const double bin_width = (static_cast<double>(h.max()) - static_cast<double>(h.min())) / bins;
  const double dst_bin_width = bin_width * static_cast<double>(end_bin - start_bin + 1) / dst_nbins;
  if (dst_bin_width == 0.0) return 0.0;
  const float bw = static_cast<float>(bin_width), dbw = static_cast<float>(dst_bin_width);
  const float half = static_cast<float>(dst_bin_width / 2), neg_half = static_cast<float>(-dst_bin_width / 2);
  const float last_dst = static_cast<float>(dst_nbins - 1);
  const float mid_norm = (half * half * half - neg_half * neg_half * neg_half) / 3.0f;
  at::Tensor norm_t = at::empty({bins}, at::kFloat);
  float* norm = norm_t.data_ptr<float>();
  const float* counts = h.counts().data();
  for (int64_t i = 0; i < bins; ++i) {
    const float begin = static_cast<float>(i - start_bin) * bw;
    const float end = begin + bw;
    const float dst_begin = std::clamp(div_floor(begin, dbw), 0.0f, last_dst);
    const float dst_begin_center = (dst_begin + 0.5f) * dbw;
    const float dst_end = std::clamp(div_floor(end, dbw), 0.0f, last_dst);
    const float density = counts[i] / bw;
    const float db = begin - dst_begin_center;
    const float de = 1.0f * half;
    float n = 0.0f + density * ((de * de * de - db * db * db) / 3.0f);
    n = n + (dst_end - dst_begin - 1.0f) * (density * mid_norm);
    const float dst_end_center = dst_end * dbw + half;
    const float de3 = end - dst_end_center;
    n = n + density * ((de3 * de3 * de3 - neg_half * neg_half * neg_half) / 3.0f);
    norm[i] = n;
  }
  return static_cast<double>(at::sum(norm_t).item<float>());
}

double l2_quantization_error_reference(const Histogram& h, int64_t next_start_bin, int64_t next_end_bin,
                                       int64_t dst_nbins) {
  const int64_t bins = h.bins();
  const at::Tensor histogram = counts_tensor(h);
  const double bin_width = (static_cast<double>(h.max()) - static_cast<double>(h.min())) / bins;
  const double dst_bin_width = bin_width * static_cast<double>(next_end_bin - next_start_bin + 1) / dst_nbins;
  if (dst_bin_width == 0.0) return 0.0;
  auto get_norm = [](const at::Tensor& delta_begin, const at::Tensor& delta_end, const at::Tensor& density) {
    const at::Tensor norm =
        (delta_end * delta_end * delta_end - delta_begin * delta_begin * delta_begin) / 3;
    return density * norm;
  };
  const at::Tensor src_bin = at::arange(bins, at::kLong);
  const at::Tensor src_bin_begin = (src_bin - next_start_bin) * bin_width;
  const at::Tensor src_bin_end = src_bin_begin + bin_width;
  const at::Tensor dst_bin_of_begin =
      at::clamp(at::div(src_bin_begin, dst_bin_width, "floor"), 0, dst_nbins - 1);
  const at::Tensor dst_bin_of_begin_center = (dst_bin_of_begin + 0.5) * dst_bin_width;
  const at::Tensor dst_bin_of_end = at::clamp(at::div(src_bin_end, dst_bin_width, "floor"), 0, dst_nbins - 1);
  const at::Tensor density = histogram / bin_width;
  at::Tensor norm = at::zeros({bins}, at::kFloat);
  at::Tensor delta_begin = src_bin_begin - dst_bin_of_begin_center;
  const double delta_end = dst_bin_width / 2;
  norm += get_norm(delta_begin, at::ones({bins}, at::kFloat) * delta_end, density);
  norm += (dst_bin_of_end - dst_bin_of_begin - 1) *
          get_norm(at::scalar_tensor(-dst_bin_width / 2, at::kFloat),
                   at::scalar_tensor(dst_bin_width / 2, at::kFloat), density);
  const at::Tensor dst_bin_of_end_center = dst_bin_of_end * dst_bin_width + dst_bin_width / 2;
  const at::Tensor delta_end2 = src_bin_end - dst_bin_of_end_center;
  norm += get_norm(at::scalar_tensor(-dst_bin_width / 2, at::kFloat), delta_end2, density);
  return static_cast<double>(norm.sum().item<float>());
}

std::pair<float, float> l2_range(const Histogram& h, int64_t dst_nbins) {
  QF_CHECK(!h.empty());
  const int64_t bins = h.bins();
  const float mn = h.min(), mx = h.max();
  if (mn == mx) return {mn, mx};  // PyTorch gets the same after a search that cannot move
  const float bin_width = (mx - mn) / static_cast<float>(bins);
  const double total = static_cast<double>(at::sum(counts_tensor(h)).item<float>());
  // torch.cumsum of float32 accumulates in double on CPU and stores float32.
  std::vector<float> csum(static_cast<size_t>(bins));
  double run = 0.0;
  for (int64_t i = 0; i < bins; ++i) csum[i] = static_cast<float>(run += h.counts()[i]);

  double alpha = 0.0, beta = 1.0, norm_min = std::numeric_limits<double>::infinity();
  int64_t start_bin = 0, end_bin = bins - 1;
  while (alpha < beta) {
    const double next_alpha = alpha + kL2StepSize, next_beta = beta - kL2StepSize;
    // PyTorch compares a float32 tensor with a Python float: the threshold is rounded to float.
    const float alpha_mass = static_cast<float>(next_alpha * total);
    const float beta_mass = static_cast<float>(next_beta * total);
    // PyTorch walks l up / r down one bin at a time; csum is sorted, so bisect to the same bins.
    const int64_t l =
        std::lower_bound(csum.begin() + start_bin, csum.begin() + end_bin, alpha_mass) - csum.begin();
    const int64_t r =
        std::upper_bound(csum.begin() + start_bin + 1, csum.begin() + end_bin + 1, beta_mass) -
        csum.begin() - 1;
    int64_t next_start_bin = start_bin, next_end_bin = end_bin;
    if ((l - start_bin) > (end_bin - r)) {
      next_start_bin = l;
      alpha = next_alpha;
    } else {
      next_end_bin = r;
      beta = next_beta;
    }
    if (next_start_bin == start_bin && next_end_bin == end_bin) continue;
    const double norm = l2_quantization_error(h, next_start_bin, next_end_bin, dst_nbins);
    if (norm > norm_min) break;
    norm_min = norm;
    start_bin = next_start_bin;
    end_bin = next_end_bin;
  }
  const float new_min = mn + bin_width * static_cast<float>(start_bin);
  const float new_max = mn + bin_width * static_cast<float>(end_bin + 1);
  return {new_min, new_max};
}

std::vector<double> abs_histogram(const Histogram& h, double* abs_max_out) {
  const int64_t bins = h.bins();
  const auto [lo, hi] = h.edges();
  const double amax = std::max(std::fabs(static_cast<double>(h.min())), std::fabs(static_cast<double>(h.max())));
  *abs_max_out = amax;
  std::vector<double> out(static_cast<size_t>(bins), 0.0);
  if (amax == 0.0) {
    out[0] = h.total();
    return out;
  }
  const double w = (static_cast<double>(hi) - lo) / bins, aw = amax / bins;
  // Adds mass c spread uniformly over |x| in [a, b] (0 <= a <= b).
  auto spread = [&](double a, double b, double c) {
    if (c == 0.0) return;
    const double fa = a / aw, fb = b / aw;
    const int64_t first = std::clamp<int64_t>(static_cast<int64_t>(std::floor(fa)), 0, bins - 1);
    const int64_t last = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(fb)) - 1, 0, bins - 1);
    if (first >= last || fb <= fa) {
      out[first] += c;
      return;
    }
    for (int64_t k = first; k <= last; ++k) {
      const double s = std::max(fa, static_cast<double>(k)), e = std::min(fb, static_cast<double>(k + 1));
      if (e > s) out[k] += c * (e - s) / (fb - fa);
    }
  };
  for (int64_t j = 0; j < bins; ++j) {
    const double c = h.counts()[j];
    if (c == 0.0) continue;
    const double a = lo + j * w, b = lo + (j + 1) * w;
    if (a >= 0.0) {
      spread(std::min(a, amax), std::min(b, amax), c);
    } else if (b <= 0.0) {
      spread(std::min(-b, amax), std::min(-a, amax), c);
    } else {
      // The bin straddles zero: split its mass by length between the two sides.
      spread(0.0, std::min(-a, amax), c * (-a) / (b - a));
      spread(0.0, std::min(b, amax), c * b / (b - a));
    }
  }
  return out;
}

std::pair<float, float> entropy_range(const Histogram& h, int64_t levels) {
  QF_CHECK(!h.empty() && levels >= 2);
  if (h.min() == h.max()) return {h.min(), h.max()};
  double amax = 0.0;
  std::vector<double> hist = abs_histogram(h, &amax);
  const int64_t bins = static_cast<int64_t>(hist.size());
  if (levels >= bins) return {h.min(), h.max()};
  // As TensorRT/pytorch-quantization: the zero bin (often exact zeros after ReLU) takes its
  // neighbour's count so it does not dominate the distribution.
  hist[0] = hist[1];
  std::vector<double> suffix(static_cast<size_t>(bins + 1), 0.0);
  for (int64_t k = bins - 1; k >= 0; --k) suffix[k] = suffix[k + 1] + hist[k];
  std::vector<double> p(static_cast<size_t>(bins)), q(static_cast<size_t>(bins));
  std::vector<double> qsum(static_cast<size_t>(levels)), qnonzero(static_cast<size_t>(levels));
  double best = std::numeric_limits<double>::infinity();
  int64_t best_i = bins;
  for (int64_t i = levels; i <= bins; ++i) {
    // P: the first i bins with everything beyond folded into the last one (the clipped mass).
    double p_total = 0.0;
    for (int64_t k = 0; k < i; ++k) p[k] = hist[k];
    p[i - 1] += suffix[i];
    for (int64_t k = 0; k < i; ++k) p_total += p[k];
    // Q: the first i bins merged into `levels` groups, each group's mass spread over its
    // non-empty bins.
    std::fill(qsum.begin(), qsum.end(), 0.0);
    std::fill(qnonzero.begin(), qnonzero.end(), 0.0);
    for (int64_t k = 0; k < i; ++k) {
      const int64_t g = k * levels / i;
      if (hist[k] != 0.0) {
        qsum[g] += hist[k];
        qnonzero[g] += 1.0;
      }
    }
    double q_total = 0.0;
    for (int64_t k = 0; k < i; ++k) {
      const int64_t g = k * levels / i;
      q[k] = hist[k] != 0.0 ? qsum[g] / qnonzero[g] : 0.0;
      q_total += q[k];
    }
    if (p_total <= 0.0 || q_total <= 0.0) continue;
    double kl = 0.0;
    for (int64_t k = 0; k < i; ++k) {
      if (p[k] == 0.0) continue;
      if (q[k] == 0.0) {
        kl = std::numeric_limits<double>::infinity();
        break;
      }
      const double pk = p[k] / p_total, qk = q[k] / q_total;
      kl += pk * std::log(pk / qk);
    }
    // Ties go to the larger threshold, as pytorch-quantization's "last argmin".
    if (kl <= best) {
      best = kl;
      best_i = i;
    }
  }
  return symmetric_clip(h, static_cast<float>(amax * static_cast<double>(best_i) / static_cast<double>(bins)));
}

std::pair<float, float> percentile_range(const Histogram& h, double percentile, bool symmetric) {
  QF_REQUIRE(percentile > 0.0 && percentile <= 100.0, "histogram observer: percentile must be in (0, 100], got ",
             percentile);
  QF_CHECK(!h.empty());
  if (h.min() == h.max()) return {h.min(), h.max()};
  const double q = percentile / 100.0;
  if (symmetric) {
    double amax = 0.0;
    const std::vector<double> hist = abs_histogram(h, &amax);
    const double t = std::min(amax, quantile_position(hist, 0.0, amax / static_cast<double>(hist.size()), q));
    return symmetric_clip(h, static_cast<float>(t));
  }
  const auto [lo, hi] = h.edges();
  const std::vector<double> hist(h.counts().begin(), h.counts().end());
  const double w = (static_cast<double>(hi) - lo) / static_cast<double>(hist.size());
  const float a = static_cast<float>(quantile_position(hist, lo, w, 1.0 - q));
  const float b = static_cast<float>(quantile_position(hist, lo, w, q));
  return {std::clamp(a, h.min(), h.max()), std::clamp(b, h.min(), h.max())};
}

namespace {
// Rounds of coordinate descent (best max for the current min, then best min for that max) in
// the affine mse search; two already land on a fixed point in practice.
constexpr int kMseAffineRounds = 3;
// The mse searches score every kMseCoarseStride-th candidate, then every candidate within one
// stride of the best: the objective is smooth at this scale, and it is 10x cheaper.
constexpr int64_t kMseCoarseStride = 16;

// argmin over i in [1, n] of f(i), coarse-to-fine; ties keep the larger i (the wider range).
template <typename F>
int64_t coarse_to_fine_argmin(int64_t n, F&& f, double* best_out) {
  double best = std::numeric_limits<double>::infinity();
  int64_t best_i = n;
  auto visit = [&](int64_t i) {
    const double e = f(i);
    if (e < best) best = e, best_i = i;
  };
  for (int64_t i = n; i >= 1; i -= kMseCoarseStride) visit(i);
  const int64_t center = best_i;
  for (int64_t i = std::min(n, center + kMseCoarseStride - 1); i >= std::max<int64_t>(1, center - kMseCoarseStride + 1); --i) {
    if (i != center) visit(i);
  }
  *best_out = best;
  return best_i;
}

// The grid calculate_qparams builds for [lo, hi] under an integer spec, in double.
struct Grid {
  double scale;
  double zero_point;
  double qmin, qmax;
};
Grid integer_grid(double lo, double hi, const QSpec& spec) {
  const double qmin = static_cast<double>(spec.quant_min()), qmax = static_cast<double>(spec.quant_max());
  const double lo_neg = std::min(lo, 0.0), hi_pos = std::max(hi, 0.0);
  Grid g{0.0, 0.0, qmin, qmax};
  if (spec.symmetric) {
    g.scale = std::max(std::max(-lo_neg, hi_pos) / ((qmax - qmin) / 2.0), static_cast<double>(kScaleEps));
    if (!spec.qtype.is_signed) {
      g.zero_point = (spec.qtype == quint8 && !spec.custom_range()) ? 128.0 : std::floor((qmin + qmax) / 2.0);
    }
  } else {
    g.scale = std::max((hi_pos - lo_neg) / (qmax - qmin), static_cast<double>(kScaleEps));
    g.zero_point = std::clamp(qmin - std::nearbyint(lo_neg / g.scale), qmin, qmax);
  }
  return g;
}

double cube(double x) { return x * x * x; }

// Integral of (x - Q(x))^2 over [a, b], Q rounding to the grid and clamping to its ends.
double bin_sq_error(double a, double b, const Grid& g) {
  const double gmin = (g.qmin - g.zero_point) * g.scale, gmax = (g.qmax - g.zero_point) * g.scale;
  double total = 0.0;
  if (a < gmin) {
    const double x2 = std::min(b, gmin);
    total += (cube(x2 - gmin) - cube(a - gmin)) / 3.0;
    a = x2;
  }
  if (b > gmax) {
    const double x1 = std::max(a, gmax);
    total += (cube(b - gmax) - cube(x1 - gmax)) / 3.0;
    b = x1;
  }
  if (!(a < b)) return total;
  // Grid cells [(q - 1/2) s, (q + 1/2) s] relative to the zero point, walked by integer index.
  const double qa = std::clamp(std::floor(a / g.scale + 0.5), g.qmin - g.zero_point, g.qmax - g.zero_point);
  const double qb = std::clamp(std::floor(b / g.scale + 0.5), g.qmin - g.zero_point, g.qmax - g.zero_point);
  for (double q = qa; q <= qb; q += 1.0) {
    const double center = q * g.scale;
    const double x1 = std::max(a, (q - 0.5) * g.scale), x2 = std::min(b, (q + 0.5) * g.scale);
    if (x2 > x1) total += (cube(x2 - center) - cube(x1 - center)) / 3.0;
  }
  return total;
}

}  // namespace

double histogram_expected_sq_error(const Histogram& h, double lo, double hi, const QSpec& spec) {
  const auto [elo, ehi] = h.edges();
  const double w = (static_cast<double>(ehi) - elo) / static_cast<double>(h.bins());
  const std::vector<float>& counts = h.counts();
  double err = 0.0;
  if (spec.qtype.is_integer()) {
    const Grid g = integer_grid(lo, hi, spec);
    for (int64_t k = 0; k < h.bins(); ++k) {
      if (counts[k] == 0.0f) continue;
      const double a = elo + static_cast<double>(k) * w;
      err += counts[k] / w * bin_sq_error(a, a + w, g);
    }
    return err;
  }
  // Float8: clipping at +-t plus relative rounding noise of one mantissa step (never below the
  // smallest normal's step once scaled).
  const double t = std::max(-std::min(lo, 0.0), std::max(hi, 0.0));
  const double step = std::ldexp(1.0, -spec.qtype.mantissa_bits);
  const double floor_mag = std::ldexp(1.0, 1 - spec.qtype.exponent_bias) * t / spec.qtype.max_finite;
  for (int64_t k = 0; k < h.bins(); ++k) {
    if (counts[k] == 0.0f) continue;
    const double a = elo + static_cast<double>(k) * w, b = a + w;
    double clip = 0.0;
    if (b > t) clip += (cube(b - t) - cube(std::max(a, t) - t)) / 3.0;
    if (a < -t) clip += (cube(std::min(b, -t) + t) - cube(a + t)) / 3.0;
    const double ia = std::clamp(a, -t, t), ib = std::clamp(b, -t, t);
    const double inside_sq = (cube(ib) - cube(ia)) / 3.0;  // integral of x^2 inside [-t, t]
    const double noise = (inside_sq + floor_mag * floor_mag * (ib - ia)) * step * step / 12.0;
    err += counts[k] / w * (clip + noise);
  }
  return err;
}

double histogram_second_moment(const Histogram& h) {
  QF_CHECK(!h.empty());
  const auto [elo, ehi] = h.edges();
  const double w = (static_cast<double>(ehi) - elo) / static_cast<double>(h.bins());
  const std::vector<float>& counts = h.counts();
  double m = 0.0;
  for (int64_t k = 0; k < h.bins(); ++k) {
    if (counts[k] == 0.0f) continue;
    const double a = elo + static_cast<double>(k) * w;
    m += counts[k] / w * (cube(a + w) - cube(a)) / 3.0;
  }
  return m;
}

namespace {
double expected_sq_error(const Histogram& h, double lo, double hi, const QSpec& spec) {
  return histogram_expected_sq_error(h, lo, hi, spec);
}
}  // namespace

std::pair<float, float> mse_range(const Histogram& h, const QSpec& spec) {
  QF_CHECK(!h.empty());
  if (h.min() == h.max()) return {h.min(), h.max()};
  const int64_t bins = h.bins();
  const double mn = h.min(), mx = h.max();
  if (spec.symmetric || spec.qtype.is_float()) {
    // Clip at +-t for t on `bins` steps up to max|x|; the range is then [-t, t] within [min, max].
    const double amax = std::max(std::fabs(mn), std::fabs(mx));
    auto t_at = [&](int64_t i) { return amax * static_cast<double>(i) / static_cast<double>(bins); };
    double best = 0.0;
    const int64_t bi = coarse_to_fine_argmin(bins, [&](int64_t i) {
      return expected_sq_error(h, std::max(mn, -t_at(i)), std::min(mx, t_at(i)), spec);
    }, &best);
    return symmetric_clip(h, static_cast<float>(t_at(bi)));
  }
  // Affine: lo on `bins` steps in [min, 0], hi on `bins` steps in [0, max], by coordinate
  // descent from the min/max range.
  auto lo_at = [&](int64_t i) { return std::min(mn, 0.0) * static_cast<double>(i) / static_cast<double>(bins); };
  auto hi_at = [&](int64_t j) { return std::max(mx, 0.0) * static_cast<double>(j) / static_cast<double>(bins); };
  int64_t bi = bins, bj = bins;
  double best = expected_sq_error(h, mn, mx, spec);
  for (int round = 0; round < kMseAffineRounds; ++round) {
    const int64_t prev_i = bi, prev_j = bj;
    double err = 0.0;
    const int64_t j = coarse_to_fine_argmin(bins, [&](int64_t jj) {
      return expected_sq_error(h, std::max(mn, lo_at(bi)), std::min(mx, hi_at(jj)), spec);
    }, &err);
    if (err < best) best = err, bj = j;
    const int64_t i = coarse_to_fine_argmin(bins, [&](int64_t ii) {
      return expected_sq_error(h, std::max(mn, lo_at(ii)), std::min(mx, hi_at(bj)), spec);
    }, &err);
    if (err < best) best = err, bi = i;
    if (bi == prev_i && bj == prev_j) break;
  }
  const float a = static_cast<float>(std::max(mn, lo_at(bi))), b = static_cast<float>(std::min(mx, hi_at(bj)));
  return {std::clamp(a, h.min(), h.max()), std::clamp(b, h.min(), h.max())};
}

std::pair<float, float> histogram_range(const Histogram& h, const QSpec& spec, HistogramMethod method,
                                        double percentile) {
  QF_CHECK(!h.empty());
  switch (method) {
    case HistogramMethod::kL2:
      // PyTorch: dst_nbins = 2 ** torch.iinfo(dtype).bits, whatever reduce_range says.
      return l2_range(h, int64_t{1} << spec.qtype.bits);
    case HistogramMethod::kEntropy: {
      // 2^(bits-1) levels on |x| (128 for int8); an unsigned grid over one-sided data uses all.
      const bool one_sided = !spec.qtype.is_signed && h.min() >= 0.0f;
      return entropy_range(h, int64_t{1} << (spec.qtype.bits - (one_sided ? 0 : 1)));
    }
    case HistogramMethod::kPercentile:
      return percentile_range(h, percentile, spec.symmetric || spec.qtype.is_float());
    case HistogramMethod::kMse:
      return mse_range(h, spec);
  }
  return {h.min(), h.max()};
}

}  // namespace qforge
