// k-means on rows of a float matrix: k-means++ seeding (Arthur & Vassilvitskii 2007) from a seeded
// generator, then Lloyd iterations; an emptied cluster is re-seeded with the point farthest from
// its centroid. The codebook formats build their codebooks with it: RPQ layers (docs/rpq.md) on
// sub-vectors, the k-means weight qtypes (qkmeans4/3/2, docs/numerics.md) with kmeans_1d.
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

// Weighted k-means of many independent sets of scalars: row r of `values` [R, n] is clustered into
// k levels, value (r, i) counting with weight importance[r, i] (importance [R, n], or [n] shared by
// every row, every entry finite and >= 0, not all 0 in a row; undefined: all 1). It minimises
//   sum_i importance[r, i] * (values[r, i] - level[r, a(i)])^2.
// Seeding: weighted k-means++ (first level drawn with probability ~ importance, each next one
// ~ importance * squared distance to the nearest level so far) from a generator seeded with
// options.seed + r. Then Lloyd iterations, exact in 1-D: on the sorted row every cluster is an
// interval between midpoints of consecutive levels (a value on a midpoint joins the lower level),
// each level becomes its interval's weighted mean (float64 prefix sums), and an emptied level is
// re-seeded with the value of largest weighted squared error. Stops when no interval changes or
// after options.iterations. Returns the levels [R, k] float32 in ascending order; a row with fewer
// than k distinct values repeats its levels. Rows run in parallel; the result does not depend on
// the thread count. Throws qforge::Error on NaN/inf values, bad importance, k < 1 or an empty row.
at::Tensor kmeans_1d(const at::Tensor& values, int64_t k, const at::Tensor& importance = {},
                     const KMeansOptions& options = {});

// Index of the nearest of `centroids` [k, D] for each row of `points` [N, D] (ties: the lowest
// index), as int64 [N]; `sq_dist` (optional) receives the squared distances [N].
at::Tensor nearest_centroid(const at::Tensor& points, const at::Tensor& centroids, at::Tensor* sq_dist = nullptr);

}  // namespace qforge
