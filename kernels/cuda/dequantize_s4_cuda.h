// CUDA dequantization of frozen int4 weights (dense row-major nibbles, low nibble first, as
// pack_s4_reference / pack_u4_reference) to float [N, K]:
//   w[n, k] = float(q[n, k] - z[n, g]) * s[n, g]       g = k / group_size
// evaluated by dequantize_s4_at (unpack_s4_math.h); or from the tiled layout the tensor-core GEMV
// reads (repack_s4_tiles_cuda). Tested on a GPU by tests/cuda/cuda_kernels_test.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace qforge::cuda {

// packed: ceil(N * K / 2) bytes; is_signed: qint4 (sign-extend) or quint4 (zero-extend);
// scale [N, G] fp16-exact floats, zero [N, G] int32 or null, G = ceil(K / group_size);
// w [N, K] float. Device pointers, stream-ordered.
// tiled: packed is in the tiled layout (s4_tiled_index, unpack_s4_math.h; K a multiple of 128).
void dequantize_s4_cuda(const uint8_t* packed, int64_t N, int64_t K, bool is_signed,
                        const float* scale, const int32_t* zero, int64_t group_size, float* w,
                        cudaStream_t stream, bool tiled = false);

// The dense codes of an [N, K] int4 weight (ceil(N * K / 2) bytes) rearranged into the tiled
// layout the tensor-core GEMV reads (s4_tiled_bytes(N, K) bytes, padding rows zero). K must be a
// multiple of 128. Device pointers, stream-ordered; packed and tiled must not overlap.
void repack_s4_tiles_cuda(const uint8_t* packed, int64_t N, int64_t K, uint8_t* tiled, cudaStream_t stream);

}  // namespace qforge::cuda
