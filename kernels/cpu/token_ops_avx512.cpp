// The fused per-token ops on AVX-512 (token_ops.h): each zmm lane is one of the reference's 16
// accumulator lanes and every element sees the reference's operations in its order, so the
// results equal the reference bit for bit. Compiled with the AVX-512 flags.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/token_ops.h"
#include "kernels/cpu/token_ops_exp.h"

namespace qforge::kernels::detail {
namespace {

constexpr int64_t kL = kTokenOpLanes;

__mmask16 tail_mask(int64_t n) { return n >= kL ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1); }

// The reference's fold of the 16 lane sums (acc_j += acc_{j+w}, w = 8, 4, 2, 1).
float fold_lanes(__m512 v) {
  alignas(64) float acc[kL];
  _mm512_store_ps(acc, v);
  for (int64_t w = kL / 2; w >= 1; w /= 2)
    for (int64_t j = 0; j < w; ++j) acc[j] = acc[j] + acc[j + w];
  return acc[0];
}

// exp_nonpositive (token_ops_exp.h) lane by lane; lanes below kExpLowest are 0.
__m512 exp_nonpositive(__m512 t) {
  const __mmask16 live = _mm512_cmp_ps_mask(t, _mm512_set1_ps(kExpLowest), _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_add_ps(_mm512_mul_ps(t, _mm512_set1_ps(kLog2e)), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_fmadd_ps(n, _mm512_set1_ps(-kExpC1), t);
  f = _mm512_fmadd_ps(n, _mm512_set1_ps(-kExpC2), f);
  __m512 y = _mm512_set1_ps(kExpP[0]);
  for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(kExpP[i]));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(f, f), f), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(live, y, _mm512_castsi512_ps(e));
}

}  // namespace

void rms_norm_rows_avx512(const RmsNormProblem& p, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = p.x + r * p.dim;
    float* h = p.r ? p.h + r * p.dim : nullptr;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t k = 0; k < p.dim; k += kL) {
      const __mmask16 m = tail_mask(p.dim - k);
      __m512 v = _mm512_maskz_loadu_ps(m, x + k);
      if (p.r) {
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, p.r + r * p.dim + k));
        _mm512_mask_storeu_ps(h + k, m, v);
      }
      acc = _mm512_fmadd_ps(v, v, acc);  // zero tail lanes add +0: the lane sums stay the reference's
    }
    const float inv = 1.0f / std::sqrt(fold_lanes(acc) / static_cast<float>(p.dim) + p.eps);
    const float* v = p.r ? h : x;
    float* y = p.y + r * p.dim;
    const __m512 iv = _mm512_set1_ps(inv);
    for (int64_t k = 0; k < p.dim; k += kL) {
      const __mmask16 m = tail_mask(p.dim - k);
      const __m512 n = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, v + k), iv);
      _mm512_mask_storeu_ps(y + k, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p.w + k), n));
    }
  }
}

void rope_rows_avx512(const RopeProblem& p, int64_t r0, int64_t r1) {
  const int64_t half = p.dim / 2;
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    float* x = p.x + r * p.dim;
    const float* c = p.cos + (r / p.heads) % p.table_rows * p.dim;
    const float* s = p.sin + (r / p.heads) % p.table_rows * p.dim;
    for (int64_t j = 0; j < half; j += kL) {
      const __mmask16 m = tail_mask(half - j);
      const __m512 a = _mm512_maskz_loadu_ps(m, x + j), b = _mm512_maskz_loadu_ps(m, x + j + half);
      const __m512 lo = _mm512_add_ps(_mm512_mul_ps(a, _mm512_maskz_loadu_ps(m, c + j)),
                                      _mm512_mul_ps(_mm512_xor_ps(b, sign), _mm512_maskz_loadu_ps(m, s + j)));
      const __m512 hi = _mm512_add_ps(_mm512_mul_ps(b, _mm512_maskz_loadu_ps(m, c + j + half)),
                                      _mm512_mul_ps(a, _mm512_maskz_loadu_ps(m, s + j + half)));
      _mm512_mask_storeu_ps(x + j, m, lo);
      _mm512_mask_storeu_ps(x + j + half, m, hi);
    }
  }
}

namespace {

// softmax_span (SoftmaxProblem's formula on w[lo, hi)), lane j of each vector the reference's lane j.
void softmax_span_avx512(float* w, KeyRange keys, float scale_) {
  const auto [lo, hi] = keys;
  const __m512 scale = _mm512_set1_ps(scale_);
  __m512 mv = _mm512_set1_ps(-INFINITY);
  for (int64_t j = lo; j < hi; j += kL) {
    const __mmask16 m = tail_mask(hi - j);
    const __m512 z = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + j), scale);
    _mm512_mask_storeu_ps(w + j, m, z);
    mv = _mm512_mask_max_ps(mv, m, mv, z);
  }
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(mv));  // max is exact: any order gives the reference's
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = lo; j < hi; j += kL) {
    const __mmask16 m = tail_mask(hi - j);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, w + j), mx)));
    _mm512_mask_storeu_ps(w + j, m, e);
    acc = _mm512_add_ps(acc, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / fold_lanes(acc));
  for (int64_t j = lo; j < hi; j += kL) {
    const __mmask16 m = tail_mask(hi - j);
    _mm512_mask_storeu_ps(w + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + j), inv));
  }
}

}  // namespace

void causal_softmax_rows_avx512(const SoftmaxProblem& p, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    float* w = p.w + r * p.S;
    const KeyRange keys = p.keys(r);
    softmax_span_avx512(w, keys, p.scale);
    std::fill(w, w + keys.lo, 0.0f);
    std::fill(w + keys.hi, w + p.S, 0.0f);
  }
}

void attention_groups_avx512(const AttentionProblem& p, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g) {
    const float* k = p.k_group(g);
    const float* v = p.v_group(g);
    float* w = p.scores + g * p.rows * p.S;
    for (int64_t i = 0; i < p.rows; ++i) {
      const float* q = p.q + (g * p.rows + i) * p.D;
      const auto [lo, hi] = p.keys(i);
      for (int64_t j = lo; j < hi; ++j) {
        const float* kj = k + j * p.k_row_stride;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t d = 0; d < p.D; d += kL) {  // zero tail lanes add +0: the reference's lane sums
          const __mmask16 m = tail_mask(p.D - d);
          acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, q + d), _mm512_maskz_loadu_ps(m, kj + d)));
        }
        w[i * p.S + j] = fold_lanes(acc);
      }
    }
    causal_softmax_rows_avx512({w, p.rows / p.T, p.T, p.S, p.past, p.window, p.scale}, 0, p.rows);
    for (int64_t i = 0; i < p.rows; ++i) {
      float* out = p.out + (g * p.rows + i) * p.D;
      const auto [lo, hi] = p.keys(i);
      for (int64_t d = 0; d < p.D; d += kL) {
        const __mmask16 m = tail_mask(p.D - d);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t j = lo; j < hi; ++j)
          acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(w[i * p.S + j]), _mm512_maskz_loadu_ps(m, v + j * p.v_row_stride + d)));
        _mm512_mask_storeu_ps(out + d, m, acc);
      }
    }
  }
}


namespace {

constexpr int64_t kPR = kAttentionPrefillRows;
constexpr int64_t kPC = 4;  // vectors of 16 a row in the prefill tiles (64 keys, or 64 of d)

// Masks of the kPC vectors at offset o of n elements (zero where a vector starts at or past n).
void tile_masks(int64_t o, int64_t n, __mmask16 (&m)[kPC]) {
  for (int64_t c = 0; c < kPC; ++c) m[c] = o + c * kL < n ? tail_mask(n - o - c * kL) : static_cast<__mmask16>(0);
}

}  // namespace

void attention_prefill_blocks_avx512(const AttentionProblem& p, const float* kt, int64_t b0, int64_t b1) {
  const int64_t blocks = (p.rows + kPR - 1) / kPR, S = p.S, D = p.D;
  std::vector<float> scratch(static_cast<size_t>(kPR * S));  // the block's scores, then probabilities
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t g = b / blocks, i0 = b % blocks * kPR, n = std::min(kPR, p.rows - i0);
    const float* ktg = kt + g * D * S;
    const float* v = p.v_group(g);
    KeyRange keys[kPR];
    const float* q[kPR];  // rows past n repeat the last (computed, never stored)
    int64_t jlo = S, jhi = 0, clo = 0, chi = S;  // [jlo, jhi): any row's keys; [clo, chi): every row's
    for (int64_t r = 0; r < kPR; ++r) {
      q[r] = p.q + (g * p.rows + i0 + std::min(r, n - 1)) * D;
      keys[r] = p.keys(i0 + std::min(r, n - 1));
      jlo = std::min(jlo, keys[r].lo), jhi = std::max(jhi, keys[r].hi);
      clo = std::max(clo, keys[r].lo), chi = std::min(chi, keys[r].hi);
    }
    // Scores: 16 keys a lane vector, one fmaf chain over d each (keys a row does not see are
    // computed too and left to the softmax, which reads only its row's [lo, hi)).
    for (int64_t j = jlo; j < jhi; j += kPC * kL) {
      __mmask16 m[kPC];
      tile_masks(j, jhi, m);
      __m512 acc[kPR][kPC];
      for (auto& row : acc)
        for (auto& a : row) a = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; ++d) {
        __m512 kv[kPC];
        for (int64_t c = 0; c < kPC; ++c) kv[c] = _mm512_maskz_loadu_ps(m[c], ktg + d * S + j + c * kL);
        for (int64_t r = 0; r < kPR; ++r) {
          const __m512 qd = _mm512_set1_ps(q[r][d]);
          for (int64_t c = 0; c < kPC; ++c) acc[r][c] = _mm512_fmadd_ps(qd, kv[c], acc[r][c]);
        }
      }
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < kPC; ++c) _mm512_mask_storeu_ps(scratch.data() + r * S + j + c * kL, m[c], acc[r][c]);
    }
    for (int64_t r = 0; r < n; ++r) softmax_span_avx512(scratch.data() + r * S, keys[r], p.scale);
    // Context: 16 of d a lane vector, one fmaf chain over j = lo .. hi − 1 each. Keys every row
    // sees run all rows at once; the edges only the rows that see them.
    for (int64_t d0 = 0; d0 < D; d0 += kPC * kL) {
      __mmask16 m[kPC];
      tile_masks(d0, D, m);
      __m512 acc[kPR][kPC];
      for (auto& row : acc)
        for (auto& a : row) a = _mm512_setzero_ps();
      auto step = [&](int64_t j, bool every_row) {
        __m512 vv[kPC];
        for (int64_t c = 0; c < kPC; ++c) vv[c] = _mm512_maskz_loadu_ps(m[c], v + j * p.v_row_stride + d0 + c * kL);
        for (int64_t r = 0; r < kPR; ++r) {
          if (!every_row && (r >= n || j < keys[r].lo || j >= keys[r].hi)) continue;
          const __m512 pj = _mm512_set1_ps(scratch[r * S + j]);
          for (int64_t c = 0; c < kPC; ++c) acc[r][c] = _mm512_fmadd_ps(pj, vv[c], acc[r][c]);
        }
      };
      if (clo < chi && n == kPR) {
        for (int64_t j = jlo; j < clo; ++j) step(j, false);
        for (int64_t j = clo; j < chi; ++j) step(j, true);
        for (int64_t j = chi; j < jhi; ++j) step(j, false);
      } else {
        for (int64_t j = jlo; j < jhi; ++j) step(j, false);
      }
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < kPC; ++c)
          _mm512_mask_storeu_ps(p.out + (g * p.rows + i0 + r) * D + d0 + c * kL, m[c], acc[r][c]);
    }
  }
}

}  // namespace qforge::kernels::detail
