// Codebook (look-up-table) Linear for k-means ("non-uniform") weights, weight-only (float
// activations); packed at freeze, run many times (kernels/cpu/lut_linear.cpp dispatches):
//
//   W[n, k]  = C[n, k / group_size, idx[n, k]]          (idx < L = 2^bits, bits 2, 3 or 4)
//   y[m, n]  = sum_k x[m, k] * W[n, k] + bias[n]
//
// in the float operation order of linear_f32_lut_reference (kernels/cpu/reference.h), which every
// fast kernel reproduces bit for bit: 16 lanes x P planes of fmaf accumulators over blocks of
// B = 16 * P values (s = 4 stored bits for bits 3 and 4, P = 2, B = 32; s = 2 for bits 2, P = 4,
// B = 64), planes summed in order, then the lanes pairwise at widths 8, 4, 2, 1, then the bias.
//
// Packed layout, per row n, per block of B values (Kp = K rounded up to B; indices beyond K are
// 0), 16 bytes:
//   byte j, bits [a*s, (a+1)*s) = idx[n, b*B + a*16 + j]        (plane a < P, lane j < 16)
// e.g. 4-bit: byte j = idx[k0 + j] | idx[k0 + 16 + j] << 4. The kernels zero-extend the 16 bytes
// to 16 int32 lanes and, per plane, shift right by a*s and look the lanes up in a 16-entry float
// table T[n, g, e] = C[n, g, e mod L] with VPERMPS (gemv_f32lut_avx512; two VPERMPS and a blend on
// index bit 3 in gemv_f32lut_avx2). VPERMPS reads only the low 4 bits, and the replication makes
// the bits of the planes above irrelevant, so no masking is needed. The tables [N, G, 16] float32
// are built at pack time. A block never straddles two groups: with G > 1, group_size must be a
// multiple of B.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/linear_weight_only.h"
#include "kernels/cpu/lut_layout.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

class PackedLinearLut;

// One call of the codebook Linear as its kernel table sees it (layer and x null when planning).
struct LutProblem {
  const PackedLinearLut* layer = nullptr;
  const float* x = nullptr;  // dense [m, K]
  int64_t m = 0;
  float* y = nullptr;        // dense [m, N]
};

// The ordered kernel table of PackedLinearLut::run: gemv_f32lut_avx512 -> gemv_f32lut_avx2 ->
// linear_f32lut_reference for M <= kWeightOnlyMaxM, then linear_f32_dequant_gemm.
const KernelTable<LutProblem>& lut_linear_kernels();

class PackedLinearLut {
 public:
  PackedLinearLut() = default;
  // indices: uint8 [N, K], each < 2^bits; codebook: float [N, G, 2^bits] (G = K / group_size),
  // finite; bias: float [N] or undefined. Throws qforge::Error for anything else (and whenever
  // supports() says no), naming the first bad index or codebook entry.
  PackedLinearLut(const at::Tensor& indices, const at::Tensor& codebook, int64_t group_size, int bits,
                  const at::Tensor& bias = {});

  // Whether the kernels take this shape: bits in {2, 3, 4}, group_size dividing K, and a multiple
  // of the block (32 values; 64 for 2 bits) when there is more than one group. *why says which.
  static bool supports(int bits, int64_t K, int64_t group_size, std::string* why);

  // x: float [..., K] -> float [..., N].
  at::Tensor run(const at::Tensor& x, RunInfo* info = nullptr) const;
  // x: dense float [M, K]; y: dense float [M, N].
  void run(const float* x, int64_t M, float* y, RunInfo* info = nullptr) const;

  int64_t in_features() const { return k_; }
  int64_t out_features() const { return n_; }
  int bits() const { return bits_; }
  int64_t group_size() const { return group_size_; }
  int64_t groups() const { return groups_; }
  // Bytes of every buffer held: packed indices (N * Kp * s / 8), float32 tables (N * G * 16 * 4),
  // bias (N * 4).
  int64_t bytes() const;

  // The packed buffers as the ISA kernels read them (x, m, ldx, y and ldy left to the caller).
  detail::LutArgs kernel_args() const;

  at::Tensor indices() const;   // unpacked uint8 [N, K]
  at::Tensor codebook() const;  // float [N, G, 2^bits] (not the replicated tables)
  const at::Tensor& bias() const { return bias_; }

 private:
  int64_t n_ = 0, k_ = 0, kp_ = 0, group_size_ = 0, groups_ = 0;
  int bits_ = 4;
  at::Tensor packed_;  // uint8 [N, Kp / B * 16]
  at::Tensor tables_;  // float [N, G, 16]: entry e = codebook[n, g, e mod 2^bits]
  at::Tensor bias_;
};

}  // namespace qforge::kernels
