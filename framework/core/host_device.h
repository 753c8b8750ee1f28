// QF_HOST_DEVICE and the correctly rounded float operations the shared formulas use, so one
// header compiles both with nvcc (device code) and with the host C++ compiler (CPU kernels and
// tests). On the device the explicit _rn intrinsics keep every operation rounded once even under
// --use_fast_math or FMA contraction; on the host the libraries build with -ffp-contract=off.
// The one home of these helpers: fake_quant/fake_quant_math.h and kernels/cuda/*_math.h use them.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define QF_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define QF_HOST_DEVICE inline
#endif

namespace qforge {

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float qf_mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float qf_div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float qf_fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ float qf_i2f_rn(int v) { return __int2float_rn(v); }
// rintf rounds half to even, as std::nearbyint does in the default rounding mode.
__device__ __forceinline__ float qf_nearbyint(float v) { return rintf(v); }
__device__ __forceinline__ float qf_fabs(float v) { return fabsf(v); }
__device__ __forceinline__ float qf_ldexp(float v, int e) { return ldexpf(v, e); }
#else
inline float qf_mul_rn(float a, float b) { return a * b; }
inline float qf_div_rn(float a, float b) { return a / b; }
inline float qf_fma_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float qf_i2f_rn(int v) { return static_cast<float>(v); }
inline float qf_nearbyint(float v) { return std::nearbyint(v); }
inline float qf_fabs(float v) { return std::fabs(v); }
inline float qf_ldexp(float v, int e) { return std::ldexp(v, e); }
#endif

}  // namespace qforge
