// Fused per-token small ops of the decoder forward (issue 38): RMSNorm and LayerNorm with the
// residual add before them, GELU (tanh form), RoPE on q / k rows in place, the scaled, causally masked softmax over the key cache, and the
// whole attention of decode-size and prefill-size calls over the cache, each one call where the
// ATen forward runs 5 to 10 ops (docs/kernels.md §2.5b). The *_reference
// functions define the results; each op's kernel table runs *_avx512 -> *_reference, bit-equal to
// the reference (its 16 accumulator lanes are the AVX-512 lanes); the softmax, the decode
// attentions and GELU also have an AVX2 entry (two ymm halves per 16 lanes), bit-equal too. Against the ATen ops they replace:
// RoPE bit for bit, RMSNorm and softmax within a few ulp (other summation orders and exp),
// LayerNorm and GELU within the bounds stated at each.
// No ATen here: the ISA files include this header.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

// Lanes of the sums below: the order of every reduction (lane j adds elements j, j + 16, ...).
inline constexpr int64_t kTokenOpLanes = 16;

// rows × dim, row-major. With r: h = x + r (written to h), else h = x (h may be null). Then per row
//   ss = Σ h² as 16 lane sums (lane j: fmaf(h_k, h_k, acc_j) for k ≡ j mod 16, in k order), folded
//        acc_j += acc_{j+w} for w = 8, 4, 2, 1;
//   inv = 1 / sqrtf(ss / dim + eps);  y_k = w_k · (h_k · inv)          (each product rounded)
struct RmsNormProblem {
  const float* x = nullptr;
  const float* r = nullptr;  // residual, or null
  float* h = nullptr;        // x + r when r is given
  const float* w = nullptr;  // weight [dim]
  float* y = nullptr;
  int64_t rows = 0, dim = 0;
  float eps = 0;
};
void rms_norm_reference(const RmsNormProblem& p);
const KernelTable<RmsNormProblem>& rms_norm_kernels();
void rms_norm_f32(const RmsNormProblem& p, RunInfo* info = nullptr);

// LayerNorm (torch.nn.LayerNorm's formula, two passes), rows × dim, row-major. With r: h = x + r
// (written to h), else h = x (h may be null). Then per row, sums as 16 lane sums folded as in
// rms_norm:
//   mean = (Σ h_k, lane j: acc_j + h_k for k ≡ j mod 16, k ascending) / dim
//   var  = (Σ d_k², d_k = h_k − mean, lane j: fmaf(d_k, d_k, acc_j)) / dim
//   inv  = 1 / sqrtf(var + eps);  y_k = (d_k · inv) · w_k + b_k          (each operation rounded)
// ATen's kernel sums in another order: within 1e-6 |y| + 1e-6 max |y| of it (outputs near 0, where
// d · inv · w nears −b, carry the absolute part).
struct LayerNormProblem {
  const float* x = nullptr;
  const float* r = nullptr;  // residual, or null
  float* h = nullptr;        // x + r when r is given
  const float* w = nullptr;  // weight [dim]
  const float* b = nullptr;  // bias [dim]
  float* y = nullptr;
  int64_t rows = 0, dim = 0;
  float eps = 0;
};
void layer_norm_reference(const LayerNormProblem& p);
const KernelTable<LayerNormProblem>& layer_norm_kernels();
void layer_norm_f32(const LayerNormProblem& p, RunInfo* info = nullptr);

// GELU in its tanh form (HF "gelu_new", "gelu_pytorch_tanh"), n floats, elementwise:
//   u = kGeluC0 · (x + kGeluC1 · ((x · x) · x));  e = exp_nonpositive(−2 · |u|)
//   y = x / (1 + e) where u >= 0,  (x · e) / (1 + e) where u < 0          (each operation rounded)
// which is x · (1 + tanh u) / 2 without the cancellation of 1 + tanh u as tanh u nears −1: ATen's
// form loses |x| · 2^-24 there, so against it the bound is 1e-6 |y| + 1.2e-7 |x|.
inline constexpr float kGeluC0 = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluC1 = 0.044715f;
struct GeluProblem {
  const float* x = nullptr;
  float* y = nullptr;  // may equal x
  int64_t n = 0;
};
void gelu_tanh_reference(const GeluProblem& p);
const KernelTable<GeluProblem>& gelu_tanh_kernels();
void gelu_tanh_f32(const GeluProblem& p, RunInfo* info = nullptr);

// HF's rotate-half RoPE on x [positions, heads, dim] (dim even, half = dim / 2), in place, with
// cos / sin tables [table_rows, dim], position i reading row i mod table_rows (batches of
// table_rows positions share the table): for j < half
//   y_j = x_j · c_j + (−x_{j+half}) · s_j,   y_{j+half} = x_{j+half} · c_{j+half} + x_j · s_{j+half}
// (products rounded, then the sum: x * cos + rotate_half(x) * sin of the ATen forward, bit for bit).
struct RopeProblem {
  float* x = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t positions = 0, heads = 0, dim = 0, table_rows = 1;
};
void rope_reference(const RopeProblem& p);
const KernelTable<RopeProblem>& rope_kernels();
void rope_f32(const RopeProblem& p, RunInfo* info = nullptr);

// The keys [lo, hi) query row i sees: it sits at position past + i mod T, so
//   hi = min(S, past + i mod T + 1),  lo = window > 0 ? max(0, hi − window) : 0.
struct KeyRange {
  int64_t lo = 0, hi = 0;
};
inline KeyRange visible_keys(int64_t i, int64_t T, int64_t S, int64_t past, int64_t window) {
  const int64_t hi = std::min(S, past + i % T + 1);
  return {window > 0 ? std::max<int64_t>(0, hi - window) : 0, hi};
}

// Attention scores w [groups, T, S] in place -> probabilities. Query i (of T) sits at position
// past + i and sees keys visible_keys(i, T, S, past, window); the others get 0. Over [lo, hi):
//   z = w · scale;  m = max z;  e = exp_nonpositive(z − m);  sum = 16 lane sums of e in order,
//   folded as in rms_norm;  p = e · (1 / sum)
// exp_nonpositive(t) (t <= 0): 0 below −87; else n = floorf(t · log2(e) + 0.5), f = fmaf(n, −C1, t),
// f = fmaf(n, −C2, f), Cephes' degree-5 polynomial of f by fmaf, times 2^n (within 2 ulp of exp).
struct SoftmaxProblem {
  float* w = nullptr;
  int64_t groups = 0, T = 0, S = 0, past = 0, window = 0;
  float scale = 1;
  KeyRange keys(int64_t row) const { return visible_keys(row, T, S, past, window); }
};
void causal_softmax_reference(const SoftmaxProblem& p);
// Rows [r0, r1) of the causal softmax with span(w, keys, scale) computing SoftmaxProblem's formula
// on w[lo, hi) in place: the keys a row does not see are set to 0 (each entry's row loop).
template <class Span>
void causal_softmax_rows_with(const SoftmaxProblem& p, int64_t r0, int64_t r1, const Span& span) {
  for (int64_t r = r0; r < r1; ++r) {
    float* w = p.w + r * p.S;
    const KeyRange keys = p.keys(r);
    span(w, keys, p.scale);
    std::fill(w, w + keys.lo, 0.0f);
    std::fill(w + keys.hi, w + p.S, 0.0f);
  }
}
const KernelTable<SoftmaxProblem>& causal_softmax_kernels();
void causal_softmax_f32(const SoftmaxProblem& p, RunInfo* info = nullptr);

// Decode-size attention over a key/value cache, scores to context in one call (grouped-query: the
// `rows` = rep · T query rows of the query heads sharing one key/value head form its group).
// Group g (of groups = batch · heads) reads q [g][rows][D], keys and values k / v at
//   base + (g / heads) · batch_stride + (g % heads) · head_stride + j · row_stride   (j < S, D floats)
// and writes out [g][rows][D] (q and out contiguous, or strided as k / v are: AttentionProblem's
// q_* / out_* strides). Row i is query position past + i mod T:
//   w_ij = Σ_d q_id · k_jd   over the keys it sees (SoftmaxProblem's [lo, hi)), as 16 lane sums
//          (lane l: acc_l + q_d · k_d for d ≡ l mod 16, in d order, products rounded), folded as
//          in rms_norm;
//   p_i  = the causal softmax of w_i (SoftmaxProblem's formula, scale and window; scores is its
//          [groups][rows][S] scratch, left holding p);
//   out_id = Σ_j p_ij · v_jd  (0 + ... in j order, each product rounded).
// (No fused multiply-add: in the reference, compiled for the baseline ISA, a scalar fmaf is a
// library call per element, and machines without AVX2 run it.)
// The AVX-512 entry folds the lane sums of 16 keys at once with vector adds pairing the lanes as
// the fold does, and runs 4 vectors of d side by side in out's chains: bit for bit the reference.
// Against the two matmuls and softmax it replaces (nn::MatMul's float forward): within a few ulp
// (another summation order).
struct AttentionProblem {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* scores = nullptr;
  float* out = nullptr;
  int64_t groups = 0, heads = 1, rows = 0, T = 0, S = 0, D = 0, past = 0, window = 0;
  int64_t k_batch_stride = 0, k_head_stride = 0, k_row_stride = 0;
  int64_t v_batch_stride = 0, v_head_stride = 0, v_row_stride = 0;
  // q and out laid out like k / v (row i of group g at base + (g / heads) · batch_stride +
  // (g % heads) · head_stride + i · row_stride, D contiguous floats), or, with row_stride < 0 (the
  // default), contiguous [groups][rows][D]. A decode step's q can so be read inside the fused
  // [B, T, 3·H·D] projection and its context written as [B, T, H·D] (rep = 1 or T = 1).
  int64_t q_batch_stride = 0, q_head_stride = 0, q_row_stride = -1;
  int64_t out_batch_stride = 0, out_head_stride = 0, out_row_stride = -1;
  float scale = 1;
  KeyRange keys(int64_t row) const { return visible_keys(row, T, S, past, window); }
  const float* k_group(int64_t g) const { return k + g / heads * k_batch_stride + g % heads * k_head_stride; }
  const float* v_group(int64_t g) const { return v + g / heads * v_batch_stride + g % heads * v_head_stride; }
  const float* q_group(int64_t g) const {
    return q_row_stride < 0 ? q + g * rows * D : q + g / heads * q_batch_stride + g % heads * q_head_stride;
  }
  float* out_group(int64_t g) const {
    return out_row_stride < 0 ? out + g * rows * D : out + g / heads * out_batch_stride + g % heads * out_head_stride;
  }
  int64_t q_rows_apart() const { return q_row_stride < 0 ? D : q_row_stride; }
  int64_t out_rows_apart() const { return out_row_stride < 0 ? D : out_row_stride; }
};
void attention_reference(const AttentionProblem& p);
const KernelTable<AttentionProblem>& attention_kernels();
void attention_f32(const AttentionProblem& p, RunInfo* info = nullptr);

// Prefill-size attention (hundreds of query rows a group) on AttentionProblem's operands, with
// fused multiply-adds; `scores` is not used (each task keeps its rows' scores in its own scratch).
// Row i of group g (keys [lo, hi) = keys(i)):
//   w_ij  = one fmaf chain over d in order: acc = 0, acc = fmaf(q_id, k_jd, acc)     (lo <= j < hi)
//   p_i   = the softmax of w_i over [lo, hi) (SoftmaxProblem's formula, scale included)
//   out_id = one fmaf chain over j = lo .. hi − 1 in order: acc = 0, acc = fmaf(p_ij, v_jd, acc)
// The AVX-512 entry runs kAttentionPrefillRows rows at a time over keys transposed once a call
// (lanes: 16 keys for w, 16 of d for out), every element its reference chain: bit for bit the
// reference. Keys no row of a 4-row tile sees are never multiplied (the matmuls it replaces
// compute all S and mask); a tile's rows share its keys' span, so a row may compute a few scores
// it does not see (more where the tile crosses from one grouped head's rows to the next), which
// the softmax never reads.
// Against the two matmuls and softmax: within a few ulp of max |out| (other summation orders).
inline constexpr int64_t kAttentionPrefillRows = 4;
void attention_prefill_reference(const AttentionProblem& p);
const KernelTable<AttentionProblem>& attention_prefill_kernels();
void attention_prefill_f32(const AttentionProblem& p, RunInfo* info = nullptr);

// Decode-size attention over a quantized KV cache's codes (docs/kv_cache.md, "Attention on the
// codes"): AttentionProblem's formulas, order and scratch with every key and value element
// dequantized where it is read,
//   k_jd = float(c_jd − z) · s     (c − z exact; one rounded product, dequantize_int's formula)
// c the code (int8, or signed 4-bit with element 2i in byte i's low nibble, as
// pack_s4_reference), s / z the scale and zero point of d's group of `group` elements (z = 0 when
// zero_point is null). So the result is attention_f32's on the dequantized cache bit for bit,
// reading 1 (int8) or 1/2 (int4) byte an element instead of 4 and never holding the float cache.
// Row j of side `o` in group g sits at bytes (g / heads) · batch_stride + (g % heads) · head_stride
// + j · row_stride of codes; its scales (and zero points) at the same formula over the scale_*
// strides, in elements.
struct KvCodesOperand {
  const void* codes = nullptr;          // int8 [.., S, D] or uint8 [.., S, D / 2]
  const float* scale = nullptr;         // [.., S, D / group]
  const int8_t* zero_point = nullptr;   // shaped and strided as scale, or null (symmetric)
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
  int64_t scale_batch_stride = 0, scale_head_stride = 0, scale_row_stride = 0;
  const uint8_t* row(int64_t g, int64_t heads, int64_t j) const {
    return static_cast<const uint8_t*>(codes) + g / heads * batch_stride + g % heads * head_stride + j * row_stride;
  }
  int64_t scale_offset(int64_t g, int64_t heads, int64_t j) const {
    return g / heads * scale_batch_stride + g % heads * scale_head_stride + j * scale_row_stride;
  }
};
// Head sizes the codes kernels take (the AVX-512 entry dequantizes 16 rows into a stack buffer).
inline constexpr int64_t kKvCodesMaxHeadDim = 512;
struct KvCodesAttentionProblem {
  const float* q = nullptr;
  float* scores = nullptr;
  float* out = nullptr;
  KvCodesOperand k, v;
  int bits = 8;        // 8 or 4
  int64_t group = 0;   // elements per scale, dividing D
  int64_t groups = 0, heads = 1, rows = 0, T = 0, S = 0, D = 0, past = 0, window = 0;
  float scale = 1;
  KeyRange keys(int64_t row) const { return visible_keys(row, T, S, past, window); }
};
void attention_kv_codes_reference(const KvCodesAttentionProblem& p);
const KernelTable<KvCodesAttentionProblem>& attention_kv_codes_kernels();
void attention_kv_codes_f32(const KvCodesAttentionProblem& p, RunInfo* info = nullptr);

namespace detail {
// Rows [r0, r1) of each op (the dispatchers split rows over the intra-op threads).
void rms_norm_rows_avx512(const RmsNormProblem& p, int64_t r0, int64_t r1);
void rope_rows_avx512(const RopeProblem& p, int64_t r0, int64_t r1);
void layer_norm_rows_avx512(const LayerNormProblem& p, int64_t r0, int64_t r1);
// Elements [i0, i1) of gelu_tanh_f32 (and its AVX2 entry below).
void gelu_tanh_avx512(const GeluProblem& p, int64_t i0, int64_t i1);
void causal_softmax_rows_avx512(const SoftmaxProblem& p, int64_t r0, int64_t r1);
// Groups [g0, g1) of attention_f32.
void attention_groups_avx512(const AttentionProblem& p, int64_t g0, int64_t g1);
// Row blocks [b0, b1) of attention_prefill_f32: block b is rows kAttentionPrefillRows · (b mod n)
// onwards of group b / n, n = ceil(rows / kAttentionPrefillRows); kt holds each group's keys
// transposed, [groups][D][S].
void attention_prefill_blocks_avx512(const AttentionProblem& p, const float* kt, int64_t b0, int64_t b1);
// Groups [g0, g1) of attention_kv_codes_f32.
void attention_kv_codes_groups_avx512(const KvCodesAttentionProblem& p, int64_t g0, int64_t g1);
// The AVX2 entries of causal_softmax_f32 (rows [r0, r1)), attention_f32 and attention_kv_codes_f32
// (groups [g0, g1)).
void causal_softmax_rows_avx2(const SoftmaxProblem& p, int64_t r0, int64_t r1);
void gelu_tanh_avx2(const GeluProblem& p, int64_t i0, int64_t i1);
void attention_groups_avx2(const AttentionProblem& p, int64_t g0, int64_t g1);
void attention_kv_codes_groups_avx2(const KvCodesAttentionProblem& p, int64_t g0, int64_t g1);
// Row j of one side of group g of a quantized cache, dequantized into buf[0, D) (the reference's loop).
void dequantize_kv_row(const KvCodesAttentionProblem& p, const KvCodesOperand& o, int64_t g, int64_t j, float* buf);
// The vector dequantizers' lane table: for the `lanes` elements from d0 of a row of D elements in
// scale groups of `group`, idx[l] = lane l's group minus the block's first (lanes past D take the
// last element's); returns the first group.
// Defined in token_ops.cpp (baseline ISA): an inline definition here could be emitted by an
// AVX-512 file and kept by the linker for the AVX2 one.
int64_t kv_block_groups(int64_t d0, int64_t lanes, int64_t D, int64_t group, int32_t* idx);
}  // namespace detail

}  // namespace qforge::kernels
