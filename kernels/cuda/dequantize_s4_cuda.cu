// int4 weight unpack + dequantization on the GPU (see dequantize_s4_cuda.h).
#include "kernels/cuda/dequantize_s4_cuda.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/unpack_s4_math.h"

namespace qforge::cuda {
namespace {

// kTiled: the codes are in the tiled layout, the code's value index s4_tiled_index(n, k, K).
template <bool kTiled>
__global__ void dequantize_s4_kernel(const uint8_t* packed, int64_t N, int64_t K, bool is_signed,
                                     const float* scale, const int32_t* zero, int64_t group_size,
                                     int64_t G, float* w) {
  const int64_t total = N * K;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    if constexpr (kTiled) {
      const int64_t n = i / K, k = i % K, gi = n * G + k / group_size;
      const int q = s4_value_at(packed, s4_tiled_index(n, k, K), is_signed);
      w[i] = dequantize_s4_value(q, zero != nullptr ? zero[gi] : 0, scale[gi]);
    } else {
      w[i] = dequantize_s4_at(packed, i / K, i % K, K, is_signed, scale, zero, group_size, G);
    }
  }
}

// One tiled byte per step: its two codes are consecutive k of one row (K even), so they are one
// byte of the dense layout too; padding rows are zero.
__global__ void repack_s4_tiles_kernel(const uint8_t* packed, int64_t N, int64_t K, uint8_t* tiled,
                                       int64_t bytes) {
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < bytes;
       b += int64_t{gridDim.x} * blockDim.x) {
    int64_t n = 0, k = 0;
    s4_tiled_coords(b * kS4PerByte, K, &n, &k);
    tiled[b] = n < N ? packed[(n * K + k) / kS4PerByte] : uint8_t{0};
  }
}

}  // namespace

void dequantize_s4_cuda(const uint8_t* packed, int64_t N, int64_t K, bool is_signed,
                        const float* scale, const int32_t* zero, int64_t group_size, float* w,
                        cudaStream_t stream, bool tiled) {
  QF_REQUIRE(N >= 0 && K >= 0 && group_size > 0, "kernels/cuda: dequantize_s4_cuda got N=", N,
             " K=", K, " group_size=", group_size);
  QF_REQUIRE(!tiled || K % kS4TileK == 0, "kernels/cuda: dequantize_s4_cuda: tiled codes need K a multiple of ",
             kS4TileK, ", got K=", K);
  if (N == 0 || K == 0) return;
  const int64_t G = (K + group_size - 1) / group_size;
  const auto kernel = tiled ? dequantize_s4_kernel<true> : dequantize_s4_kernel<false>;
  kernel<<<grid_stride_blocks(N * K), kGridStrideThreads, 0, stream>>>(packed, N, K, is_signed, scale, zero,
                                                                       group_size, G, w);
  check_cuda(cudaGetLastError(), "dequantize_s4_cuda launch");
}

void repack_s4_tiles_cuda(const uint8_t* packed, int64_t N, int64_t K, uint8_t* tiled, cudaStream_t stream) {
  QF_REQUIRE(N >= 0 && K >= 0 && K % kS4TileK == 0, "kernels/cuda: repack_s4_tiles_cuda: K=", K,
             " not a multiple of ", kS4TileK, " (or N=", N, " negative)");
  const int64_t bytes = s4_tiled_bytes(N, K);
  if (bytes == 0) return;
  repack_s4_tiles_kernel<<<grid_stride_blocks(bytes), kGridStrideThreads, 0, stream>>>(packed, N, K, tiled, bytes);
  check_cuda(cudaGetLastError(), "repack_s4_tiles_cuda launch");
}

}  // namespace qforge::cuda
