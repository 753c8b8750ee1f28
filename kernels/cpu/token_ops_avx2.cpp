// The decode attention of token_ops.h on AVX2 (float cache and quantized codes): a 16-lane sum is
// two ymm halves (lanes 0-7, 8-15), four keys' sums fold together with the scalar fold's pairs
// (acc_j + acc_{j+w}, w = 8, 4, 2, 1), the values' sums run 4 vectors of d side by side, and the
// causal softmax (also its own table entry) computes the reference's operations lane by lane, so
// the results equal the references bit for bit. Compiled with the
// AVX2 flags; no ATen here.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/token_ops.h"
#include "kernels/cpu/token_ops_exp.h"

namespace qforge::kernels::detail {
namespace {

constexpr int64_t kL = kTokenOpLanes;
constexpr int64_t kH = 8;        // lanes of a ymm
constexpr int64_t kKeys = 4;     // keys folded together
constexpr int64_t kChains = 4;   // ymm chains of the values' sums

__m256i lane_mask8(int64_t valid) {
  const int v = static_cast<int>(std::clamp<int64_t>(valid, 0, kH));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(v), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// exp_nonpositive (token_ops_exp.h) lane by lane (hardware FMA: the reference's fmaf, correctly
// rounded alike); lanes below kExpLowest (and NaN) are 0.
__m256 exp_nonpositive8(__m256 t) {
  const __m256 live = _mm256_cmp_ps(t, _mm256_set1_ps(kExpLowest), _CMP_GE_OQ);
  const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(t, _mm256_set1_ps(kLog2e)), _mm256_set1_ps(0.5f)));
  __m256 f = _mm256_fmadd_ps(n, _mm256_set1_ps(-kExpC1), t);
  f = _mm256_fmadd_ps(n, _mm256_set1_ps(-kExpC2), f);
  __m256 y = _mm256_set1_ps(kExpP[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(kExpP[i]));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(f, f), f), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(live, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

// The reference's softmax_span on w[lo, hi): lane j of the 16 lane sums is half j / 8's lane j % 8.
void softmax_span8(float* w, KeyRange keys, float scale_) {
  const auto [lo, hi] = keys;
  const __m256 scale = _mm256_set1_ps(scale_), minus_inf = _mm256_set1_ps(-INFINITY);
  __m256 mv = minus_inf;
  for (int64_t j = lo; j < hi; j += kH) {
    const __m256i m = lane_mask8(hi - j);
    const __m256 z = _mm256_mul_ps(_mm256_maskload_ps(w + j, m), scale);
    _mm256_maskstore_ps(w + j, m, z);
    mv = _mm256_max_ps(mv, _mm256_blendv_ps(minus_inf, z, _mm256_castsi256_ps(m)));
  }
  alignas(32) float lanes[kL];
  _mm256_store_ps(lanes, mv);
  const __m256 mx = _mm256_set1_ps(*std::max_element(lanes, lanes + kH));  // max is exact in any order
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t j = lo; j < hi; j += kH) {
    const __m256i m = lane_mask8(hi - j);
    const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(m), exp_nonpositive8(_mm256_sub_ps(_mm256_maskload_ps(w + j, m), mx)));
    _mm256_maskstore_ps(w + j, m, e);
    acc[(j - lo) / kH % 2] = _mm256_add_ps(acc[(j - lo) / kH % 2], e);
  }
  _mm256_store_ps(lanes, acc[0]);
  _mm256_store_ps(lanes + kH, acc[1]);
  for (int64_t width = kL / 2; width >= 1; width /= 2)  // the reference's fold
    for (int64_t j = 0; j < width; ++j) lanes[j] = lanes[j] + lanes[j + width];
  const __m256 inv = _mm256_set1_ps(1.0f / lanes[0]);
  for (int64_t j = lo; j < hi; j += kH) {
    const __m256i m = lane_mask8(hi - j);
    _mm256_maskstore_ps(w + j, m, _mm256_mul_ps(_mm256_maskload_ps(w + j, m), inv));
  }
}

// Scores of query row q against n <= 4 keys (key kk's D floats at k + kk · stride) to w[0, n):
// the reference's 16 lane sums (acc + q_d · k_d, products rounded; masked lanes add +0), folded.
void scores4(const float* q, int64_t D, int64_t n, const float* k, int64_t stride, float* w) {
  __m256 acc[kKeys][2];
  for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += kL) {
    for (int64_t h = 0; h < 2; ++h) {
      const __m256i m = lane_mask8(D - d - h * kH);
      const __m256 qd = _mm256_maskload_ps(q + d + h * kH, m);
#pragma GCC unroll 4
      for (int64_t kk = 0; kk < kKeys; ++kk) {
        const float* kr = k + std::min(kk, n - 1) * stride + d + h * kH;  // keys past n repeat the last
        acc[kk][h] = _mm256_add_ps(acc[kk][h], _mm256_mul_ps(qd, _mm256_maskload_ps(kr, m)));
      }
    }
  }
  __m256 a[kKeys];
  for (int64_t kk = 0; kk < kKeys; ++kk) a[kk] = _mm256_add_ps(acc[kk][0], acc[kk][1]);  // w = 8
  // w = 4: [key 0's 4 | key 1's 4], [key 2's | key 3's]
  const __m256 b01 = _mm256_add_ps(_mm256_permute2f128_ps(a[0], a[1], 0x20), _mm256_permute2f128_ps(a[0], a[1], 0x31));
  const __m256 b23 = _mm256_add_ps(_mm256_permute2f128_ps(a[2], a[3], 0x20), _mm256_permute2f128_ps(a[2], a[3], 0x31));
  // w = 2: 128-bit lane 0 holds keys 0 and 2 (2 sums each), lane 1 keys 1 and 3
  const __m256 c = _mm256_add_ps(_mm256_shuffle_ps(b01, b23, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(b01, b23, _MM_SHUFFLE(3, 2, 3, 2)));
  // w = 1: elements [key 0, key 2, ., . | key 1, key 3, ., .]
  const __m256 e = _mm256_add_ps(_mm256_shuffle_ps(c, c, _MM_SHUFFLE(2, 0, 2, 0)), _mm256_shuffle_ps(c, c, _MM_SHUFFLE(3, 1, 3, 1)));
  alignas(32) float f[kH];
  _mm256_store_ps(f, e);
  const float keys[kKeys] = {f[0], f[4], f[1], f[5]};
  std::memcpy(w, keys, static_cast<size_t>(n) * sizeof(float));
}

// out[0, D) += Σ_{j < n} p_j · v_j (v_j at v + j · stride), j ascending per element, products
// rounded (the reference's order from out's value), 4 ymm of d at a time.
void accumulate_rows(const float* p, int64_t n, const float* v, int64_t stride, int64_t D, float* out) {
  for (int64_t d0 = 0; d0 < D; d0 += kChains * kH) {
    __m256i m[kChains];
    __m256 acc[kChains];
    for (int64_t c = 0; c < kChains; ++c) {
      m[c] = lane_mask8(D - d0 - c * kH);
      acc[c] = _mm256_maskload_ps(out + d0 + c * kH, m[c]);
    }
    for (int64_t j = 0; j < n; ++j) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      for (int64_t c = 0; c < kChains; ++c)
        acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(pj, _mm256_maskload_ps(v + j * stride + d0 + c * kH, m[c])));
    }
    for (int64_t c = 0; c < kChains; ++c) _mm256_maskstore_ps(out + d0 + c * kH, m[c], acc[c]);
  }
}

}  // namespace

void gelu_tanh_avx2(const GeluProblem& p, int64_t i0, int64_t i1) {
  const __m256 c0 = _mm256_set1_ps(kGeluC0), c1 = _mm256_set1_ps(kGeluC1), m2 = _mm256_set1_ps(-2.0f),
               one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps(),
               abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t i = i0; i < i1; i += 8) {
    const int64_t n = std::min<int64_t>(8, i1 - i);
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 x = _mm256_maskload_ps(p.x + i, m);
    const __m256 u = _mm256_mul_ps(c0, _mm256_add_ps(x, _mm256_mul_ps(c1, _mm256_mul_ps(_mm256_mul_ps(x, x), x))));
    const __m256 e = exp_nonpositive8(_mm256_mul_ps(m2, _mm256_and_ps(u, abs_mask)));
    const __m256 neg = _mm256_cmp_ps(u, zero, _CMP_NGE_UQ);  // the reference's "not u >= 0"
    const __m256 num = _mm256_blendv_ps(x, _mm256_mul_ps(x, e), neg);
    _mm256_maskstore_ps(p.y + i, m, _mm256_div_ps(num, _mm256_add_ps(one, e)));
  }
}

void causal_softmax_rows_avx2(const SoftmaxProblem& p, int64_t r0, int64_t r1) {
  causal_softmax_rows_with(p, r0, r1, softmax_span8);
}

namespace {

// attention_group_blocks' Ops on AVX2.
struct Avx2Ops {
  static void scores(const float* q, int64_t D, int64_t n, const float* k, int64_t stride, float* w) {
    for (int64_t j = 0; j < n; j += kKeys) scores4(q, D, std::min(kKeys, n - j), k + j * stride, stride, w + j);
  }
  static void softmax_rows(const SoftmaxProblem& p, int64_t r0, int64_t r1) { causal_softmax_rows_avx2(p, r0, r1); }
  static void accumulate(const float* p, int64_t n, const float* v, int64_t stride, int64_t D, float* out) {
    accumulate_rows(p, n, v, stride, D, out);
  }
};

}  // namespace

void attention_groups_avx2(const AttentionProblem& p, int64_t g0, int64_t g1) { attention_groups_with<Avx2Ops>(p, g0, g1); }

namespace {

// The low n (<= 8) bytes at p in an xmm (the rest zero), without reading past p + n; whole
// 8- and 4-byte loads are single moves.
__m128i load_bytes8(const void* p, int64_t n) {
  if (n == 8) return _mm_loadl_epi64(static_cast<const __m128i*>(p));
  uint32_t w = 0;
  if (n == 4) {
    std::memcpy(&w, p, 4);
    return _mm_cvtsi32_si128(static_cast<int>(w));
  }
  uint64_t v = 0;
  std::memcpy(&v, p, static_cast<size_t>(std::clamp<int64_t>(n, 0, 8)));
  return _mm_cvtsi64_si128(static_cast<long long>(v));
}

// One row of a quantized cache side into floats, 8 elements at a time: float(code - zero) * scale
// with the scale (and zero point) of each element's group picked by a lane permute, as
// dequantize_kv_row computes it (the same products, so the same bits).
class Avx2KvRowDequantizer {
 public:
  Avx2KvRowDequantizer(const KvCodesAttentionProblem& p, const KvCodesOperand& o) : p_(p), o_(o) {
    const int64_t groups = p.D / p.group;
    for (int64_t b = 0; b * kH < p.D; ++b) {
      const int64_t d0 = b * kH;
      alignas(32) int32_t idx[kH];
      const int64_t first = kv_block_groups(d0, kH, p.D, p.group, idx);
      idx_[b] = _mm256_load_si256(reinterpret_cast<const __m256i*>(idx));
      first_[b] = first;
      scales_[b] = std::min<int64_t>(groups - first, kH);
      scale_mask_[b] = lane_mask8(scales_[b]);
      code_mask_[b] = lane_mask8(p.D - d0);
      uniform_[b] = idx[kH - 1] == 0;  // the block's lanes share one group
    }
  }

  // Row j of group g into buf[0, D). int8 codes take the reference's function (token_ops.cpp,
  // baseline ISA), measured faster than the block loop below (151-154 against 186 ms for 64 calls
  // of model_llama_kv_attention at one thread); int4 codes the block loop (187-189 against 361 ms
  // for the reference's).
  void row(int64_t g, int64_t j, float* buf) const {
    if (p_.bits == 8) return dequantize_kv_row(p_, o_, g, j, buf);
    const uint8_t* c = o_.row(g, p_.heads, j);
    const int64_t at = o_.scale_offset(g, p_.heads, j);
    for (int64_t b = 0; b * kH < p_.D; ++b) {
      const int64_t d0 = b * kH, n = std::min(kH, p_.D - d0);
      __m256i q = _mm256_cvtepi8_epi32(nibbles(c + d0 / 2, n));
      const float* sp = o_.scale + at + first_[b];
      const __m256 s = uniform_[b] ? _mm256_set1_ps(*sp)
                                   : _mm256_permutevar8x32_ps(_mm256_maskload_ps(sp, scale_mask_[b]), idx_[b]);
      if (o_.zero_point) {
        const int8_t* zp = o_.zero_point + at + first_[b];
        const __m256i z = uniform_[b] ? _mm256_set1_epi32(*zp)
                                      : _mm256_permutevar8x32_epi32(_mm256_cvtepi8_epi32(load_bytes8(zp, scales_[b])),
                                                                    idx_[b]);
        q = _mm256_sub_epi32(q, z);
      }
      const __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(q), s);
      if (n == kH) {
        _mm256_storeu_ps(buf + d0, w);
      } else {
        _mm256_maskstore_ps(buf + d0, code_mask_[b], w);
      }
    }
  }

 private:
  // n (<= 8) signed 4-bit codes from bytes (element 2i in byte i's low nibble) as int8 lanes.
  static __m128i nibbles(const uint8_t* bytes, int64_t n) {
    const __m128i x = load_bytes8(bytes, (n + 1) / 2), low = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_and_si128(x, low), hi = _mm_and_si128(_mm_srli_epi16(x, 4), low);
    return _mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), eight), eight);
  }

  static constexpr int64_t kBlocks = kKvCodesMaxHeadDim / kH;
  const KvCodesAttentionProblem& p_;
  const KvCodesOperand& o_;
  __m256i idx_[kBlocks];
  __m256i scale_mask_[kBlocks], code_mask_[kBlocks];
  int64_t first_[kBlocks];
  int64_t scales_[kBlocks];  // scales the block's lanes span (from first_), at most 8
  bool uniform_[kBlocks];
};

}  // namespace

void attention_kv_codes_groups_avx2(const KvCodesAttentionProblem& p, int64_t g0, int64_t g1) {
  attention_kv_codes_groups_with<Avx2Ops>(p, g0, g1, Avx2KvRowDequantizer(p, p.k), Avx2KvRowDequantizer(p, p.v));
}

}  // namespace qforge::kernels::detail
