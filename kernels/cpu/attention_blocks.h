// The decode attention's loop over one group, written once for every ISA entry of attention_f32
// and attention_kv_codes_f32 (token_ops.h): the cached rows any query row sees, in blocks of 16
// (a quantized cache dequantizes a block once for every grouped query row), each query row taking
// the part [a, b) of a block it sees. Per score and output element the operations and their order
// are the references', whatever the blocks. No intrinsics: the ISA files include it with their Ops.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/token_ops.h"

namespace qforge::kernels::detail {

// Rows j0 .. j0 + n − 1 of one side: row j0 at base, the next ones `stride` floats apart.
struct RowBlock {
  const float* base;
  int64_t stride;
};

// One group's context out [rows][D] of queries q [rows][D] (rows q_apart / out_apart floats apart)
// with scores scratch sp.w [rows][S];
// rows = sp.groups · sp.T, row i seeing sp.keys(i). key_rows(j0, n) / value_rows(j0, n) give a block
// as a RowBlock (a cache's own rows, or a buffer they were dequantized into). Ops supplies the ISA's
//   scores(q_i, D, n, k, stride, w)      w[0, n) = the lane-sum scores of n keys (any n),
//   softmax_rows(sp, r0, r1)            the causal softmax of rows [r0, r1),
//   accumulate(p, n, v, stride, D, out) out[0, D) += Σ_j p_j · v_j in j order.
template <class Ops, class KeyRows, class ValueRows>
void attention_group_blocks(const SoftmaxProblem& sp, const float* q, int64_t q_apart, float* out, int64_t out_apart,
                            int64_t D, const KeyRows& key_rows, const ValueRows& value_rows) {
  const int64_t rows = sp.groups * sp.T, S = sp.S, block = kTokenOpLanes;
  int64_t jlo = S, jhi = 0;
  for (int64_t i = 0; i < rows; ++i) jlo = std::min(jlo, sp.keys(i).lo), jhi = std::max(jhi, sp.keys(i).hi);
  auto blocks = [&](const auto& rows_of, const auto& fn) {
    for (int64_t j0 = jlo; j0 < jhi; j0 += block) {
      const int64_t n = std::min(block, jhi - j0);
      const RowBlock r = rows_of(j0, n);
      for (int64_t i = 0; i < rows; ++i) {
        const KeyRange seen = sp.keys(i);
        const int64_t a = std::max(seen.lo, j0), b = std::min(seen.hi, j0 + n);
        if (a < b) fn(i, a, b, r.base + (a - j0) * r.stride, r.stride);
      }
    }
  };
  blocks(key_rows, [&](int64_t i, int64_t a, int64_t b, const float* k, int64_t stride) {
    Ops::scores(q + i * q_apart, D, b - a, k, stride, sp.w + i * S + a);
  });
  Ops::softmax_rows(sp, 0, rows);
  for (int64_t i = 0; i < rows; ++i) std::fill(out + i * out_apart, out + i * out_apart + D, 0.0f);
  blocks(value_rows, [&](int64_t i, int64_t a, int64_t b, const float* v, int64_t stride) {
    Ops::accumulate(sp.w + i * S + a, b - a, v, stride, D, out + i * out_apart);
  });
}

// Groups [g0, g1) of attention_f32 with the ISA's Ops, reading the cache's own rows.
template <class Ops>
void attention_groups_with(const AttentionProblem& p, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g) {
    const float* k = p.k_group(g);
    const float* v = p.v_group(g);
    attention_group_blocks<Ops>(
        {p.scores + g * p.rows * p.S, p.rows / p.T, p.T, p.S, p.past, p.window, p.scale}, p.q_group(g), p.q_rows_apart(),
        p.out_group(g), p.out_rows_apart(), p.D,
        [&](int64_t j0, int64_t) { return RowBlock{k + j0 * p.k_row_stride, p.k_row_stride}; },
        [&](int64_t j0, int64_t) { return RowBlock{v + j0 * p.v_row_stride, p.v_row_stride}; });
  }
}

// Groups [g0, g1) of attention_kv_codes_f32 with the ISA's Ops: each block of up to 16 cached
// rows dequantized once into a buffer by the ISA's row dequantizers (keys.row / values.row
// (g, j, buf): row j of group g into buf[0, D)), then read by every query row that sees it.
template <class Ops, class Dequantizer>
void attention_kv_codes_groups_with(const KvCodesAttentionProblem& p, int64_t g0, int64_t g1, const Dequantizer& keys,
                                    const Dequantizer& values) {
  alignas(64) float buf[kTokenOpLanes * kKvCodesMaxHeadDim];  // keys while scoring, then values
  for (int64_t g = g0; g < g1; ++g) {
    auto dequantized = [&](const Dequantizer& side) {
      return [&side, &buf, &p, g](int64_t j0, int64_t n) {
        for (int64_t kk = 0; kk < n; ++kk) side.row(g, j0 + kk, buf + kk * p.D);
        return RowBlock{buf, p.D};
      };
    };
    attention_group_blocks<Ops>(
        {p.scores + g * p.rows * p.S, p.rows / p.T, p.T, p.S, p.past, p.window, p.scale}, p.q + g * p.rows * p.D, p.D,
        p.out + g * p.rows * p.D, p.D, p.D, dequantized(keys), dequantized(values));
  }
}

}  // namespace qforge::kernels::detail
