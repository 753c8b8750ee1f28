// Small-M int8 GEMM over the n16k4 packed layout: run-time choice from its kernel table
//   [gemm_s8s8s32_onednn, large M of a PackedLinearS8 holding a oneDNN copy] ->
//   gemv_u8s8s32_n16k4_avx512vnni -> gemv_s8s8s32_n16k4_avx2 -> reference
// (gemv_s8_kernels(); docs/kernels.md lists the conditions). A is dense row-major [M, K]; outputs
// are dense [M, N].
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

namespace detail {
class OneDnnS8Weights;
}  // namespace detail

// One call of the int8 GEMM as its kernel table sees it: exactly one of a_s8 / a_u8 is the
// activation (both null when planning), and c (int32) or y (fused float epilogue) the output.
struct GemvS8Problem {
  const int8_t* a_s8 = nullptr;
  const uint8_t* a_u8 = nullptr;
  int32_t a_zero_point = 0;
  int64_t m = 0;
  S8N16K4View w;
  int32_t* c = nullptr;
  float* y = nullptr;
  const float* a_scale = nullptr;
  const float* w_scale = nullptr;
  const float* bias = nullptr;
  // PackedLinearS8::run only: its oneDNN copy of the weight (null when it holds none, and
  // *onednn_status says why), for M >= onednn_min_m (0: never, as for every other caller).
  const detail::OneDnnS8Weights* onednn = nullptr;
  const std::string* onednn_status = nullptr;
  int64_t onednn_min_m = 0;
};

// gemv_s8s8f32's problem, set member by member (a field reorder cannot shift a pointer); PackedLinearS8
// adds its oneDNN fields.
GemvS8Problem s8s8f32_problem(const int8_t* A, int64_t M, const float* a_scale, const S8N16K4View& w,
                              const float* w_scale, const float* bias, float* y);

// The ordered kernel table of gemv_s8s8s32 / gemv_u8s8s32 / gemv_s8s8f32 (and bmm_s8s8f32).
const KernelTable<GemvS8Problem>& gemv_s8_kernels();

// C = A . W^T, exact int32 (equals gemm_s8s8s32_reference). Any int8 A is accepted; A holding
// -128 skips the AVX2 kernel (its sign trick needs [-127, 127]).
void gemv_s8s8s32(const int8_t* A, int64_t M, const S8N16K4View& w, int32_t* C,
                  RunInfo* info = nullptr);

// C = (A - a_zero_point) . W^T, exact int32 (equals gemm_u8s8s32_reference).
void gemv_u8s8s32(const uint8_t* A, int32_t a_zero_point, int64_t M, const S8N16K4View& w,
                  int32_t* C, RunInfo* info = nullptr);

// Fused: int32 GEMM then dequantize_s32_f32_reference's epilogue, bit-exact with
// gemm_s8s8s32_reference + dequantize_s32_f32_reference (A holding -128 skips the AVX2 kernel).
void gemv_s8s8f32(const int8_t* A, int64_t M, const float* a_scale, const S8N16K4View& w,
                  const float* w_scale, const float* bias, float* y, RunInfo* info = nullptr);

// Batched products of two int8 activations (attention's Q.K^T and P.V), dequantized:
//   y[b, m, n] = fmaf(float(sum_k A[b, m, k] * Bt[b, n, k]) * b_scale[b * b_scale_stride + n],
//                     a_scale[b * a_scale_stride + m], 0.0f)
// A int8 [batch, M, K] and Bt int8 [batch, N, K] (the second operand transposed: its columns as
// rows), y float [batch, M, N], all dense; a stride of 0 shares one [M] (or [N]) scale vector
// between slices. Each slice equals gemm_s8s8s32_reference + dequantize_s32_f32_reference (no
// bias) bit for bit: Bt is packed to n16k4 per slice (pack_s8_n16k4_reference) and runs
// gemv_s8s8f32's kernel list. Slices are spread over ATen's intra-op threads when there are at
// least as many slices as threads, else each slice splits its columns. `info` gets slice 0's
// choice.
void bmm_s8s8f32(const int8_t* A, const int8_t* Bt, int64_t batch, int64_t M, int64_t N, int64_t K,
                 const float* a_scale, int64_t a_scale_stride, const float* b_scale, int64_t b_scale_stride,
                 float* y, RunInfo* info = nullptr);

}  // namespace qforge::kernels
