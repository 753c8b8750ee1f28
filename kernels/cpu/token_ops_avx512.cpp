// The fused per-token ops on AVX-512 (token_ops.h): each zmm lane is one of the reference's 16
// accumulator lanes and every element sees the reference's operations in its order, so the
// results equal the reference bit for bit. Compiled with the AVX-512 flags.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention_blocks.h"
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

// fold_lanes of 16 vectors at once: lane k of the result is fold_lanes(a[k]), every sum the
// reference's pair (a_j + a_{j+w}, w = 8, 4, 2, 1), so bit for bit; the pairs of all 16 folds
// share each vector add (15 adds and 31 shuffles where 16 folds take 240 scalar adds).
__m512 fold_lanes16(const __m512 (&a)[kL]) {
  __m512 b[8], c[4], d[2];
  for (int p = 0; p < 8; ++p)  // w = 8: [key 2p's 8 sums | key 2p+1's]
    b[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int r = 0; r < 4; ++r)  // w = 4: 128-bit lane l holds key 4r + l's 4 sums
    c[r] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * r], b[2 * r + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(b[2 * r], b[2 * r + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int t = 0; t < 2; ++t)  // w = 2: lane l holds keys 8t + l and 8t + 4 + l, 2 sums each
    d[t] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * t], c[2 * t + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(c[2 * t], c[2 * t + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // w = 1: element 4l + m holds key l + 4m; the permutation puts key k in element k.
  const __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), e);
}

// Scores of query row q against n <= 16 keys, key kk's D floats at k + kk · stride, stored to
// w[0, n): attention_f32's 16 lane sums (acc + q_d · k_d, products rounded) folded by
// fold_lanes16. Keys past n repeat key n − 1 (computed, never stored), so the 16 sums stay in
// registers without a branch.
void scores16(const float* q, int64_t D, int64_t n, const float* k, int64_t stride, float* w) {
  __m512 acc[kL];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += kL) {  // zero tail lanes add +0: the reference's lane sums
    const __mmask16 m = tail_mask(D - d);
    const __m512 qd = _mm512_maskz_loadu_ps(m, q + d);
#pragma GCC unroll 16
    for (int64_t kk = 0; kk < kL; ++kk)
      acc[kk] = _mm512_add_ps(acc[kk], _mm512_mul_ps(qd, _mm512_maskz_loadu_ps(m, k + std::min(kk, n - 1) * stride + d)));
  }
  _mm512_mask_storeu_ps(w, tail_mask(n), fold_lanes16(acc));
}

// out[0, D) += Σ_{j < n} p_j · v_j (v_j's D floats at v + j · stride), j ascending for every
// element (0 + p_lo · v_lo + ... when out starts at 0: attention_f32's order), products rounded;
// 4 vectors of d at a time, so 4 addition chains run side by side.
void accumulate_rows(const float* p, int64_t n, const float* v, int64_t stride, int64_t D, float* out) {
  constexpr int64_t kC = 4;
  for (int64_t d0 = 0; d0 < D; d0 += kC * kL) {
    __mmask16 m[kC];
    __m512 acc[kC];
    for (int64_t c = 0; c < kC; ++c) {
      m[c] = d0 + c * kL < D ? tail_mask(D - d0 - c * kL) : static_cast<__mmask16>(0);
      acc[c] = _mm512_maskz_loadu_ps(m[c], out + d0 + c * kL);
    }
    for (int64_t j = 0; j < n; ++j) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      for (int64_t c = 0; c < kC; ++c)
        acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(pj, _mm512_maskz_loadu_ps(m[c], v + j * stride + d0 + c * kL)));
    }
    for (int64_t c = 0; c < kC; ++c) _mm512_mask_storeu_ps(out + d0 + c * kL, m[c], acc[c]);
  }
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

// A norm's first pass over one row of dim floats: v = x (+ r, stored to h, when r is given), the
// 16 lane sums acc = step(acc, v) in k order. Zero tail lanes add +0 (or +0 · +0): the lane sums
// stay the reference's.
template <class Step>
__m512 residual_pass(const float* x, const float* r, float* h, int64_t dim, const Step& step) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t k = 0; k < dim; k += kL) {
    const __mmask16 m = tail_mask(dim - k);
    __m512 v = _mm512_maskz_loadu_ps(m, x + k);
    if (r) {
      v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, r + k));
      _mm512_mask_storeu_ps(h + k, m, v);
    }
    acc = step(acc, v);
  }
  return acc;
}

}  // namespace

void rms_norm_rows_avx512(const RmsNormProblem& p, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = p.x + r * p.dim;
    float* h = p.r ? p.h + r * p.dim : nullptr;
    const __m512 acc = residual_pass(x, p.r ? p.r + r * p.dim : nullptr, h, p.dim,
                                     [](__m512 a, __m512 v) { return _mm512_fmadd_ps(v, v, a); });
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

void layer_norm_rows_avx512(const LayerNormProblem& p, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = p.x + r * p.dim;
    float* h = p.r ? p.h + r * p.dim : nullptr;
    const __m512 acc = residual_pass(x, p.r ? p.r + r * p.dim : nullptr, h, p.dim,
                                     [](__m512 a, __m512 v) { return _mm512_add_ps(a, v); });
    const float* v = p.r ? h : x;
    const float mean = fold_lanes(acc) / static_cast<float>(p.dim);
    const __m512 mv = _mm512_set1_ps(mean);
    __m512 sq = _mm512_setzero_ps();
    for (int64_t k = 0; k < p.dim; k += kL) {
      const __mmask16 m = tail_mask(p.dim - k);
      const __m512 d = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, v + k), mv);  // tail lanes 0
      sq = _mm512_fmadd_ps(d, d, sq);
    }
    const __m512 iv = _mm512_set1_ps(1.0f / std::sqrt(fold_lanes(sq) / static_cast<float>(p.dim) + p.eps));
    float* y = p.y + r * p.dim;
    for (int64_t k = 0; k < p.dim; k += kL) {
      const __mmask16 m = tail_mask(p.dim - k);
      const __m512 n = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, v + k), mv), iv);
      const __m512 t = _mm512_mul_ps(n, _mm512_maskz_loadu_ps(m, p.w + k));
      _mm512_mask_storeu_ps(y + k, m, _mm512_add_ps(t, _mm512_maskz_loadu_ps(m, p.b + k)));
    }
  }
}

void gelu_tanh_avx512(const GeluProblem& p, int64_t i0, int64_t i1) {
  const __m512 c0 = _mm512_set1_ps(kGeluC0), c1 = _mm512_set1_ps(kGeluC1), m2 = _mm512_set1_ps(-2.0f),
               one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  for (int64_t i = i0; i < i1; i += kL) {
    const __mmask16 m = tail_mask(i1 - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, p.x + i);
    const __m512 u = _mm512_mul_ps(c0, _mm512_add_ps(x, _mm512_mul_ps(c1, _mm512_mul_ps(_mm512_mul_ps(x, x), x))));
    const __m512 e = exp_nonpositive(_mm512_mul_ps(m2, _mm512_abs_ps(u)));
    const __mmask16 neg = _mm512_cmp_ps_mask(u, zero, _CMP_NGE_UQ);  // the reference's "not u >= 0"
    const __m512 num = _mm512_mask_mul_ps(x, neg, x, e);
    _mm512_mask_storeu_ps(p.y + i, m, _mm512_div_ps(num, _mm512_add_ps(one, e)));
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
  causal_softmax_rows_with(p, r0, r1, softmax_span_avx512);
}

namespace {

// attention_group_blocks' Ops on AVX-512.
struct Avx512Ops {
  static void scores(const float* q, int64_t D, int64_t n, const float* k, int64_t stride, float* w) {
    for (int64_t j = 0; j < n; j += kL) scores16(q, D, std::min(kL, n - j), k + j * stride, stride, w + j);
  }
  static void softmax_rows(const SoftmaxProblem& p, int64_t r0, int64_t r1) { causal_softmax_rows_avx512(p, r0, r1); }
  static void accumulate(const float* p, int64_t n, const float* v, int64_t stride, int64_t D, float* out) {
    accumulate_rows(p, n, v, stride, D, out);
  }
};

}  // namespace

void attention_groups_avx512(const AttentionProblem& p, int64_t g0, int64_t g1) { attention_groups_with<Avx512Ops>(p, g0, g1); }

namespace {

// The dequantization of one side's rows (KvCodesAttentionProblem's formula), 16 elements a vector:
// lane l of vector b reads group (16 b + l) / group, gathered from the row's scales by a
// permutation fixed per call.
class KvRowDequantizer {
 public:
  KvRowDequantizer(const KvCodesAttentionProblem& p, const KvCodesOperand& o) : p_(p), o_(o) {
    const int64_t groups = p.D / p.group;
    for (int64_t b = 0; b * kL < p.D; ++b) {
      const int64_t d0 = b * kL;
      alignas(64) int32_t idx[kL];
      const int64_t first = kv_block_groups(d0, kL, p.D, p.group, idx);
      idx_[b] = _mm512_load_si512(idx);
      first_[b] = first;
      scale_mask_[b] = tail_mask(groups - first);
      code_mask_[b] = tail_mask(p.D - d0);
    }
  }

  // Row j of group g into buf[0, D) (lanes past D hold finite values the callers mask).
  void row(int64_t g, int64_t j, float* buf) const {
    const uint8_t* c = o_.row(g, p_.heads, j);
    const int64_t at = o_.scale_offset(g, p_.heads, j);
    for (int64_t b = 0; b * kL < p_.D; ++b) {
      const int64_t d0 = b * kL;
      __m512i q = p_.bits == 8 ? _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(code_mask_[b], c + d0)) : nibbles(c + d0 / 2, b);
      const __m512 s = _mm512_permutexvar_ps(idx_[b], _mm512_maskz_loadu_ps(scale_mask_[b], o_.scale + at + first_[b]));
      if (o_.zero_point) {
        const __m128i z8 = _mm_maskz_loadu_epi8(scale_mask_[b], o_.zero_point + at + first_[b]);
        q = _mm512_sub_epi32(q, _mm512_permutexvar_epi32(idx_[b], _mm512_cvtepi8_epi32(z8)));
      }
      _mm512_mask_storeu_ps(buf + d0, code_mask_[b], _mm512_mul_ps(_mm512_cvtepi32_ps(q), s));
    }
  }

 private:
  // 16 signed 4-bit codes from bytes (element 2i in byte i's low nibble), widened to int32.
  __m512i nibbles(const uint8_t* bytes, int64_t b) const {
    const __mmask16 m = tail_mask((std::min(kL, p_.D - b * kL) + 1) / 2);
    const __m128i x = _mm_maskz_loadu_epi8(m, bytes), low = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_and_si128(x, low), hi = _mm_and_si128(_mm_srli_epi16(x, 4), low);
    return _mm512_cvtepi8_epi32(_mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), eight), eight));
  }

  static constexpr int64_t kBlocks = kKvCodesMaxHeadDim / kL;
  const KvCodesAttentionProblem& p_;
  const KvCodesOperand& o_;
  __m512i idx_[kBlocks];
  int64_t first_[kBlocks];
  __mmask16 scale_mask_[kBlocks], code_mask_[kBlocks];
};

}  // namespace

// Each cached row is dequantized once a group, 16 at a time (KvRowDequantizer), and read by every
// query row that sees it.
void attention_kv_codes_groups_avx512(const KvCodesAttentionProblem& p, int64_t g0, int64_t g1) {
  attention_kv_codes_groups_with<Avx512Ops>(p, g0, g1, KvRowDequantizer(p, p.k), KvRowDequantizer(p, p.v));
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
      q[r] = p.q_group(g) + (i0 + std::min(r, n - 1)) * p.q_rows_apart();
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
          _mm512_mask_storeu_ps(p.out_group(g) + (i0 + r) * p.out_rows_apart() + d0 + c * kL, m[c], acc[r][c]);
    }
  }
}

}  // namespace qforge::kernels::detail
