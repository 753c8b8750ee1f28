// Fake-quant kernels written once over a SIMD traits type and instantiated per ISA in
// fake_quantize_avx512.cpp / fake_quantize_avx2.cpp (each compiled with its own -m flags).
// Lane math is exactly fake_quant_math.h's: same operations in the same order, so results are
// bit-identical to the reference kernels; tails run the scalar formulas themselves.
#pragma once

#include <cstdint>

#include "fake_quant/fake_quantize_kernels.h"

namespace qforge::fq::simd {

// Elements before `p` reaches the vector alignment that non-temporal stores need.
template <class V>
int64_t head_to_alignment(const float* p, int64_t n) {
  const auto misalign = reinterpret_cast<uintptr_t>(p) % (V::kLanes * sizeof(float));
  const int64_t head = misalign ? static_cast<int64_t>((V::kLanes * sizeof(float) - misalign) / sizeof(float)) : 0;
  return head < n ? head : n;
}

// kStream: write y with non-temporal stores (for outputs far larger than the caches, where
// read-for-ownership traffic would otherwise cost as much as the write).
template <class V, bool kStream>
void affine_run(const float* x, float* y, bool* mask, int64_t n, const AffineGrid& g) {
  using F = typename V::F;
  const F inv = V::set1(g.inv_scale), sc = V::set1(g.scale), zp = V::set1(g.zero_point);
  const F qmin = V::set1(g.quant_min), qmax = V::set1(g.quant_max);
  int64_t i = kStream ? head_to_alignment<V>(y, n) : 0;
  for (int64_t j = 0; j < i; ++j) y[j] = fake_quantize_value(x[j], g, mask ? mask + j : nullptr);
  for (; i + V::kLanes <= n; i += V::kLanes) {
    const F q = V::add(V::round(V::mul(V::load(x + i), inv)), zp);
    if (mask) V::store_mask(mask + i, V::and_(V::ge(q, qmin), V::le(q, qmax)));
    // max(q, qmin) returns qmin for NaN q (second operand), as clamp_q does.
    const F out = V::mul(V::sub(V::min(V::max(q, qmin), qmax), zp), sc);
    if (kStream) V::stream(y + i, out); else V::store(y + i, out);
  }
  for (; i < n; ++i) y[i] = fake_quantize_value(x[i], g, mask ? mask + i : nullptr);
  if (kStream) V::fence();
}

template <class V>
void affine_rows(const float* x, float* y, bool* mask, int64_t rows, int64_t C, const float* scale,
                 const float* inv_scale, const float* zero_point, float qmin_f, float qmax_f) {
  using F = typename V::F;
  const F qmin = V::set1(qmin_f), qmax = V::set1(qmax_f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    bool* mr = mask ? mask + r * C : nullptr;
    int64_t c = 0;
    for (; c + V::kLanes <= C; c += V::kLanes) {
      const F zp = V::load(zero_point + c);
      const F q = V::add(V::round(V::mul(V::load(xr + c), V::load(inv_scale + c))), zp);
      if (mr) V::store_mask(mr + c, V::and_(V::ge(q, qmin), V::le(q, qmax)));
      V::store(yr + c, V::mul(V::sub(V::min(V::max(q, qmin), qmax), zp), V::load(scale + c)));
    }
    for (; c < C; ++c) {
      const AffineGrid g{scale[c], inv_scale[c], zero_point[c], qmin_f, qmax_f};
      yr[c] = fake_quantize_value(xr[c], g, mr ? mr + c : nullptr);
    }
  }
}

template <class V, bool kStream>
void mask_grad(const float* dy, const bool* mask, float* dx, int64_t n) {
  int64_t i = kStream ? head_to_alignment<V>(dx, n) : 0;
  for (int64_t j = 0; j < i; ++j) dx[j] = mask[j] ? dy[j] : 0.0f;
  for (; i + V::kLanes <= n; i += V::kLanes) {
    const typename V::F out = V::select(V::load_mask(mask + i), V::load(dy + i), V::set1(0.0f));
    if (kStream) V::stream(dx + i, out); else V::store(dx + i, out);
  }
  for (; i < n; ++i) dx[i] = mask[i] ? dy[i] : 0.0f;
  if (kStream) V::fence();
}

template <class V>
LsqSums lsq_run(const float* x, const float* dy, float* dx, int64_t n, const LsqGrid& g) {
  using F = typename V::F;
  // Float lanes are flushed to double every kFlush vectors, bounding float rounding growth.
  constexpr int kFlush = 64;
  const F inv = V::set1(g.inv_scale), sc = V::set1(g.scale), zp = V::set1(g.zero_point);
  const F qmin = V::set1(g.quant_min), qmax = V::set1(g.quant_max), gf = V::set1(g.grad_factor);
  const F small = V::set1(g.quant_min - g.zero_point), big = V::set1(g.quant_max - g.zero_point);
  const F neg_scale = V::set1(-1.0f), zero = V::set1(0.0f);
  LsqSums sums;
  F acc_s = zero, acc_z = zero;
  int64_t i = 0;
  int pending = 0;
  for (; i + V::kLanes <= n; i += V::kLanes) {
    const F xv = V::load(x + i), g_out = V::load(dy + i);
    const F q = V::round(V::add(zp, V::mul(xv, inv)));
    const auto lo = V::lt(q, qmin), hi = V::gt(q, qmax);
    const auto out = V::or_(lo, hi);
    V::store(dx + i, V::select(out, zero, g_out));
    const F dz = V::mul(V::mul(V::mul(g_out, neg_scale), sc), gf);
    const F ds_out = V::mul(V::mul(g_out, V::select(lo, small, big)), gf);
    const F xfq = V::mul(V::sub(q, zp), sc);
    const F ds_in = V::mul(V::mul(V::mul(g_out, V::sub(xfq, xv)), inv), gf);
    acc_s = V::add(acc_s, V::select(out, ds_out, ds_in));
    acc_z = V::add(acc_z, V::select(out, dz, zero));
    if (++pending == kFlush) {
      sums.dscale += V::sum_double(acc_s);
      sums.dzero_point += V::sum_double(acc_z);
      acc_s = acc_z = zero;
      pending = 0;
    }
  }
  sums.dscale += V::sum_double(acc_s);
  sums.dzero_point += V::sum_double(acc_z);
  if (i < n) {
    const LsqSums tail = lsq_run_reference(x + i, dy + i, dx + i, n - i, g);
    sums.dscale += tail.dscale;
    sums.dzero_point += tail.dzero_point;
  }
  return sums;
}

}  // namespace qforge::fq::simd
