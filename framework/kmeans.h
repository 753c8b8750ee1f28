// k-means on rows of a float matrix: k-means++ seeding (Arthur & Vassilvitskii 2007) from a seeded
// generator, then Lloyd iterations; an emptied cluster is re-seeded with the point farthest from
// its centroid. The codebook formats (RPQ layers, docs/rpq.md) build their codebooks with it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace qforge {

struct KMeansOptions {
  int64_t iterations = 25;   // Lloyd iterations at most (stops early once no assignment changes)
  uint64_t seed = 0;         // k-means++ draws; the same seed and data give the same result
};

struct KMeansResult {
  at::Tensor centroids;    // [k, D] float32
  at::Tensor assignment;   // [N] int64: index of each point's nearest centroid
  double sse = 0.0;        // sum over points of |point - centroid|^2 (float64 accumulation)
  int64_t iterations = 0;  // Lloyd iterations run
};

// Clusters the N rows of `points` [N, D] into k centroids. With N <= k every point is its own
// centroid (SSE 0) and the remaining k - N centroids repeat the last point. Throws qforge::Error
// for empty or non-finite input or k < 1.
KMeansResult kmeans(const at::Tensor& points, int64_t k, const KMeansOptions& options = {});

// Index of the nearest of `centroids` [k, D] for each row of `points` [N, D] (ties: the lowest
// index), as int64 [N]; `sq_dist` (optional) receives the squared distances [N].
at::Tensor nearest_centroid(const at::Tensor& points, const at::Tensor& centroids, at::Tensor* sq_dist = nullptr);

}  // namespace qforge
