// The int4 weight-only GEMV on tensor cores, for decode-sized calls (1 <= M <= 16) of a frozen
// int4 Linear whose K and group size are multiples of 128 (gemv_f32s4_mma_supported in
// gemv_s4_rules.h); gemv_f32s4_cuda serves the other shapes. Same operands and layout as
// gemv_f32s4_cuda (the CPU packing, scales [N, G], optional zero points [N, G]):
//   y[m, n] = (bias ? bias[n] : 0) + sum_k x[m, k] * float(q[n, k] - z[n, g(k)]) * s[n, g(k)]
// How it is computed (the bound below follows from it):
//   - each 128-wide block of k of row m of x is scaled by 2^e (e makes its largest |x| fall in
//     [2^14, 2^15); exact) and split into two fp16 halves, hi = fp16(x 2^e), lo = fp16(x 2^e - hi);
//   - q - z is exact in fp16; mma.sync m16n8k16 (fp16 products, fp32 accumulation) sums the
//     products of one 128-wide block (one scale group), which is then multiplied by 2^-e
//     (exact) and added with one fmaf times the scale s into a float accumulator;
//   - the partial sums of the 8 warps of a block (each owns every 8th 128-wide block of k) and
//     of hi and lo are added in a fixed order, then the bias: the result is deterministic.
// Stated bound (tests/cuda/cuda_kernels_test, GemvS4MmaMatchesReferenceWithinItsBound):
//   |y - exact| <= (K / 128 + 128) * 2^-24 * (sum_k |x[m, k] w[n, k]| + |bias[n]|)
//                  + 2^-38 * sum over blocks b of max_{k in b} |x[m, k]| * sum_{k in b} |w[n, k]|
// (the first term covers the tensor cores' truncating fp32 accumulation, at most a few units in
// the last place per mma, and the float adds; the second the fp16 split of x.) Requires zero
// points in [-1000, 1000] (int4 zero points lie in [-8, 15]) so that q - z is exact in fp16.
// Memory-bound: the weight is read once per call whatever M, 4.5 bits per weight with g128.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace qforge::cuda {

// x [M, K] float, packed ceil(N * K / 2) bytes, both 16-byte aligned; is_signed: qint4 or quint4;
// scale [N, G] float, zero [N, G] int32 or null, bias [N] or null, y [M, N] float. Device
// pointers, stream-ordered. Throws qforge::Error when gemv_f32s4_mma_supported /
// gemv_f32s4_mma_pointers_supported refuse the call or the device is older than sm_80.
// tiled: packed holds s4_tiled_bytes(N, K) bytes in the tiled layout (unpack_s4_math.h,
// repack_s4_tiles_cuda), the same codes read with one contiguous 512-byte run per warp load:
// the same result, bit for bit (H200, graph replays: 1.04-1.13 x faster at M = 1 and 4).
void gemv_f32s4_mma_cuda(const float* x, int64_t M, const uint8_t* packed, int64_t N, int64_t K, bool is_signed,
                         const float* scale, const int32_t* zero, int64_t group_size, const float* bias, float* y,
                         cudaStream_t stream, bool tiled = false);

// The same result, bit for bit, in two launches: x is first staged once per call into
// workspace (hi/lo fp16 already in the mma B-fragment order, with the per-block factors), so the
// GEMV reads B with one coalesced 16-byte load a lane instead of every block of weight rows
// scaling, splitting and permuting its own copy of x. Same rules and bound as
// gemv_f32s4_mma_cuda; workspace is a 16-byte aligned device buffer of
// gemv_f32s4_mma_staged_workspace_bytes(M, K) bytes, used in stream order.
void gemv_f32s4_mma_staged_cuda(const float* x, int64_t M, const uint8_t* packed, int64_t N, int64_t K,
                                bool is_signed, const float* scale, const int32_t* zero, int64_t group_size,
                                const float* bias, float* y, void* workspace, cudaStream_t stream,
                                bool tiled = false);
size_t gemv_f32s4_mma_staged_workspace_bytes(int64_t M, int64_t K);

// True when the current device has the tensor-core instructions the kernel uses (sm_80 or
// newer) and the build compiled them; otherwise false with the reason.
bool gemv_f32s4_mma_runs_here(std::string* why);

}  // namespace qforge::cuda
