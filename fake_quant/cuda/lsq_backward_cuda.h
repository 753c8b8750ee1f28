// LSQ / LSQ+ backward on the GPU: the CUDA twin of the CPU's lsq_backward_rows (fake_quant/lsq.cpp)
// over x viewed as [C, inner] (one contiguous run per channel, channel c on grids[c]):
//   dx[c, i]  = lsq_run_reference's per element (in range: dy; clamped: 0), bit for bit;
//   dscale[c] / dzero_point[c] = the element terms of lsq_run_reference (the same float
//               operations), summed in double per chunk of fq::kLsqChunk elements in a fixed tree,
//               the chunks then added in chunk order in double, rounded once to float.
// Deterministic. The CPU reference sums each chunk sequentially in double, so the two agree to
// double rounding (one float ulp plus 2^-38 of the sum of |terms|); the CPU's vector kernels add in
// float lanes flushed to double every 64 vectors (fake_quantize_simd.h), so against them the sums
// agree within about 2^-16 of the sum of |terms|. Neither is bit-equal.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fake_quant/fake_quantize_kernels.h"

namespace qforge::cuda {

// Doubles the partial sums need: 2 per (channel, chunk).
inline int64_t lsq_backward_workspace_doubles(int64_t C, int64_t inner) {
  const int64_t chunks = inner > 0 ? (inner + fq::kLsqChunk - 1) / fq::kLsqChunk : 1;
  return 2 * C * chunks;
}

// x, dy, dx [C, inner] float; grids [C] (device memory); dscale, dzero_point [C] float;
// workspace lsq_backward_workspace_doubles(C, inner) doubles. Device pointers, stream-ordered.
cudaError_t lsq_backward_rows(const float* x, const float* dy, float* dx, int64_t C, int64_t inner,
                              const fq::LsqGrid* grids, float* dscale, float* dzero_point, double* workspace,
                              cudaStream_t stream);

}  // namespace qforge::cuda
