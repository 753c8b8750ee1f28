// Device pieces the CUDA-core GEMVs share (gemv_f32s4_cuda, gemv_f32s8_cuda): the streaming load
// of a lane's weight words. Device code only: include from .cu files. (Their block reductions are
// alike too, but a shared form changed ptxas's register allocation of the measured kernels, so it
// waits for a GPU to re-time them.)
#pragma once

#include <cstdint>

namespace qforge::cuda::gemv {

// kWords consecutive 32-bit words in one load (16, 8 or 4 bytes), streamed past L1 (read once).
template <int kWords>
__device__ __forceinline__ void load_words(const uint32_t* p, uint32_t (&w)[kWords]) {
  if constexpr (kWords == 4) {
    const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (kWords == 2) {
    const uint2 v = __ldcs(reinterpret_cast<const uint2*>(p));
    w[0] = v.x, w[1] = v.y;
  } else {
    w[0] = __ldcs(p);
  }
}

}  // namespace qforge::cuda::gemv
