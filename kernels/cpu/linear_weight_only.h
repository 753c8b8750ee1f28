// Weight-only linears: float activations (not quantized) times packed int8 / int4 weights, with
// run-time choice from each op's kernel table (linear_f32s8_kernels(), linear_f32s4_kernels()):
// gemv_f32s{8,4}f32_*_avx512 -> reference for M <= kWeightOnlyMaxM, bit-identical to
// linear_f32_s8_reference / linear_f32_s4_reference (reference.h); above it
// linear_f32_dequant_gemm (the weight dequantized once, then at::linear). x dense [M, K], y dense
// [M, N].
#pragma once

#include <cstdint>
#include <string>
#include <functional>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

// Largest M the weight-only GEMV kernels serve (int8, int4 and codebook weights); above it,
// dequantizing the weight once and running the float GEMM is faster.
inline constexpr int64_t kWeightOnlyMaxM = 16;

// The table entry for M > kWeightOnlyMaxM, in every weight-only table.
inline constexpr const char* kDequantGemmKernel = "linear_f32_dequant_gemm";

void linear_f32s8f32(const float* x, int64_t M, const S8N16K4View& w, const float* w_scale,
                     const float* bias, float* y, RunInfo* info = nullptr);

// The AVX-512 kernel needs w.group_size % 8 == 0 (else the reference runs, with the reason).
void linear_f32s4f32(const float* x, int64_t M, const S4N16K8View& w, const float* bias, float* y,
                     RunInfo* info = nullptr);

// One call of a weight-only linear as its kernel table sees it (x null when planning).
struct LinearF32S8Problem {
  const float* x = nullptr;
  int64_t m = 0;
  S8N16K4View w;
  const float* w_scale = nullptr;
  const float* bias = nullptr;
  float* y = nullptr;
};
struct LinearF32S4Problem {
  const float* x = nullptr;
  int64_t m = 0;
  S4N16K8View w;
  const float* bias = nullptr;
  float* y = nullptr;
};

const KernelTable<LinearF32S8Problem>& linear_f32s8_kernels();
const KernelTable<LinearF32S4Problem>& linear_f32s4_kernels();

namespace detail {

// Whether an M is for the GEMV kernels (true) or for the dequantize + float GEMM entry.
inline bool weight_only_gemv_serves(int64_t m) { return m <= kWeightOnlyMaxM; }

// The `serves` predicates of the tables with that split (weight-only and decode linears).
template <typename Problem>
bool serves_gemv(const Problem& p) {
  return weight_only_gemv_serves(p.m);
}
template <typename Problem>
bool serves_gemm(const Problem& p) {
  return !weight_only_gemv_serves(p.m);
}
// The GEMV and GEMM predicates of the int4 entries that read one layout (S4N16K8View::layout).
template <typename Problem>
bool serves_gemv_n16k8(const Problem& p) {
  return serves_gemv(p) && p.w.layout == S4Layout::kN16K8;
}
template <typename Problem>
bool serves_gemv_n16b32(const Problem& p) {
  return serves_gemv(p) && p.w.layout == S4Layout::kN16B32;
}
template <typename Problem>
bool serves_gemm_n16k8(const Problem& p) {
  return serves_gemm(p) && p.w.layout == S4Layout::kN16K8;
}
template <typename Problem>
bool serves_gemm_n16b32(const Problem& p) {
  return serves_gemm(p) && p.w.layout == S4Layout::kN16B32;
}
// The same layout condition as an `applies` predicate, for callers that run entries directly.
template <typename Problem>
bool reads_layout(const Problem& p, S4Layout layout, std::string* why) {
  if (p.w.layout == layout) return true;
  *why = layout == S4Layout::kN16B32 ? "reads the n16b32 layout" : "reads the n16k8 layout";
  return false;
}
template <typename Problem>
bool reads_n16b32(const Problem& p, std::string* why) {
  return reads_layout(p, S4Layout::kN16B32, why);
}

// y = at::linear(x [M, K], W, bias [N] or none) with W float [N, K] written by fill_weight into a
// fresh contiguous ATen buffer: the same call, on the same kind of tensors, as a float Linear's.
void linear_f32_dequant_gemm(const float* x, int64_t M, int64_t K, int64_t N, const float* bias, float* y,
                             const std::function<void(float* w)>& fill_weight);

}  // namespace detail

}  // namespace qforge::kernels
