// Small-M int8 GEMM over the n16k4 packed layout: run-time choice from the ordered list
//   gemv_u8s8s32_n16k4_avx512vnni -> gemv_s8s8s32_n16k4_avx2 -> reference
// (docs/kernels.md lists the conditions). A is dense row-major [M, K]; outputs are dense [M, N].
#pragma once

#include <cstdint>

#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

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

}  // namespace qforge::kernels
