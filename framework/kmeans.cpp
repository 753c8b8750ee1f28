// k-means++ and Lloyd iterations (framework/kmeans.h).
#include "framework/kmeans.h"

#include <random>

#include "framework/core/error.h"

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

}  // namespace qforge
