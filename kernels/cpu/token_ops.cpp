// The fused per-token ops (token_ops.h): references, kernel tables and dispatchers.
#include "kernels/cpu/token_ops.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/parallel_blocks.h"
#include "kernels/cpu/token_ops_exp.h"

namespace qforge::kernels {
namespace {

constexpr int64_t kL = kTokenOpLanes;
// Elements per task: a decode token's rows stay on the calling thread (no fork-join).
constexpr int64_t kElementsPerTask = int64_t{1} << 15;

// The lane sums folded as token_ops.h states: acc_j += acc_{j+w} for w = 8, 4, 2, 1.
float fold_lanes(float (&acc)[kTokenOpLanes]) {
  for (int64_t w = kL / 2; w >= 1; w /= 2)
    for (int64_t j = 0; j < w; ++j) acc[j] = acc[j] + acc[j + w];
  return acc[0];
}

// Row r of a norm's input: x's, or h = x + r (written to h) when a residual is given.
template <class Norm>
const float* norm_input_row(const Norm& p, int64_t r) {
  const float* x = p.x + r * p.dim;
  if (!p.r) return x;
  float* h = p.h + r * p.dim;
  for (int64_t k = 0; k < p.dim; ++k) h[k] = x[k] + p.r[r * p.dim + k];
  return h;
}

void rms_norm_rows(const RmsNormProblem& p, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* v = norm_input_row(p, r);
    float acc[kTokenOpLanes] = {};
    for (int64_t k = 0; k < p.dim; ++k) acc[k % kL] = std::fmaf(v[k], v[k], acc[k % kL]);
    const float inv = 1.0f / std::sqrt(fold_lanes(acc) / static_cast<float>(p.dim) + p.eps);
    float* y = p.y + r * p.dim;
    for (int64_t k = 0; k < p.dim; ++k) y[k] = p.w[k] * (v[k] * inv);
  }
}

void layer_norm_rows(const LayerNormProblem& p, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* v = norm_input_row(p, r);
    float acc[kTokenOpLanes] = {};
    for (int64_t k = 0; k < p.dim; ++k) acc[k % kL] = acc[k % kL] + v[k];
    const float mean = fold_lanes(acc) / static_cast<float>(p.dim);
    float sq[kTokenOpLanes] = {};
    for (int64_t k = 0; k < p.dim; ++k) {
      const float d = v[k] - mean;
      sq[k % kL] = std::fmaf(d, d, sq[k % kL]);
    }
    const float inv = 1.0f / std::sqrt(fold_lanes(sq) / static_cast<float>(p.dim) + p.eps);
    float* y = p.y + r * p.dim;
    for (int64_t k = 0; k < p.dim; ++k) y[k] = ((v[k] - mean) * inv) * p.w[k] + p.b[k];
  }
}

void gelu_tanh_span(const GeluProblem& p, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float x = p.x[i];
    const float u = kGeluC0 * (x + kGeluC1 * ((x * x) * x));
    const float e = detail::exp_nonpositive(-2.0f * std::fabs(u));
    p.y[i] = u >= 0.0f ? x / (1.0f + e) : (x * e) / (1.0f + e);
  }
}

void rope_rows(const RopeProblem& p, int64_t r0, int64_t r1) {
  const int64_t half = p.dim / 2;
  for (int64_t r = r0; r < r1; ++r) {  // r: one head of one position
    float* x = p.x + r * p.dim;
    const float* c = p.cos + (r / p.heads) % p.table_rows * p.dim;
    const float* s = p.sin + (r / p.heads) % p.table_rows * p.dim;
    for (int64_t j = 0; j < half; ++j) {
      const float a = x[j], b = x[j + half];
      x[j] = a * c[j] + (-b) * s[j];
      x[j + half] = b * c[j + half] + a * s[j + half];
    }
  }
}

// SoftmaxProblem's formula on w[lo, hi), in place; the rest of w untouched.
void softmax_span(float* w, KeyRange keys, float scale) {
  const auto [lo, hi] = keys;
  float m = -INFINITY;
  for (int64_t j = lo; j < hi; ++j) w[j] = w[j] * scale, m = std::max(m, w[j]);
  float acc[kTokenOpLanes] = {};
  for (int64_t j = lo; j < hi; ++j) {
    w[j] = detail::exp_nonpositive(w[j] - m);
    acc[(j - lo) % kL] = acc[(j - lo) % kL] + w[j];
  }
  const float inv = 1.0f / fold_lanes(acc);
  for (int64_t j = lo; j < hi; ++j) w[j] = w[j] * inv;
}

void softmax_rows(const SoftmaxProblem& p, int64_t r0, int64_t r1) {
  causal_softmax_rows_with(p, r0, r1, softmax_span);
}

// AttentionProblem's decode formulas for one group, its key and value rows read through
// key_row(j) / value_row(j) (a cache's floats, or a quantized row dequantized into a buffer).
template <class KeyRow, class ValueRow>
void attention_group(const float* q0, int64_t q_rows_apart, float* w, float* out0, int64_t out_rows_apart, int64_t rows,
                     int64_t T, const SoftmaxProblem& sp, int64_t D, const KeyRow& key_row, const ValueRow& value_row) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* q = q0 + i * q_rows_apart;
    const auto [lo, hi] = sp.keys(i);
    for (int64_t j = lo; j < hi; ++j) {
      const float* k = key_row(j);
      float acc[kTokenOpLanes] = {};
      for (int64_t d = 0; d < D; ++d) acc[d % kL] = acc[d % kL] + q[d] * k[d];
      w[i * sp.S + j] = fold_lanes(acc);
    }
  }
  softmax_rows({w, rows / T, T, sp.S, sp.past, sp.window, sp.scale}, 0, rows);
  for (int64_t i = 0; i < rows; ++i) {
    float* out = out0 + i * out_rows_apart;
    std::fill(out, out + D, 0.0f);
    const auto [lo, hi] = sp.keys(i);
    for (int64_t j = lo; j < hi; ++j) {
      const float pj = w[i * sp.S + j];
      const float* v = value_row(j);
      for (int64_t d = 0; d < D; ++d) out[d] = out[d] + pj * v[d];
    }
  }
}

void attention_groups(const AttentionProblem& p, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g) {
    const float* k = p.k_group(g);
    const float* v = p.v_group(g);
    const SoftmaxProblem sp{nullptr, p.rows / p.T, p.T, p.S, p.past, p.window, p.scale};
    attention_group(p.q_group(g), p.q_rows_apart(), p.scores + g * p.rows * p.S, p.out_group(g), p.out_rows_apart(), p.rows,
                    p.T, sp, p.D, [&](int64_t j) { return k + j * p.k_row_stride; },
                    [&](int64_t j) { return v + j * p.v_row_stride; });
  }
}


// The definition: each group's visible cached rows dequantized (once), then attention_f32's formulas.
void attention_kv_codes_groups(const KvCodesAttentionProblem& p, int64_t g0, int64_t g1) {
  int64_t jlo = p.S, jhi = 0;  // the rows some query sees
  for (int64_t i = 0; i < p.rows; ++i) jlo = std::min(jlo, p.keys(i).lo), jhi = std::max(jhi, p.keys(i).hi);
  const std::unique_ptr<float[]> k(new float[static_cast<size_t>(p.S * p.D)]), v(new float[static_cast<size_t>(p.S * p.D)]);
  for (int64_t g = g0; g < g1; ++g) {
    for (int64_t j = jlo; j < jhi; ++j) {
      detail::dequantize_kv_row(p, p.k, g, j, k.get() + j * p.D);
      detail::dequantize_kv_row(p, p.v, g, j, v.get() + j * p.D);
    }
    const SoftmaxProblem sp{nullptr, p.rows / p.T, p.T, p.S, p.past, p.window, p.scale};
    attention_group(p.q + g * p.rows * p.D, p.D, p.scores + g * p.rows * p.S, p.out + g * p.rows * p.D, p.D, p.rows, p.T,
                    sp, p.D, [&](int64_t j) { return k.get() + j * p.D; }, [&](int64_t j) { return v.get() + j * p.D; });
  }
}

void attention_prefill_groups(const AttentionProblem& p, int64_t g0, int64_t g1) {
  std::vector<float> w(static_cast<size_t>(p.S));
  for (int64_t g = g0; g < g1; ++g) {
    const float* k = p.k_group(g);
    const float* v = p.v_group(g);
    for (int64_t i = 0; i < p.rows; ++i) {
      const float* q = p.q_group(g) + i * p.q_rows_apart();
      const auto [lo, hi] = p.keys(i);
      for (int64_t j = lo; j < hi; ++j) {
        float acc = 0;
        for (int64_t d = 0; d < p.D; ++d) acc = std::fmaf(q[d], k[j * p.k_row_stride + d], acc);
        w[j] = acc;
      }
      softmax_span(w.data(), {lo, hi}, p.scale);
      float* out = p.out_group(g) + i * p.out_rows_apart();
      for (int64_t d = 0; d < p.D; ++d) {
        float acc = 0;
        for (int64_t j = lo; j < hi; ++j) acc = std::fmaf(w[j], v[j * p.v_row_stride + d], acc);
        out[d] = acc;
      }
    }
  }
}

// A norm's rows over the threads (RMSNorm, LayerNorm).
template <class Norm, void (*kRows)(const Norm&, int64_t, int64_t)>
void run_norm(const Norm& p) {
  detail::parallel_over(p.rows, std::max<int64_t>(1, kElementsPerTask / p.dim), [&](int64_t b, int64_t e) { kRows(p, b, e); });
}
// Chunks of 16 elements over the threads (any split gives the same elementwise results).
template <void (*kSpan)(const GeluProblem&, int64_t, int64_t)>
void run_gelu(const GeluProblem& p) {
  detail::parallel_over((p.n + kL - 1) / kL, kElementsPerTask / kL,
                        [&](int64_t b, int64_t e) { kSpan(p, b * kL, std::min(p.n, e * kL)); });
}
template <void (*kRows)(const RopeProblem&, int64_t, int64_t)>
void run_rope(const RopeProblem& p) {
  detail::parallel_over(p.positions * p.heads, std::max<int64_t>(1, kElementsPerTask / p.dim),
                        [&](int64_t b, int64_t e) { kRows(p, b, e); });
}
template <void (*kRows)(const SoftmaxProblem&, int64_t, int64_t)>
void run_softmax(const SoftmaxProblem& p) {
  detail::parallel_over(p.groups * p.T, std::max<int64_t>(1, kElementsPerTask / p.S),
                        [&](int64_t b, int64_t e) { kRows(p, b, e); });
}

template <void (*kGroups)(const AttentionProblem&, int64_t, int64_t)>
void run_attention(const AttentionProblem& p) {
  detail::parallel_over(p.groups, std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(1, p.rows * p.S * p.D)),
                        [&](int64_t b, int64_t e) { kGroups(p, b, e); });
}

template <void (*kGroups)(const KvCodesAttentionProblem&, int64_t, int64_t)>
void run_attention_kv_codes(const KvCodesAttentionProblem& p) {
  detail::parallel_over(p.groups, std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(1, p.rows * p.S * p.D)),
                        [&](int64_t b, int64_t e) { kGroups(p, b, e); });
}

// Each group's keys transposed to [D][S] (one pass), then the row blocks over the threads.
template <void (*kBlocks)(const AttentionProblem&, const float*, int64_t, int64_t)>
void run_attention_prefill(const AttentionProblem& p) {
  std::vector<float> kt(static_cast<size_t>(p.groups * p.D * p.S));
  detail::parallel_over(p.groups, 1, [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e; ++g) {
      const float* k = p.k_group(g);
      float* t = kt.data() + g * p.D * p.S;
      for (int64_t j = 0; j < p.S; ++j)
        for (int64_t d = 0; d < p.D; ++d) t[d * p.S + j] = k[j * p.k_row_stride + d];
    }
  });
  const int64_t blocks = (p.rows + kAttentionPrefillRows - 1) / kAttentionPrefillRows;
  detail::parallel_over_blocks(p.groups * blocks, kAttentionPrefillRows * p.S * p.D * 2,
                               [&](int64_t b, int64_t e) { kBlocks(p, kt.data(), b, e); });
}

// The checks attention_f32 and attention_prefill_f32 share (`op` names the caller).
void require_attention(const AttentionProblem& p, const char* op, bool needs_scores) {
  QF_REQUIRE(p.groups >= 0 && p.heads > 0 && p.T > 0 && p.rows > 0 && p.rows % p.T == 0 && p.D > 0 && p.S > 0 &&
                 p.past >= 0 && p.past + p.T <= p.S && p.window >= 0 &&
                 (p.groups == 0 || (p.q && p.k && p.v && p.out && (p.scores || !needs_scores))),
             "kernels/cpu: ", op, " got groups=", p.groups, " heads=", p.heads, " rows=", p.rows, " T=", p.T,
             " S=", p.S, " D=", p.D, " past=", p.past, " window=", p.window,
             " (rows a multiple of T, past + T <= S expected) or a null pointer");
  QF_REQUIRE((p.q_row_stride < 0 || (p.q_row_stride >= p.D || p.rows == 1)) &&
                 (p.out_row_stride < 0 || (p.out_row_stride >= p.D || p.rows == 1)),
             "kernels/cpu: ", op, " got q / out rows ", p.q_row_stride, " / ", p.out_row_stride,
             " floats apart, fewer than D=", p.D, " (rows would overlap)");
}

}  // namespace

namespace detail {
// Row j of one side of a quantized cache, dequantized into `buf` (KvCodesAttentionProblem's formula).
int64_t kv_block_groups(int64_t d0, int64_t lanes, int64_t D, int64_t group, int32_t* idx) {
  const int64_t first = d0 / group;
  for (int64_t l = 0; l < lanes; ++l) idx[l] = static_cast<int32_t>(std::min(d0 + l, D - 1) / group - first);
  return first;
}

void dequantize_kv_row(const KvCodesAttentionProblem& p, const KvCodesOperand& o, int64_t g, int64_t j, float* buf) {
  const uint8_t* c = o.row(g, p.heads, j);
  const int64_t at = o.scale_offset(g, p.heads, j);
  for (int64_t group = 0, d = 0; group < p.D / p.group; ++group) {
    const float s = o.scale[at + group];
    const int z = o.zero_point ? o.zero_point[at + group] : 0;
    for (int64_t e = 0; e < p.group; ++e, ++d) {
      const int code = p.bits == 8 ? static_cast<int8_t>(c[d]) : ((c[d / 2] >> (4 * (d % 2)) & 15) ^ 8) - 8;
      buf[d] = static_cast<float>(code - z) * s;
    }
  }
}
}  // namespace detail

void rms_norm_reference(const RmsNormProblem& p) { rms_norm_rows(p, 0, p.rows); }
void layer_norm_reference(const LayerNormProblem& p) { layer_norm_rows(p, 0, p.rows); }
void gelu_tanh_reference(const GeluProblem& p) { gelu_tanh_span(p, 0, p.n); }
void rope_reference(const RopeProblem& p) { rope_rows(p, 0, p.positions * p.heads); }
void causal_softmax_reference(const SoftmaxProblem& p) { softmax_rows(p, 0, p.groups * p.T); }
void attention_reference(const AttentionProblem& p) { attention_groups(p, 0, p.groups); }
void attention_prefill_reference(const AttentionProblem& p) { attention_prefill_groups(p, 0, p.groups); }
void attention_kv_codes_reference(const KvCodesAttentionProblem& p) { attention_kv_codes_groups(p, 0, p.groups); }

const KernelTable<RmsNormProblem>& rms_norm_kernels() {
  static const KernelTable<RmsNormProblem> table{
      {"rms_norm_f32_avx512", Isa::kAvx512, nullptr, nullptr, QF_KERNEL_AVX512((run_norm<RmsNormProblem, detail::rms_norm_rows_avx512>))},
      {"rms_norm_f32_reference", Isa::kReference, nullptr, nullptr, run_norm<RmsNormProblem, rms_norm_rows>},
  };
  return table;
}

const KernelTable<LayerNormProblem>& layer_norm_kernels() {
  static const KernelTable<LayerNormProblem> table{
      {"layer_norm_f32_avx512", Isa::kAvx512, nullptr, nullptr,
       QF_KERNEL_AVX512((run_norm<LayerNormProblem, detail::layer_norm_rows_avx512>))},
      {"layer_norm_f32_reference", Isa::kReference, nullptr, nullptr, run_norm<LayerNormProblem, layer_norm_rows>},
  };
  return table;
}

const KernelTable<GeluProblem>& gelu_tanh_kernels() {
  static const KernelTable<GeluProblem> table{
      {"gelu_tanh_f32_avx512", Isa::kAvx512, nullptr, nullptr, QF_KERNEL_AVX512(run_gelu<detail::gelu_tanh_avx512>)},
      {"gelu_tanh_f32_avx2", Isa::kAvx2, nullptr, nullptr, QF_KERNEL_AVX2(run_gelu<detail::gelu_tanh_avx2>)},
      {"gelu_tanh_f32_reference", Isa::kReference, nullptr, nullptr, run_gelu<gelu_tanh_span>},
  };
  return table;
}

const KernelTable<RopeProblem>& rope_kernels() {
  static const KernelTable<RopeProblem> table{
      {"rope_f32_avx512", Isa::kAvx512, nullptr, nullptr, QF_KERNEL_AVX512(run_rope<detail::rope_rows_avx512>)},
      {"rope_f32_reference", Isa::kReference, nullptr, nullptr, run_rope<rope_rows>},
  };
  return table;
}

const KernelTable<SoftmaxProblem>& causal_softmax_kernels() {
  static const KernelTable<SoftmaxProblem> table{
      {"causal_softmax_f32_avx512", Isa::kAvx512, nullptr, nullptr,
       QF_KERNEL_AVX512(run_softmax<detail::causal_softmax_rows_avx512>)},
      {"causal_softmax_f32_avx2", Isa::kAvx2, nullptr, nullptr, QF_KERNEL_AVX2(run_softmax<detail::causal_softmax_rows_avx2>)},
      {"causal_softmax_f32_reference", Isa::kReference, nullptr, nullptr, run_softmax<softmax_rows>},
  };
  return table;
}

const KernelTable<AttentionProblem>& attention_kernels() {
  static const KernelTable<AttentionProblem> table{
      {"attention_f32_avx512", Isa::kAvx512, nullptr, nullptr, QF_KERNEL_AVX512(run_attention<detail::attention_groups_avx512>)},
      {"attention_f32_avx2", Isa::kAvx2, nullptr, nullptr, QF_KERNEL_AVX2(run_attention<detail::attention_groups_avx2>)},
      {"attention_f32_reference", Isa::kReference, nullptr, nullptr, run_attention<attention_groups>},
  };
  return table;
}

const KernelTable<AttentionProblem>& attention_prefill_kernels() {
  static const KernelTable<AttentionProblem> table{
      {"attention_prefill_f32_avx512", Isa::kAvx512, nullptr, nullptr,
       QF_KERNEL_AVX512(run_attention_prefill<detail::attention_prefill_blocks_avx512>)},
      {"attention_prefill_f32_reference", Isa::kReference, nullptr, nullptr, run_attention<attention_prefill_groups>},
  };
  return table;
}

const KernelTable<KvCodesAttentionProblem>& attention_kv_codes_kernels() {
  static const KernelTable<KvCodesAttentionProblem> table{
      {"attention_kv_codes_f32_avx512", Isa::kAvx512, nullptr, nullptr,
       QF_KERNEL_AVX512(run_attention_kv_codes<detail::attention_kv_codes_groups_avx512>)},
      {"attention_kv_codes_f32_avx2", Isa::kAvx2, nullptr, nullptr,
       QF_KERNEL_AVX2(run_attention_kv_codes<detail::attention_kv_codes_groups_avx2>)},
      {"attention_kv_codes_f32_reference", Isa::kReference, nullptr, nullptr, run_attention_kv_codes<attention_kv_codes_groups>},
  };
  return table;
}

void rms_norm_f32(const RmsNormProblem& p, RunInfo* info) {
  QF_REQUIRE(p.rows >= 0 && p.dim > 0 && p.eps >= 0 && (p.rows == 0 || (p.x && p.w && p.y && (!p.r || p.h))),
             "kernels/cpu: rms_norm_f32 got rows=", p.rows, " dim=", p.dim, " eps=", p.eps, " or a null pointer");
  run_kernel_table(rms_norm_kernels(), p, p.rows, info);
}

void layer_norm_f32(const LayerNormProblem& p, RunInfo* info) {
  QF_REQUIRE(p.rows >= 0 && p.dim > 0 && p.eps >= 0 && (p.rows == 0 || (p.x && p.w && p.b && p.y && (!p.r || p.h))),
             "kernels/cpu: layer_norm_f32 got rows=", p.rows, " dim=", p.dim, " eps=", p.eps, " or a null pointer");
  run_kernel_table(layer_norm_kernels(), p, p.rows, info);
}

void gelu_tanh_f32(const GeluProblem& p, RunInfo* info) {
  QF_REQUIRE(p.n >= 0 && (p.n == 0 || (p.x && p.y)), "kernels/cpu: gelu_tanh_f32 got n=", p.n, " or a null pointer");
  run_kernel_table(gelu_tanh_kernels(), p, p.n, info);
}

void rope_f32(const RopeProblem& p, RunInfo* info) {
  QF_REQUIRE(p.positions >= 0 && p.heads > 0 && p.dim > 0 && p.dim % 2 == 0 && p.table_rows > 0 &&
                 (p.positions == 0 || (p.x && p.cos && p.sin)),
             "kernels/cpu: rope_f32 got positions=", p.positions, " heads=", p.heads, " dim=", p.dim,
             " (even expected) or a null pointer");
  run_kernel_table(rope_kernels(), p, p.positions * p.heads, info);
}

void causal_softmax_f32(const SoftmaxProblem& p, RunInfo* info) {
  QF_REQUIRE(p.groups >= 0 && p.T > 0 && p.S > 0 && p.past >= 0 && p.past + p.T <= p.S && p.window >= 0 &&
                 (p.groups == 0 || p.w),
             "kernels/cpu: causal_softmax_f32 got groups=", p.groups, " T=", p.T, " S=", p.S, " past=", p.past,
             " window=", p.window, " (past + T <= S expected) or a null pointer");
  run_kernel_table(causal_softmax_kernels(), p, p.groups * p.T, info);
}

void attention_f32(const AttentionProblem& p, RunInfo* info) {
  require_attention(p, "attention_f32", true);
  run_kernel_table(attention_kernels(), p, p.groups * p.rows, info);
}

void attention_prefill_f32(const AttentionProblem& p, RunInfo* info) {
  require_attention(p, "attention_prefill_f32", false);
  run_kernel_table(attention_prefill_kernels(), p, p.groups * p.rows, info);
}

void attention_kv_codes_f32(const KvCodesAttentionProblem& p, RunInfo* info) {
  QF_REQUIRE(p.groups >= 0 && p.heads > 0 && p.T > 0 && p.rows > 0 && p.rows % p.T == 0 && p.D > 0 &&
                 p.D <= kKvCodesMaxHeadDim && p.S > 0 && p.past >= 0 && p.past + p.T <= p.S && p.window >= 0 &&
                 (p.bits == 8 || (p.bits == 4 && p.D % 2 == 0)) && p.group > 0 && p.D % p.group == 0 &&
                 (p.groups == 0 || (p.q && p.scores && p.out && p.k.codes && p.k.scale && p.v.codes && p.v.scale)),
             "kernels/cpu: attention_kv_codes_f32 got groups=", p.groups, " heads=", p.heads, " rows=", p.rows, " T=", p.T,
             " S=", p.S, " D=", p.D, " past=", p.past, " window=", p.window, " bits=", p.bits, " group=", p.group,
             " (rows a multiple of T, past + T <= S, D <= ", kKvCodesMaxHeadDim,
             ", bits 8 or 4 with D even, group dividing D expected) or a null pointer");
  run_kernel_table(attention_kv_codes_kernels(), p, p.groups * p.rows, info);
}

}  // namespace qforge::kernels
