// QF_HOST_DEVICE and the correctly rounded float operations the shared kernel formulas use, so a
// header compiles both with nvcc (device code) and with the host C++ compiler (CPU tests).
// On the device the explicit _rn intrinsics keep every operation rounded once even under
// --use_fast_math or FMA contraction; on the host the library is built with -ffp-contract=off.
#pragma once

#include <cmath>

// Same definition as fake_quant/fake_quant_math.h (an identical redefinition is allowed).
#if defined(__CUDACC__)
#define QF_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define QF_HOST_DEVICE inline
#endif

namespace qforge::cuda {

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float qf_mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float qf_div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float qf_fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ float qf_i2f_rn(int v) { return __int2float_rn(v); }
// rintf rounds half to even, as std::nearbyint does in the default rounding mode.
__device__ __forceinline__ float qf_nearbyint(float v) { return rintf(v); }
#else
inline float qf_mul_rn(float a, float b) { return a * b; }
inline float qf_div_rn(float a, float b) { return a / b; }
inline float qf_fma_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float qf_i2f_rn(int v) { return static_cast<float>(v); }
inline float qf_nearbyint(float v) { return std::nearbyint(v); }
#endif

}  // namespace qforge::cuda
