// Activation quantization (dynamic, and static with a calibrated scale) with run-time kernel choice (quantize_rows_s8_avx512 ->
// reference); bit-identical to quantize_rows_s8_reference (formula in reference.h).
#pragma once

#include <cstdint>

#include "kernels/cpu/reference.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

void quantize_rows_s8(const float* x, int64_t M, int64_t K, ActScale mode, int8_t* q, int64_t ldq,
                      float* a_scale, RunInfo* info = nullptr);

// Static activation quantization, quantize_static_s8_reference's formula (reference.h), spread
// over ATen's intra-op threads: AVX-512 where usable, else the reference. Throws qforge::Error on
// NaN / Inf (the reference names the element).
void quantize_static_s8(const float* x, int64_t count, float inv, int qmin, int qmax, int8_t* q,
                        RunInfo* info = nullptr);

namespace detail {
// AVX-512 pieces (quantize_rows_s8_avx512.cpp). row_amax returns false on NaN / Inf.
bool row_amax_avx512(const float* x, int64_t K, float* amax);
void quantize_row_avx512(const float* x, int64_t K, float inv, int8_t* q, int64_t ldq);
// clamp(nearbyint(x * inv), qmin, qmax) for n elements; returns false on NaN / Inf.
bool quantize_clamp_avx512(const float* x, int64_t n, float inv, int qmin, int qmax, int8_t* q);
}  // namespace detail

}  // namespace qforge::kernels
