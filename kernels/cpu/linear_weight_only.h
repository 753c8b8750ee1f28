// Weight-only linears: float activations (not quantized) times packed int8 / int4 weights, with
// run-time choice gemv_f32s{8,4}f32_*_avx512 -> reference. Bit-identical to
// linear_f32_s8_reference / linear_f32_s4_reference (reference.h). x dense [M, K], y dense [M, N].
#pragma once

#include <cstdint>

#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

void linear_f32s8f32(const float* x, int64_t M, const S8N16K4View& w, const float* w_scale,
                     const float* bias, float* y, RunInfo* info = nullptr);

// The AVX-512 kernel needs w.group_size % 8 == 0 (else the reference runs, with the reason).
void linear_f32s4f32(const float* x, int64_t M, const S4N16K8View& w, const float* bias, float* y,
                     RunInfo* info = nullptr);

}  // namespace qforge::kernels
