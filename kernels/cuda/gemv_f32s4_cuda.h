// The int4 weight-only GEMV on the GPU, for decode-sized calls of a frozen int4 Linear:
//   y[m, n] = (bias ? bias[n] : 0) + sum over the lanes' chunks c of row n (8, 16 or 32 codes):
//               s[n, g(c)] * ( sum_{k in c} x[m, k] * float(q[n, k] - z[n, g(c)]) )
// with the codes in the CPU packing (dense row-major nibbles, low nibble first, as
// pack_s4_reference / pack_u4_reference), scales s [N, G] and optional zero points z [N, G],
// G = ceil(K / group_size). Float arithmetic: the products of a lane's 8, 16 or 32 codes are
// summed with fmaf in k order, scaled with one fmaf into the lane's accumulator; lanes and warps
// are then added in a fixed tree. The order differs from linear_f32_s4_reference (which sums a whole group first), so
// the result is not that reference's to the bit; docs/kernels.md states the bound the tests hold:
//   |y - exact| <= (K / 8 + 64) * 2^-24 * (sum_k |x[m, k] * w[n, k]| + |bias[n]|)
// Memory-bound: the weight is read once per call, 4.5 bits per weight with g128 scales.
// Tested on a GPU by tests/cuda/cuda_kernels_test; rules in gemv_s4_rules.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace qforge::cuda {

// x [M, K] float (16-byte aligned, rows dense), packed ceil(N * K / 2) bytes (4-byte aligned),
// is_signed: qint4 (sign-extend) or quint4 (zero-extend), scale [N, G] float, zero [N, G] int32
// or null, bias [N] or null, y [M, N] float. Device pointers, stream-ordered. Throws
// qforge::Error when gemv_f32s4_supported / gemv_f32s4_pointers_supported refuse the call.
void gemv_f32s4_cuda(const float* x, int64_t M, const uint8_t* packed, int64_t N, int64_t K, bool is_signed,
                     const float* scale, const int32_t* zero, int64_t group_size, const float* bias, float* y,
                     cudaStream_t stream);

}  // namespace qforge::cuda
