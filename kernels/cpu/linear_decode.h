// Decode linears: the float activation rows quantized once per call to int8 in blocks of 32
// (quantize_rows_q8b32_reference, llama.cpp's Q8_0 activation side), then integer dot products
// against the packed int8 (n16k4) or int4 (n16k8) weights of the weight-only layers, with the
// block scale applied per 32 values in float. Unlike the weight-only kernels these round the
// activations (docs/kernels.md, "Decode activations"). Chosen at run time from each op's kernel
// table (linear_q8s8_kernels(), linear_q8s4_kernels()): gemv_q8s{8,4}f32_*_avx512vnni ->
// *_avx2 -> reference for M <= kWeightOnlyMaxM, bit-identical to linear_q8b32_s8_reference /
// linear_q8b32_s4_reference; above it gemm_q8s{8,4}f32_*_avx512vnni (the same results, in
// register tiles: gemm_q8_kernels.h), else the exact weight-only linear_f32_dequant_gemm entry.
// Each thread keeps the quantized rows of its last call with the float rows they came from; a
// call on bit-identical rows (the q/k/v and gate/up projections of one decoded token) reuses them.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/linear_weight_only.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

// One call of a decode linear as its kernel table sees it: the weight-only call's fields (x null
// when planning).
using LinearQ8S8Problem = LinearF32S8Problem;
using LinearQ8S4Problem = LinearF32S4Problem;

// The int4 entry for groups the blocks cannot split: the exact weight-only GEMV, float activations.
inline constexpr const char* kExactS4GemvKernel = "linear_f32s4f32";

const KernelTable<LinearQ8S8Problem>& linear_q8s8_kernels();
// Calls on this thread so far that reused the previous call's quantized rows (tests, profiles).
int64_t q8_activation_reuses();
const KernelTable<LinearQ8S4Problem>& linear_q8s4_kernels();

// x dense float [M, K], y dense float [M, N]; the packed weights of PackedLinearS8 / S4.
void linear_q8b32s8f32(const float* x, int64_t M, const S8N16K4View& w, const float* w_scale, const float* bias,
                       float* y, RunInfo* info = nullptr);
// int4 groups must be a multiple of 32 (or one group per row) for the block-32 kernels; other
// groups run the exact weight-only GEMV (linear_f32s4f32) and info->fallback says why.
void linear_q8b32s4f32(const float* x, int64_t M, const S4N16K8View& w, const float* bias, float* y,
                       RunInfo* info = nullptr);

namespace detail {

// The block-32 activation rows of the last call on this thread, with the float rows they came
// from: a call whose rows are bit for bit the same (q/k/v, and gate/up, read one normalized row)
// reuses them, so the result is the one a fresh quantization gives.
struct Q8Rows {
  std::vector<float> x;
  int64_t m = -1, k = -1, kb = 0;
  std::vector<int8_t> q;   // [m][kb * 32]
  std::vector<float> d;    // [m][kb]
  std::vector<int32_t> s;  // [m][kb]
};
// x dense [m, k] quantized (quantize_rows_q8b32), or the thread's last rows when x equals them.
const Q8Rows& q8_rows(const float* x, int64_t m, int64_t k);

// A decode GEMV's arguments (GemvQ8Args) over `rows`, writing y [m][ldy].
template <typename Args>
Args q8_args(const Q8Rows& rows, int64_t m, float* y, int64_t ldy, const float* bias) {
  Args a;
  a.q = rows.q.data(), a.d = rows.d.data(), a.s = rows.s.data();
  a.m = m, a.ldq = rows.kb * kQ8Block, a.kb = rows.kb;
  a.bias = bias, a.y = y, a.ldy = ldy;
  return a;
}

}  // namespace detail

}  // namespace qforge::kernels
