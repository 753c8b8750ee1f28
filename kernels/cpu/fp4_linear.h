// MXFP4 / NVFP4 weight-only Linear: float activations times E2M1 codes with one float32 scale per
// block of B values along K (B = 32 for MXFP4, 16 for NVFP4), packed at freeze:
//
//   W[n, k]  = e2m1(code[n, k]) * scale[n, k / B]            (e2m1: kE2M1Values, framework/core/qtype.h)
//   y[m, n]  = sum_b scale[n, b] * (sum_{k in block b} x[m, k] * e2m1(code[n, k])) + bias[n]
//
// in the float order of linear_f32fp4_reference, which gemv_f32fp4_avx2 reproduces bit for bit:
//   acc[l] = 0                                                  (l < 8)
//   per block b: t[l] = 0;  for c < B / 8: k = b*B + 8c + l;  t[l] = fmaf(x[m, k], e2m1(code[n, k]), t[l])
//                acc[l] = fmaf(scale[n, b], t[l], acc[l])
//   for w = 4, 2, 1: for l < w: acc[l] = acc[l] + acc[l + w];   y = bias ? acc[0] + bias[n] : acc[0]
// Calls of more than kWeightOnlyMaxM rows dequantize W once and run linear_f32_dequant_gemm.
// Against the fake-quant product at::linear(x, W, bias), whose W[n, k] is the rounded float32
// product e2m1 * scale, the difference is summation order and that one rounding (none for MXFP4's
// powers of two): |y - y_fq| <= 2 gamma_(K+2) (sum_k |x[m, k] W[n, k]| + |bias[n]|), with
// gamma_n = n u / (1 - n u), u = 2^-24.
//
// Packed layout, per row n, per chunk of 16 values k0 .. k0 + 15 (k0 a multiple of 16), 8 bytes:
//   byte j = code[n, k0 + j] | code[n, k0 + 8 + j] << 4          (j < 8)
// The AVX2 kernel widens 8 bytes to 8 int32 lanes, takes the low and the high nibbles as two vectors
// of codes and decodes each with one VPERMPS over the 8 magnitudes and a sign flip from bit 3.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "kernels/cpu/fp4_layout.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

class PackedLinearFp4;

// One call as its kernel table sees it (layer and x null when planning).
struct Fp4Problem {
  const PackedLinearFp4* layer = nullptr;
  const float* x = nullptr;  // dense [m, K]
  int64_t m = 0;
  float* y = nullptr;        // dense [m, N]
};

// gemv_f32fp4_avx2 -> linear_f32fp4_reference for M <= kWeightOnlyMaxM, then linear_f32_dequant_gemm.
const KernelTable<Fp4Problem>& fp4_linear_kernels();

class PackedLinearFp4 {
 public:
  // codes: uint8 [N, K] E2M1 codes (< 16); scales: float [N, K / block], finite and > 0; block a
  // multiple of 16 dividing K; bias: float [N] or undefined. Throws qforge::Error otherwise.
  PackedLinearFp4(const at::Tensor& codes, const at::Tensor& scales, int64_t block, const at::Tensor& bias = {});

  // Whether the kernels take this shape (block a multiple of 16 dividing K); *why says which.
  static bool supports(int64_t K, int64_t block, std::string* why);

  at::Tensor run(const at::Tensor& x, RunInfo* info = nullptr) const;  // float [..., K] -> [..., N]
  void run(const float* x, int64_t M, float* y, RunInfo* info = nullptr) const;

  int64_t in_features() const { return k_; }
  int64_t out_features() const { return n_; }
  int64_t block() const { return block_; }
  int64_t bytes() const;  // packed codes (N * K / 2), float32 scales (N * K / block * 4), bias
  detail::Fp4Args kernel_args() const;
  at::Tensor codes() const;  // unpacked uint8 [N, K]
  const at::Tensor& scales() const { return scales_; }
  const at::Tensor& bias() const { return bias_; }

 private:
  int64_t n_ = 0, k_ = 0, block_ = 32;
  at::Tensor packed_;  // uint8 [N, K / 2]
  at::Tensor scales_;  // float [N, K / block]
  at::Tensor bias_;
};

}  // namespace qforge::kernels
