// GPTQ: blocked column updates (float32) and the unblocked float64 oracle, one implementation.
#include "framework/ptq/gptq.h"

#include <ATen/ATen.h>

#include <cmath>
#include <optional>
#include <vector>

#include "fake_quant/fake_quantize.h"
#include "framework/core/error.h"
#include "framework/api/quantizer.h"
#include "framework/ptq/awq.h"
#include "framework/ptq/imatrix.h"

namespace qforge::ptq {

namespace {

using at::indexing::Slice;

// Times the damping may be raised ×10 when H + λI is not positive definite in floating point.
constexpr int kDampRetries = 6;

// One column's grid: the layer spec as per-channel over the N rows.
QSpec column_spec(const QSpec& spec) {
  QSpec c = spec;
  c.granularity = Granularity::kPerChannel;
  c.axis = 0;
  c.group_size = 0;
  return c;
}

void check_inputs(const at::Tensor& w, const at::Tensor& h, const QSpec& spec, const GptqOptions& o) {
  QF_REQUIRE(w.defined() && w.dim() == 2 && w.numel() > 0, "gptq: weight must be a non-empty [N, K] matrix, got ",
             w.defined() ? w.sizes() : at::IntArrayRef{});
  const int64_t K = w.size(1);
  QF_REQUIRE(h.defined() && h.dim() == 2 && h.size(0) == K && h.size(1) == K, "gptq: Hessian must be [", K, ", ", K,
             "], got ", h.defined() ? h.sizes() : at::IntArrayRef{});
  QF_REQUIRE(at::isfinite(w).all().item<bool>(), "gptq: weight holds NaN or inf");
  QF_REQUIRE(at::isfinite(h).all().item<bool>(), "gptq: Hessian holds NaN or inf (calibration inputs with NaN/inf?)");
  QF_REQUIRE(o.damp > 0 && std::isfinite(o.damp), "gptq: damp must be > 0, got ", o.damp);
  QF_REQUIRE(o.block_size > 0, "gptq: block_size must be > 0, got ", o.block_size);
  QF_REQUIRE(!o.column_importance.defined() ||
                 (o.column_importance.numel() == K && at::isfinite(o.column_importance).all().item<bool>()),
             "gptq: column_importance must hold ", K, " finite values");
  if (o.clip_importance.defined()) {
    QF_REQUIRE(o.clip_importance.numel() == K && at::isfinite(o.clip_importance).all().item<bool>() &&
                   (o.clip_importance >= 0).all().item<bool>(),
               "gptq: clip_importance must hold ", K, " finite values >= 0");
    QF_REQUIRE(spec.qtype.is_integer() && spec.granularity != Granularity::kPerTensor,
               "gptq: the grid search (clip_importance) needs a per-channel or per-group integer grid, got ",
               spec.qtype.name, spec.granularity == Granularity::kPerTensor ? " per tensor" : "");
  }
  QF_REQUIRE(spec.granularity != Granularity::kPerChannel || spec.axis == 0,
             "gptq: per-channel grids must be along the rows (axis 0) of the [N, K] view, got axis ", spec.axis);
  QF_REQUIRE(spec.granularity != Granularity::kPerGroup || (spec.group_size > 0 && K % spec.group_size == 0),
             "gptq: K = ", K, " is not a multiple of group_size ", spec.group_size);
}

// The min/max grid of w [N, k] in `spec`, of w clamped to its imatrix-searched ranges when `imp`
// ([k]) is defined (σ_n² from row_sq [N, 1]).
QParams grid_of(const at::Tensor& w, const QSpec& spec, const at::Tensor& imp, const at::Tensor& row_sq) {
  const at::Tensor w32 = w.to(at::kFloat);
  if (!imp.defined()) return weight_minmax_qparams(w32, spec, "gptq");
  const at::Tensor ratio = imatrix_search_clip(w32, spec, imp, row_sq);
  return weight_minmax_qparams(awq_apply_clip(w32, ratio, spec), spec, "gptq");
}

// The grid of each column, as the solver reaches it.
class ColumnGrids {
 public:
  // clip_imp: GptqOptions::clip_importance in the original column order, or undefined.
  ColumnGrids(const at::Tensor& w, const QSpec& spec, bool act_order, const at::Tensor& perm, const at::Tensor& clip_imp)
      : spec_(spec), col_spec_(column_spec(spec)), N_(w.size(0)), perm_(perm), clip_imp_(clip_imp) {
    lazy_ = spec.granularity == Granularity::kPerGroup && !act_order;
    // σ_n² of the searched weights: the starting row's mean square, for every group of the row.
    if (clip_imp_.defined()) row_sq_ = w.to(at::kFloat).pow(2).mean(1, true);
    if (!lazy_) whole_ = grid_of(w, spec, clip_imp_, row_sq_);
    if (lazy_) groups_.resize(static_cast<size_t>(w.size(1) / spec.group_size));
  }
  bool lazy() const { return lazy_; }
  int64_t group_size() const { return spec_.group_size; }
  // Lazy per-group grids (original column order): the group starting at column j from its
  // current values [N, g].
  void start_group(int64_t j, const at::Tensor& current) {
    const at::Tensor imp = clip_imp_.defined() ? clip_imp_.slice(0, j, j + spec_.group_size) : at::Tensor();
    groups_[static_cast<size_t>(j / spec_.group_size)] = grid_of(current, col_spec_, imp, row_sq_);
  }
  // fake_quantize of the column at solver position j (the original column perm[j]).
  at::Tensor quantize(const at::Tensor& col, int64_t j) const {
    const int64_t orig = perm_.defined() ? perm_[j].item<int64_t>() : j;
    at::Tensor s, z;
    switch (spec_.granularity) {
      case Granularity::kPerTensor:
        s = whole_.scale.expand({N_});
        z = whole_.zero_point.expand({N_});
        break;
      case Granularity::kPerChannel:
        s = whole_.scale;
        z = whole_.zero_point;
        break;
      case Granularity::kPerGroup: {
        const int64_t g = orig / spec_.group_size;
        if (lazy_) {
          s = groups_[static_cast<size_t>(g)].scale;
          z = groups_[static_cast<size_t>(g)].zero_point;
        } else {
          s = whole_.scale.select(1, g);
          z = whole_.zero_point.select(1, g);
        }
        break;
      }
    }
    const QParams qp{col_spec_, s.contiguous(), z.contiguous()};
    return fake_quantize(col.to(at::kFloat).unsqueeze(1).contiguous(), qp).squeeze(1).to(col.scalar_type());
  }
  QParams result() const {
    if (!lazy_) return whole_;
    std::vector<at::Tensor> s, z;
    for (const QParams& q : groups_) {
      s.push_back(q.scale);
      z.push_back(q.zero_point);
    }
    return QParams{spec_, at::stack(s, 1).contiguous(), at::stack(z, 1).contiguous()};
  }

 private:
  QSpec spec_, col_spec_;
  int64_t N_;
  at::Tensor perm_, clip_imp_, row_sq_;
  bool lazy_ = false;
  QParams whole_;
  std::vector<QParams> groups_;
};

// Dead inputs (diag 0) get H_jj = 1 and zero weights; act_order permutes; damping until the
// Cholesky factorisations succeed. Returns U, the upper Cholesky factor of H⁻¹.
at::Tensor inverse_factor(at::Tensor H, double damp, double* damp_used) {
  const at::Tensor diag = H.diagonal();
  const double mean_diag = diag.mean().item<double>();
  const at::Tensor eye = at::eye(H.size(0), H.options());
  for (int attempt = 0; attempt <= kDampRetries; ++attempt) {
    const at::Tensor Hd = H + eye * (damp * mean_diag);
    const auto [L, info] = at::linalg_cholesky_ex(Hd);
    if (info.item<int64_t>() == 0) {
      const at::Tensor Hinv = at::cholesky_inverse(L);
      const auto [U, info2] = at::linalg_cholesky_ex(Hinv, /*upper=*/true);
      if (info2.item<int64_t>() == 0) {
        *damp_used = damp;
        return U;
      }
    }
    damp *= 10;
  }
  throw Error("gptq: the Hessian stays singular after raising the damping to " + std::to_string(damp / 10) +
              " · mean(diag H); the calibration inputs may be degenerate");
}

// What both of a layer's solves share (the searched and the min/max grids): the weight with dead
// columns zeroed in the original order, the column order, and U in the solver's order.
struct Prepared {
  at::Tensor W, perm, invperm, U;
  double damp = 0;
};

Prepared prepare(const at::Tensor& w_in, const at::Tensor& h_in, const GptqOptions& o, at::ScalarType dt) {
  Prepared p;
  p.W = w_in.detach().to(dt).clone();
  at::Tensor H = h_in.detach().to(dt).clone();
  const at::Tensor dead = H.diagonal() == 0;
  H.diagonal().masked_fill_(dead, 1.0);
  p.W.index_put_({Slice(), dead}, 0.0);
  if (o.act_order) {
    const at::Tensor& order = o.column_importance.defined() ? o.column_importance : H.diagonal();
    p.perm = at::argsort(order.to(dt), /*dim=*/0, /*descending=*/true);
    p.invperm = at::argsort(p.perm);
    H = H.index_select(0, p.perm).index_select(1, p.perm);
  }
  p.U = inverse_factor(H, o.damp, &p.damp);
  return p;
}

// One solve on prepared inputs; clip_imp: the grid search's importance (original column order)
// or undefined for min/max grids.
GptqResult run(const Prepared& p, const QSpec& spec, const GptqOptions& o, const at::Tensor& clip_imp, bool blocked) {
  at::NoGradGuard no_grad;
  const int64_t N = p.W.size(0), K = p.W.size(1);
  const at::Tensor& perm = p.perm;
  const at::Tensor& U = p.U;
  // Grids from the weight as the solver starts (dead columns zeroed, original column order); the
  // searched ones weigh by σ_n² of the whole starting row.
  ColumnGrids grids(p.W, spec, o.act_order, perm, clip_imp);
  at::Tensor W = o.act_order ? p.W.index_select(1, perm) : p.W.clone();
  GptqResult r;
  r.damp = p.damp;
  const int64_t g = grids.group_size();

  if (!blocked) {
    for (int64_t j = 0; j < K; ++j) {
      if (grids.lazy() && j % g == 0) grids.start_group(j, W.index({Slice(), Slice(j, j + g)}));
      const at::Tensor w = W.select(1, j).clone();
      const at::Tensor q = grids.quantize(w, j);
      const at::Tensor err = (w - q) / U[j][j];
      if (j + 1 < K) W.index({Slice(), Slice(j + 1, K)}).sub_(at::outer(err, U[j].index({Slice(j + 1, K)})));
      W.select(1, j).copy_(q);
    }
  } else {
    const int64_t B = o.block_size;
    for (int64_t i1 = 0; i1 < K; i1 += B) {
      const int64_t i2 = std::min(i1 + B, K), cnt = i2 - i1;
      at::Tensor W1 = W.index({Slice(), Slice(i1, i2)}).clone();
      at::Tensor Err1 = at::zeros_like(W1);
      const at::Tensor U1 = U.index({Slice(i1, i2), Slice(i1, i2)});
      for (int64_t i = 0; i < cnt; ++i) {
        const int64_t j = i1 + i;
        if (grids.lazy() && j % g == 0) {
          // The group's current values: in-block columns from W1, later ones from W with this
          // block's pending updates applied.
          const int64_t end = std::min(j + g, i2);
          at::Tensor cur = W1.index({Slice(), Slice(i, end - i1)});
          if (j + g > i2) {
            const at::Tensor later = W.index({Slice(), Slice(i2, j + g)}) -
                                     at::matmul(Err1, U.index({Slice(i1, i2), Slice(i2, j + g)}));
            cur = at::cat({cur, later}, 1);
          }
          grids.start_group(j, cur);
        }
        const at::Tensor w = W1.select(1, i).clone();
        const at::Tensor q = grids.quantize(w, j);
        const at::Tensor err = (w - q) / U1[i][i];
        W1.index({Slice(), Slice(i, cnt)}).sub_(at::outer(err, U1[i].index({Slice(i, cnt)})));
        W1.select(1, i).copy_(q);
        Err1.select(1, i).copy_(err);
      }
      W.index({Slice(), Slice(i1, i2)}).copy_(W1);
      if (i2 < K) W.index({Slice(), Slice(i2, K)}).sub_(at::matmul(Err1, U.index({Slice(i1, i2), Slice(i2, K)})));
    }
  }
  if (o.act_order) W = W.index_select(1, p.invperm);
  r.weight = W.to(at::kFloat).contiguous();
  r.qparams = grids.result();
  QF_CHECK(r.weight.size(0) == N && r.weight.size(1) == K, "gptq result shape");
  return r;
}

// tr(ΔHΔᵀ) with Δ = w − wq, in h's type.
double h_error(const at::Tensor& w, const at::Tensor& wq, const at::Tensor& h) {
  const at::Tensor d = w.to(h.scalar_type()) - wq.to(h.scalar_type());
  return (at::matmul(d, h) * d).sum().item<double>();
}

// One solve, or with clip_importance the better of the searched and the min/max grids.
GptqResult solve(const at::Tensor& w, const at::Tensor& h, const QSpec& spec, const GptqOptions& o, at::ScalarType dt,
                 bool blocked) {
  check_inputs(w, h, spec, o);
  at::NoGradGuard no_grad;
  const Prepared p = prepare(w, h, o, dt);
  if (!o.clip_importance.defined()) return run(p, spec, o, at::Tensor(), blocked);
  GptqResult r = run(p, spec, o, o.clip_importance.to(at::kFloat), blocked);
  GptqResult m = run(p, spec, o, at::Tensor(), blocked);
  const at::Tensor hd = h.detach().to(dt);
  const double den = h_error(w, at::zeros_like(w), hd);
  r.error = den > 0 ? h_error(w, r.weight, hd) / den : 0.0;
  m.error = den > 0 ? h_error(w, m.weight, hd) / den : 0.0;
  if (r.error <= m.error) {
    r.grids_searched = true;
    r.error_other = m.error;
    return r;
  }
  m.error_other = r.error;
  return m;
}

}  // namespace

GptqResult gptq(const at::Tensor& w, const at::Tensor& h, const QSpec& spec, const GptqOptions& options) {
  return solve(w, h, spec, options, at::kFloat, /*blocked=*/true);
}

GptqResult gptq_reference(const at::Tensor& w, const at::Tensor& h, const QSpec& spec, const GptqOptions& options) {
  return solve(w, h, spec, options, at::kDouble, /*blocked=*/false);
}

}  // namespace qforge::ptq
