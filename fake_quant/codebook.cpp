// Codebook fake quantisation (fake_quant/codebook.h).
#include "fake_quant/codebook.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "framework/core/error.h"

namespace qforge {
namespace {

// x viewed as rows that each use one codebook row: [R, n] values, [R, L] levels. Per channel the
// channel axis moves to the front; per group the rows are the groups; per tensor one row.
struct Rows {
  at::Tensor values;  // [R, n]
  at::Tensor levels;  // [R, L]
  int64_t axis = 0;   // per-channel axis (moved to the front), else 0
};

Rows rows_of(const at::Tensor& x, const QParams& qp) {
  const QSpec& spec = qp.spec;
  QF_REQUIRE(spec.qtype.is_codebook(), "codebook: ", spec.qtype.name, " is not a codebook qtype");
  QF_REQUIRE(qp.codebook.defined(), "codebook: the QParams hold no codebook");
  const std::vector<int64_t> want = codebook_shape(spec, x.sizes());
  QF_REQUIRE(qp.codebook.sizes() == at::IntArrayRef(want), "codebook: a ", spec.to_string(), " codebook for shape ",
             x.sizes(), " must have shape ", at::IntArrayRef(want), ", got ", qp.codebook.sizes());
  const int64_t L = spec.qtype.levels();
  Rows r;
  switch (spec.granularity) {
    case Granularity::kPerTensor: r.values = x.reshape({1, -1}); break;
    case Granularity::kPerChannel:
      r.axis = spec.axis < 0 ? spec.axis + x.dim() : spec.axis;
      r.values = x.movedim(r.axis, 0).reshape({x.size(r.axis), -1});
      break;
    case Granularity::kPerGroup: r.values = x.reshape({-1, spec.group_size}); break;
  }
  r.levels = qp.codebook.reshape({-1, L});
  return r;
}

// Back from [R, n] rows to x's shape.
at::Tensor unrows(const at::Tensor& rows, const at::Tensor& x, const QSpec& spec, int64_t axis) {
  if (spec.granularity != Granularity::kPerChannel) return rows.reshape(x.sizes());
  std::vector<int64_t> moved(x.sizes().begin(), x.sizes().end());
  moved.erase(moved.begin() + axis);
  moved.insert(moved.begin(), x.size(axis));
  return rows.reshape(moved).movedim(0, axis);
}

}  // namespace

at::Tensor codebook_assign(const at::Tensor& x_in, const QParams& qp) {
  QF_REQUIRE(x_in.defined() && at::isFloatingType(x_in.scalar_type()), "codebook_assign: needs a floating-point tensor");
  const at::Tensor x = x_in.detach().to(at::kCPU, at::kFloat);
  const Rows r = rows_of(x, qp);
  const at::Tensor values = r.values.contiguous();
  const at::Tensor levels = r.levels.detach().to(at::kCPU, at::kFloat).contiguous();
  const int64_t R = values.size(0), n = values.size(1), L = levels.size(1);
  at::Tensor codes = at::empty({R, n}, at::kByte);
  const float* pv = values.data_ptr<float>();
  const float* pl = levels.data_ptr<float>();
  uint8_t* pc = codes.data_ptr<uint8_t>();
  std::atomic<int64_t> first_bad{-1};
  at::parallel_for(0, R, std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
    std::vector<float> best(static_cast<size_t>(n));
    for (int64_t row = b; row < e; ++row) {
      const float* v = pv + row * n;
      const float* c = pl + row * L;
      uint8_t* out = pc + row * n;
      for (int64_t i = 0; i < n; ++i) {
        best[i] = std::fabs(v[i] - c[0]);
        out[i] = 0;
      }
      for (int64_t j = 1; j < L; ++j) {
        const float cj = c[j];
        for (int64_t i = 0; i < n; ++i) {
          const float d = std::fabs(v[i] - cj);
          const bool closer = d < best[i];
          best[i] = closer ? d : best[i];
          out[i] = closer ? static_cast<uint8_t>(j) : out[i];
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(v[i])) {
          int64_t expected = -1;
          first_bad.compare_exchange_strong(expected, row * n + i);
          break;
        }
      }
    }
  });
  if (first_bad.load() >= 0) {
    throw Error(detail::str_cat("codebook_assign: value ", pv[first_bad.load()], " at row ", first_bad.load() / n,
                                ", column ", first_bad.load() % n, " of the ", R, " x ", n,
                                " rows is not finite; cannot pick a level"));
  }
  return unrows(codes, x, qp.spec, r.axis).contiguous();
}

at::Tensor codebook_lookup(const at::Tensor& codes, const QParams& qp) {
  const Rows r = rows_of(codes, qp);
  const at::Tensor levels = r.levels.to(at::kFloat);
  const at::Tensor idx = r.values.to(levels.device(), at::kLong);
  QF_REQUIRE(idx.numel() == 0 || (idx.min().item<int64_t>() >= 0 && idx.max().item<int64_t>() < levels.size(1)),
             "codebook_lookup: codes must lie in [0, ", levels.size(1), ")");
  return unrows(levels.gather(1, idx), codes, qp.spec, r.axis);
}

at::Tensor fake_quantize_codebook(const at::Tensor& x, const QParams& qp) {
  if (x.numel() == 0) return x.clone();
  const at::Tensor codes = codebook_assign(x, qp).to(x.device());
  at::Tensor y = codebook_lookup(codes, qp).to(x.scalar_type());
  // Straight-through in x: the value is the level, the gradient passes to x unchanged.
  if (x.requires_grad()) y = y + (x - x.detach());
  return y;
}

}  // namespace qforge
