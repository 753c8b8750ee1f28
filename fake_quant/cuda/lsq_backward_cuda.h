// LSQ / LSQ+ backward on the GPU: the CUDA twin of the CPU's lsq_backward_rows (fake_quant/lsq.cpp)
// over x viewed as [C, inner] (one contiguous run per channel, channel c on grids[c]):
//   dx[c, i]  = lsq_run_reference's per element (in range: dy; clamped: 0), bit for bit;
//   dscale[c] / dzero_point[c] = the element terms of lsq_run_reference (the same float
//               operations), summed in double per chunk of kLsqChunk elements in a fixed tree,
//               the chunks then added in chunk order in double, rounded once to float.
// The CPU sums each chunk sequentially instead, so the sums agree to double rounding (the tests
// allow one float ulp plus 2^-40 of the sum of |terms|), not to the bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fake_quant/fake_quantize_kernels.h"

namespace qforge::cuda {

// Elements per chunk: the CPU's kChunk (fake_quant/lsq.cpp), so both split a channel alike.
constexpr int64_t kLsqChunk = int64_t{1} << 14;

// Doubles the partial sums need: 2 per (channel, chunk).
inline int64_t lsq_backward_workspace_doubles(int64_t C, int64_t inner) {
  const int64_t chunks = inner > 0 ? (inner + kLsqChunk - 1) / kLsqChunk : 1;
  return 2 * C * chunks;
}

// x, dy, dx [C, inner] float; grids [C] (device memory); dscale, dzero_point [C] float;
// workspace lsq_backward_workspace_doubles(C, inner) doubles. Device pointers, stream-ordered.
cudaError_t lsq_backward_rows(const float* x, const float* dy, float* dx, int64_t C, int64_t inner,
                              const fq::LsqGrid* grids, float* dscale, float* dzero_point, double* workspace,
                              cudaStream_t stream);

}  // namespace qforge::cuda
