// Linears over int8 weights with a scale (and optional zero point) per column and group
// (S8GroupView: GGUF's Q8_0 blocks, qforge's per-group qint8), from each op's kernel table:
//   - decode (linear_q8s8g_kernels(), block-32 int8 activations as linear_decode.h):
//     gemv_q8s8gf32_n16k4_avx512vnni -> gemv_q8s8gf32_n16k4_avx2 -> reference for
//     M <= kWeightOnlyMaxM, bit-identical to linear_q8b32_s4_reference on the int8 codes (groups a
//     multiple of 32, or one group; other groups run the exact GEMV below, with the reason); above
//     it gemm_q8s8gf32_n16k4_avx512vnni (the same results in register tiles: a call of M rows
//     equals M one-row calls), else linear_f32_dequant_gemm;
//   - exact (linear_f32s8g_kernels(), float activations): gemv_f32s8gf32_n16k4_avx512 ->
//     gemv_f32s8gf32_n16k4_avx2 -> reference for M <= kWeightOnlyMaxM, bit-identical to
//     linear_f32_s4_reference on the int8 codes (groups a multiple of 4, or one group); above it
//     linear_f32_dequant_gemm.
// x dense float [M, K], y dense float [M, N].
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/linear_weight_only.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

// One call as the tables see it (x null when planning).
struct LinearS8GProblem {
  const float* x = nullptr;
  int64_t m = 0;
  S8GroupView w;
  const float* bias = nullptr;
  float* y = nullptr;
};

// The exact GEMV entry of the decode table, for groups the blocks cannot split.
inline constexpr const char* kExactS8GGemvKernel = "linear_f32s8gf32";

const KernelTable<LinearS8GProblem>& linear_q8s8g_kernels();
const KernelTable<LinearS8GProblem>& linear_f32s8g_kernels();

void linear_q8b32s8gf32(const float* x, int64_t M, const S8GroupView& w, const float* bias, float* y,
                        RunInfo* info = nullptr);
void linear_f32s8gf32(const float* x, int64_t M, const S8GroupView& w, const float* bias, float* y,
                      RunInfo* info = nullptr);

// Plain [N, G] scales (exact) and zero points of a view, with its codes [N, K] (reference runners, tests).
struct S8GUnpacked {
  std::vector<int8_t> codes;
  std::vector<float> scale;
  std::vector<int32_t> zero;
};
S8GUnpacked unpack_s8g(const S8GroupView& w);

}  // namespace qforge::kernels
