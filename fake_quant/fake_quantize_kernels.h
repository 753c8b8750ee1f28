// Raw-pointer fake-quant kernels over contiguous float32 runs. Every function has a scalar
// reference twin (fake_quantize_reference.cpp) that defines its result; fast variants are picked
// at run time from an ordered list that ends at the reference.
#pragma once

#include <cstdint>
#include <string>

#include "fake_quant/fake_quant_math.h"

namespace qforge::fq {

// One contiguous run with one affine grid. mask may be null (no gradient needed).
using AffineRunFn = void (*)(const float* x, float* y, bool* mask, int64_t n, const AffineGrid& g);

// Rows of C elements where element c uses grid c (the channels-last case: scale per element of
// the innermost dimension). scale/inv_scale/zero_point have C entries.
using AffineRowsFn = void (*)(const float* x, float* y, bool* mask, int64_t rows, int64_t C,
                              const float* scale, const float* inv_scale, const float* zero_point,
                              float qmin, float qmax);

// dX = mask ? dY : 0
using MaskGradFn = void (*)(const float* dy, const bool* mask, float* dx, int64_t n);

// LSQ backward over one run (PyTorch _fake_quantize_learnable_*_backward per element): writes dX
// and returns the run's sums of dScale and dZeroPoint (accumulated in double).
struct LsqGrid {
  float scale;
  float inv_scale;
  float zero_point;  // already rounded/clamped the way PyTorch's backward does
  float quant_min;
  float quant_max;
  float grad_factor;
};
struct LsqSums {
  double dscale = 0.0;
  double dzero_point = 0.0;
};
// Elements per LSQ backward chunk: partial sums are kept per chunk and added in chunk order (CPU
// and CUDA alike), so the result does not depend on the thread count.
constexpr int64_t kLsqChunk = int64_t{1} << 14;
using LsqRunFn = LsqSums (*)(const float* x, const float* dy, float* dx, int64_t n, const LsqGrid& g);

struct FakeQuantKernels {
  const char* isa;  // "avx512", "avx2" or "reference"
  AffineRunFn affine_run;
  AffineRunFn affine_run_stream;  // same results, non-temporal stores for y
  AffineRowsFn affine_rows;
  MaskGradFn mask_grad;
  MaskGradFn mask_grad_stream;  // same results, non-temporal stores for dx
  LsqRunFn lsq_run;
};

// Scalar reference kernels.
void affine_run_reference(const float* x, float* y, bool* mask, int64_t n, const AffineGrid& g);
void affine_rows_reference(const float* x, float* y, bool* mask, int64_t rows, int64_t C,
                           const float* scale, const float* inv_scale, const float* zero_point,
                           float qmin, float qmax);
void mask_grad_reference(const float* dy, const bool* mask, float* dx, int64_t n);
LsqSums lsq_run_reference(const float* x, const float* dy, float* dx, int64_t n, const LsqGrid& g);
void float8_run_reference(const float* x, float* y, bool* mask, int64_t n, float scale,
                          const Float8Format& f);
// E2M1 elements with one given scale (a microscaling block): fake_quantize_e2m1_value per element.
void e2m1_run_reference(const float* x, float* y, bool* mask, int64_t n, float scale);
// The microscaling formats from the definition: n values (a multiple of block) fake-quantized
// block by block, each block's scale from its own amax (MXFP4: block 32, E8M0; NVFP4: block 16,
// E4M3 times tensor_scale); the block scales are written to scales (n / block) when non-null.
void microscaling_run_reference(const float* x, float* y, int64_t n, int block, bool nvfp4, float tensor_scale,
                                float* scales);

// Vectorised kernel sets, present only when compiled with the ISA (nullptr otherwise).
const FakeQuantKernels* avx512_kernels();
const FakeQuantKernels* avx2_kernels();
const FakeQuantKernels& reference_kernels();

// The fastest set this CPU runs, capped by qforge::set_max_isa() / the QFORGE_MAX_ISA environment
// variable (framework/core/isa.h; avx512vnni counts as avx512 here).
const FakeQuantKernels& active_kernels();

}  // namespace qforge::fq
