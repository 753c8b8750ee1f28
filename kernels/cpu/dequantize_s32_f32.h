// Dequantizing epilogue with run-time kernel choice (dequantize_s32_f32_avx512 -> reference);
// bit-identical to dequantize_s32_f32_reference.
#pragma once

#include <cstdint>

#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

void dequantize_s32_f32(const int32_t* acc, const float* a_scale, const float* w_scale,
                        const float* bias, float* y, int64_t M, int64_t N, RunInfo* info = nullptr);

namespace detail {
// Rows [m_begin, m_end) of the epilogue, AVX-512 (dequantize_s32_f32_avx512.cpp).
void dequantize_s32_f32_avx512(const int32_t* acc, const float* a_scale, const float* w_scale,
                               const float* bias, float* y, int64_t N, int64_t m_begin,
                               int64_t m_end);
}  // namespace detail

}  // namespace qforge::kernels
