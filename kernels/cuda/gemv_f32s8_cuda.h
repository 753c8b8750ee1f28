// The int8 weight-only GEMV on the GPU, for decode-sized calls of a frozen weight-only int8
// Linear (symmetric codes, one scale per output row):
//   T[m, n] = sum over the lanes' codes of x[m, k] * float(q[n, k])
//   y[m, n] = T[m, n] * s[n] + (bias ? bias[n] : 0)        (product rounded, then added)
// Float arithmetic: each lane sums its codes' products with fmaf in k order into one
// accumulator per (row of x, weight row); lanes and the block's warps are then added in a fixed
// tree. The order differs from linear_f32_s8_reference (one fmaf chain over k), so the result
// is not that reference's to the bit; the tests hold the bound
//   |y - exact| <= (K / 64 + 64) * 2^-24 * (sum_k |x[m, k] * s[n] * q[n, k]| + |bias[n]|)
// (a lane's chain has at most K / 128 + 16 terms, then 5 + 3 tree additions, the scale and the
// bias). The weight is read once per 8 rows of x (once per call at M <= 8), 8 bits per weight
// plus a float per row. Deterministic for a given M and codes alignment; the k order of a lane
// (16-, 8- or 4-byte steps) follows M and the alignment, so one row of x can round differently
// at another M.
// Tested on a GPU by tests/cuda/cuda_kernels_test; rules in gemv_s8_rules.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace qforge::cuda {

// x [M, K] float (16-byte aligned, rows dense), codes [N, K] int8 row-major (4-byte aligned),
// scale [N] float, bias [N] or null, y [M, N] float. Device pointers, stream-ordered. Throws
// qforge::Error when gemv_f32s8_supported / gemv_f32s8_pointers_supported refuse the call.
void gemv_f32s8_cuda(const float* x, int64_t M, const int8_t* codes, int64_t N, int64_t K, const float* scale,
                     const float* bias, float* y, cudaStream_t stream);

}  // namespace qforge::cuda
