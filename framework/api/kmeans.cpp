// k-means++ and Lloyd iterations (framework/api/kmeans.h).
#include "framework/api/kmeans.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/parallel_blocks.h"

namespace qforge {

at::Tensor nearest_centroid(const at::Tensor& points, const at::Tensor& centroids, at::Tensor* sq_dist) {
  // |p - c|^2 = |p|^2 - 2 p.c + |c|^2, in float64 so that near-ties resolve as the exact distances do.
  const at::Tensor p = points.to(at::kDouble), c = centroids.to(at::kDouble);
  const at::Tensor d = (p * p).sum(1, true) - 2.0 * p.matmul(c.t()) + (c * c).sum(1).unsqueeze(0);
  auto [mn, idx] = d.min(1);
  if (sq_dist) *sq_dist = mn.clamp_min(0.0);
  return idx;
}

KMeansResult kmeans(const at::Tensor& points_in, int64_t k, const KMeansOptions& options) {
  QF_REQUIRE(k >= 1, "kmeans: k must be at least 1, got ", k);
  QF_REQUIRE(options.iterations >= 1, "kmeans: iterations must be at least 1, got ", options.iterations);
  QF_REQUIRE(points_in.defined() && points_in.dim() == 2 && points_in.size(0) > 0 && points_in.size(1) > 0,
             "kmeans: points must be a non-empty [N, D] matrix, got ",
             points_in.defined() ? points_in.sizes() : at::IntArrayRef{});
  const at::Tensor points = points_in.detach().to(at::kFloat).contiguous();
  QF_REQUIRE(at::isfinite(points).all().item<bool>(), "kmeans: points hold NaN or inf");
  const int64_t N = points.size(0), D = points.size(1);
  KMeansResult r;
  if (N <= k) {
    r.centroids = at::cat({points, points[N - 1].unsqueeze(0).expand({k - N, D})}).contiguous();
    r.assignment = at::arange(N, at::kLong);
    return r;
  }
  // k-means++: the first centroid uniformly, each next one with probability proportional to the
  // squared distance to the nearest centroid chosen so far.
  std::mt19937_64 rng(options.seed);
  std::vector<int64_t> chosen{static_cast<int64_t>(std::uniform_int_distribution<int64_t>(0, N - 1)(rng))};
  at::Tensor best = (points - points[chosen[0]]).pow(2).sum(1).to(at::kDouble);
  for (int64_t j = 1; j < k; ++j) {
    const double total = best.sum().item<double>();
    int64_t pick = 0;
    if (total <= 0.0) {
      pick = std::uniform_int_distribution<int64_t>(0, N - 1)(rng);  // every point already a centroid
    } else {
      const double u = std::uniform_real_distribution<double>(0.0, total)(rng);
      const at::Tensor cum = best.cumsum(0);
      pick = std::min<int64_t>(N - 1, at::searchsorted(cum, at::full({1}, u, at::kDouble), /*out_int32=*/false,
                                                       /*right=*/true).item<int64_t>());
    }
    chosen.push_back(pick);
    best = at::minimum(best, (points - points[pick]).pow(2).sum(1).to(at::kDouble));
  }
  at::Tensor centroids = points.index_select(0, at::tensor(chosen, at::kLong)).clone();
  at::Tensor assign, dist;
  for (r.iterations = 0; r.iterations < options.iterations; ++r.iterations) {
    const at::Tensor next = nearest_centroid(points, centroids, &dist);
    if (assign.defined() && at::equal(next, assign)) break;
    assign = next;
    // Means of the assigned points (float64 sums).
    at::Tensor sums = at::zeros({k, D}, at::kDouble).index_add_(0, assign, points.to(at::kDouble));
    at::Tensor counts = at::zeros({k}, at::kDouble).index_add_(0, assign, at::ones({N}, at::kDouble));
    const at::Tensor empty = counts == 0;
    centroids = (sums / counts.clamp_min(1.0).unsqueeze(1)).to(at::kFloat);
    if (empty.any().item<bool>()) {
      // Re-seed each empty cluster with the point farthest from its centroid (then not reused).
      at::Tensor far = dist.clone();
      const at::Tensor ids = at::nonzero(empty).flatten().contiguous();
      for (int64_t i = 0; i < ids.numel(); ++i) {
        const int64_t p = far.argmax().item<int64_t>();
        centroids[ids[i].item<int64_t>()].copy_(points[p]);
        far[p] = -1.0;
      }
    }
  }
  // Converged: the centroids are the means of this assignment and it is their nearest one (a
  // Lloyd fixed point). Stopped by the iteration cap: the nearest assignment of the last centroids.
  r.assignment = nearest_centroid(points, centroids, &dist);
  r.centroids = centroids.contiguous();
  r.sse = (points.to(at::kDouble) - r.centroids.to(at::kDouble).index_select(0, r.assignment)).pow(2).sum().item<double>();
  return r;
}

namespace {

// One row of kmeans_1d: v sorted ascending with weights w (same order), k levels out.
void kmeans_1d_row(const std::vector<float>& v, const std::vector<double>& w, int64_t k, int64_t iterations,
                   uint64_t seed, float* out) {
  const int64_t n = static_cast<int64_t>(v.size());
  // Prefix sums over the sorted row: W[i] = sum_{j<i} w, S[i] = sum_{j<i} w v.
  std::vector<double> W(n + 1, 0.0), S(n + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    W[i + 1] = W[i] + w[i];
    S[i + 1] = S[i] + w[i] * static_cast<double>(v[i]);
  }
  std::mt19937_64 rng(seed);
  // Draws an index with probability proportional to p (all >= 0, sum > 0).
  auto draw = [&](const std::vector<double>& p) {
    const double total = std::accumulate(p.begin(), p.end(), 0.0);
    double u = std::uniform_real_distribution<double>(0.0, total)(rng);
    for (int64_t i = 0; i < n; ++i) {
      if (u < p[i]) return i;
      u -= p[i];
    }
    for (int64_t i = n - 1; i >= 0; --i)
      if (p[i] > 0.0) return i;
    return n - 1;
  };
  std::vector<double> levels;
  levels.push_back(v[draw(w)]);
  std::vector<double> best(n), p(n);
  for (int64_t i = 0; i < n; ++i) best[i] = (v[i] - levels[0]) * (v[i] - levels[0]);
  for (int64_t j = 1; j < k; ++j) {
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) total += (p[i] = w[i] * best[i]);
    // Every weighted value already sits on a level: repeat the last one.
    const double next = total > 0.0 ? static_cast<double>(v[draw(p)]) : levels.back();
    levels.push_back(next);
    for (int64_t i = 0; i < n; ++i) best[i] = std::min(best[i], (v[i] - next) * (v[i] - next));
  }
  std::sort(levels.begin(), levels.end());
  // Lloyd: cluster j holds the sorted values in (mid_{j-1}, mid_j].
  std::vector<int64_t> ends(k, -1), prev;
  for (int64_t it = 0; it < iterations; ++it) {
    for (int64_t j = 0; j < k; ++j) {
      if (j == k - 1) {
        ends[j] = n;
      } else {
        const double mid = 0.5 * (levels[j] + levels[j + 1]);
        ends[j] = std::upper_bound(v.begin(), v.end(), mid, [](double m, float x) { return m < x; }) - v.begin();
      }
    }
    if (ends == prev) break;
    prev = ends;
    int64_t begin = 0;
    std::vector<int64_t> empty;
    for (int64_t j = 0; j < k; ++j) {
      const double wsum = W[ends[j]] - W[begin];
      if (ends[j] > begin && wsum > 0.0) levels[j] = (S[ends[j]] - S[begin]) / wsum;
      else empty.push_back(j);
      begin = std::max(begin, ends[j]);
    }
    // Re-seed each emptied level with the value of largest weighted squared error.
    for (int64_t j : empty) {
      int64_t far = -1;
      double err = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        double d = std::numeric_limits<double>::infinity();
        for (double l : levels) d = std::min(d, (v[i] - l) * (v[i] - l));
        if (w[i] * d > err) {
          err = w[i] * d;
          far = i;
        }
      }
      if (far >= 0) levels[j] = v[far];
    }
    std::sort(levels.begin(), levels.end());
  }
  for (int64_t j = 0; j < k; ++j) out[j] = static_cast<float>(levels[j]);
}

}  // namespace

at::Tensor kmeans_1d(const at::Tensor& values_in, int64_t k, const at::Tensor& importance_in,
                     const KMeansOptions& options) {
  QF_REQUIRE(k >= 1, "kmeans_1d: k must be at least 1, got ", k);
  QF_REQUIRE(options.iterations >= 1, "kmeans_1d: iterations must be at least 1, got ", options.iterations);
  QF_REQUIRE(values_in.defined() && values_in.dim() == 2 && values_in.size(0) > 0 && values_in.size(1) > 0,
             "kmeans_1d: values must be a non-empty [R, n] matrix, got ",
             values_in.defined() ? values_in.sizes() : at::IntArrayRef{});
  const at::Tensor values = values_in.detach().to(at::kCPU, at::kFloat).contiguous();
  QF_REQUIRE(at::isfinite(values).all().item<bool>(), "kmeans_1d: values hold NaN or inf");
  const int64_t R = values.size(0), n = values.size(1);
  at::Tensor imp;
  if (importance_in.defined()) {
    QF_REQUIRE((importance_in.dim() == 1 && importance_in.size(0) == n) ||
                   (importance_in.dim() == 2 && importance_in.size(0) == R && importance_in.size(1) == n),
               "kmeans_1d: importance must be [", n, "] or [", R, ", ", n, "], got ", importance_in.sizes());
    imp = importance_in.detach().to(at::kCPU, at::kDouble).expand({R, n}).contiguous();
    QF_REQUIRE(at::isfinite(imp).all().item<bool>() && (imp >= 0).all().item<bool>(),
               "kmeans_1d: importance must be finite and >= 0");
    QF_REQUIRE((imp.sum(1) > 0).all().item<bool>(), "kmeans_1d: a row's importance is all 0");
  }
  at::Tensor out = at::empty({R, k}, at::kFloat);
  const float* pv = values.data_ptr<float>();
  const double* pw = imp.defined() ? imp.data_ptr<double>() : nullptr;
  float* po = out.data_ptr<float>();
  kernels::detail::parallel_over(R, 1, [&](int64_t b, int64_t e) {
    std::vector<int64_t> order(n);
    std::vector<float> v(n);
    std::vector<double> w(n);
    for (int64_t r = b; r < e; ++r) {
      const float* row = pv + r * n;
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [row](int64_t a, int64_t c) { return row[a] < row[c]; });
      for (int64_t i = 0; i < n; ++i) {
        v[i] = row[order[i]];
        w[i] = pw ? pw[r * n + order[i]] : 1.0;
      }
      kmeans_1d_row(v, w, k, options.iterations, options.seed + static_cast<uint64_t>(r), po + r * k);
    }
  });
  return out;
}

}  // namespace qforge
