// Helpers shared by the observer tests: QSpecs from golden keys, seeded data, fake-quant MSE.
#pragma once

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <string>

#include "framework/core/qparams.h"
#include "observers/observer.h"

namespace qforge::obs_testing {

// "qint8/affine", "quint8/symmetric" -> QSpec with the given granularity and axis.
inline QSpec spec_from_key(const std::string& key, Granularity g = Granularity::kPerTensor, int64_t axis = 0) {
  QSpec s;
  const auto slash = key.find('/');
  s.qtype = qtype_from_name(key.substr(0, slash));
  s.symmetric = key.substr(slash + 1) == "symmetric";
  s.granularity = g;
  s.axis = axis;
  return s;
}

inline QSpec per_tensor(QType qt, bool symmetric) {
  QSpec s;
  s.qtype = qt;
  s.symmetric = symmetric;
  return s;
}

// Seeded CPU generator data so tests are reproducible.
inline at::Tensor randn(at::IntArrayRef shape, uint64_t seed) {
  at::manual_seed(seed);
  return at::randn(shape, at::kFloat);
}

// Heavy-tailed data: 0.5 * Cauchy, a few huge outliers around a narrow core.
inline at::Tensor heavy_tailed(int64_t n, uint64_t seed) {
  at::manual_seed(seed);
  return at::empty({n}, at::kFloat).cauchy_(0.0, 0.5);
}

// Student-t with 3 degrees of freedom: heavy tails with finite variance, where clipping pays.
inline at::Tensor student_t3(int64_t n, uint64_t seed) {
  at::manual_seed(seed);
  const at::Tensor z = at::randn({n});
  const at::Tensor chi2 = at::randn({3, n}).pow(2).sum(0);
  return z / (chi2 / 3.0).sqrt();
}

// Mean squared error of fake-quantizing x with `qp` (per-tensor).
inline double fake_quant_mse(const at::Tensor& x, const QParams& qp) {
  const at::Tensor fq = at::fake_quantize_per_tensor_affine(
      x, qp.scale.item<double>(), qp.zero_point.item<int64_t>(), qp.spec.quant_min(), qp.spec.quant_max());
  return (fq - x).pow(2).mean().item<double>();
}

// Sizes that break kernels: 1-10, multiples of 16, powers of two +-1.
inline std::vector<int64_t> sweep_sizes() {
  std::vector<int64_t> v;
  for (int64_t n = 1; n <= 10; ++n) v.push_back(n);
  for (int64_t n : {16, 32, 48, 64, 96, 4096}) v.push_back(n);
  for (int64_t p : {32, 128, 1024, 65536}) {
    v.push_back(p - 1);
    v.push_back(p + 1);
  }
  return v;
}

}  // namespace qforge::obs_testing
