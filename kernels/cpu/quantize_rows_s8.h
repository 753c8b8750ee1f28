// Activation quantization (dynamic, and static with a calibrated scale) with run-time kernel choice (quantize_rows_s8_avx512 ->
// reference); bit-identical to quantize_rows_s8_reference (formula in reference.h).
#pragma once

#include <cstdint>

#include "kernels/cpu/reference.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

// qmax: the grid's largest code, 127 unless narrower rows are asked for; clip: the rows' range as
// a fraction of their amax (quantize_rows_s8_reference).
void quantize_rows_s8(const float* x, int64_t M, int64_t K, ActScale mode, int8_t* q, int64_t ldq,
                      float* a_scale, RunInfo* info = nullptr, int qmax = kActQMax, float clip = 1.0f);

// Static activation quantization, quantize_static_s8_reference's formula (reference.h), spread
// over ATen's intra-op threads: AVX-512 where usable, else the reference. Throws qforge::Error on
// NaN / Inf (the reference names the element).
void quantize_static_s8(const float* x, int64_t count, float inv, int qmin, int qmax, int8_t* q,
                        RunInfo* info = nullptr);

// Block-32 activation quantization (quantize_rows_q8b32_reference's formula and output, bit for
// bit): AVX-512 -> AVX2 -> reference, whichever is usable first. Throws qforge::Error naming the
// first NaN / Inf (the reference reports it).
void quantize_rows_q8b32(const float* x, int64_t M, int64_t K, int8_t* q, int64_t ldq, float* d, int32_t* s,
                         RunInfo* info = nullptr);

namespace detail {
// One row of quantize_rows_q8b32 (q: kb * 32 codes, d and s: kb values; columns past K get 0
// codes up to the block's end); false on NaN / Inf (outputs then unspecified).
bool quantize_row_q8b32_avx512(const float* x, int64_t K, int8_t* q, float* d, int32_t* s);
bool quantize_row_q8b32_avx2(const float* x, int64_t K, int8_t* q, float* d, int32_t* s);
// AVX-512 pieces (quantize_rows_s8_avx512.cpp). row_amax returns false on NaN / Inf.
bool row_amax_avx512(const float* x, int64_t K, float* amax);
void quantize_row_avx512(const float* x, int64_t K, float inv, int8_t* q, int64_t ldq, int qmax = kActQMax);
// clamp(nearbyint(x * inv), qmin, qmax) for n elements; returns false on NaN / Inf.
bool quantize_clamp_avx512(const float* x, int64_t n, float inv, int qmin, int qmax, int8_t* q);
}  // namespace detail

}  // namespace qforge::kernels
