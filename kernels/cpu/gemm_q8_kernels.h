// Internal interface of the large-M (prefill) decode GEMMs: block-32 int8 activations times the
// packed int8 (per channel or per group) / int4 weights for calls of more than kWeightOnlyMaxM
// rows, with the decode GEMVs' arguments and results (linear_q8b32_s8_reference /
// linear_q8b32_s4_reference bit for bit, the latter on the int8 groups' codes too, so a call of M
// rows equals M one-row calls). Register tiles of several rows x several 16-column blocks; the
// dispatchers (linear_decode.cpp, linear_s8g.cpp) split the column blocks across threads.
#pragma once

#include <cstdint>

#include "kernels/cpu/gemv_kernels.h"

namespace qforge::kernels::detail {

void gemm_q8s8f32_n16k4_avx512vnni(const GemvQ8S8Args& args, int64_t nb_begin, int64_t nb_end);
void gemm_q8s4f32_n16k8_avx512vnni(const GemvQ8S4Args& args, int64_t nb_begin, int64_t nb_end);
void gemm_q8s4f32_n16b32_avx512vnni(const GemvQ8S4Args& args, int64_t nb_begin, int64_t nb_end);
void gemm_q8s8gf32_n16k4_avx512vnni(const GemvQ8S8GArgs& args, int64_t nb_begin, int64_t nb_end);

}  // namespace qforge::kernels::detail
