// Frozen Linear layers: weights packed once (at freeze) for the fast kernels, then run() many
// times. run() quantizes the float activations dynamically to int8 (quantize_rows_s8), picks the
// fastest usable kernel, and reports in RunInfo which kernel ran and why faster ones were skipped.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>

#include "framework/core/qtype.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

struct S4Unpacked;  // gemv_s4.h

namespace detail {
class OneDnnS8Weights;
}

struct PackOptions {
  // Also keep a copy of the int8 weights in oneDNN's preferred blocked format for the large-M
  // path (M >= kOneDnnMinM). Costs N*K more bytes; without it large M uses the GEMV kernels.
  bool onednn = true;
};

// Largest K of PackedLinearS8: |sum_k a * w| <= 127 * 128 * K must fit int32.
inline constexpr int64_t kMaxInFeaturesS8 = (int64_t{1} << 31) / (127 * 128);

// Smallest M that goes to oneDNN's matmul; below it the n16k4 GEMV kernels are faster
// (measured crossover, docs/kernels.md): 8 when oneDNN runs on AMX tiles, 32 otherwise.
inline constexpr int64_t kOneDnnMinMAmx = 8;
inline constexpr int64_t kOneDnnMinM = 32;

// int8 Linear: y = dequant(quant(x) . W^T) + bias, W int8 [N, K] with per-channel scale [N]
// (symmetric, zero point 0). Results equal quantize_rows_s8_reference + gemm_s8s8s32_reference +
// dequantize_s32_f32_reference bit for bit, whatever kernel runs.
class PackedLinearS8 {
 public:
  PackedLinearS8() = default;
  // weight: int8 [N, K]; w_scale: float [N]; bias: float [N] or undefined.
  PackedLinearS8(const at::Tensor& weight, const at::Tensor& w_scale, const at::Tensor& bias = {},
                 const PackOptions& options = {});

  // x: float [..., K] -> float [..., N].
  at::Tensor run(const at::Tensor& x, RunInfo* info = nullptr,
                 ActScale act_scale = ActScale::kPerRow) const;
  // x: dense float [M, K]; y: dense float [M, N]. act_qmax: the rows' grid [-act_qmax, act_qmax]
  // (quantize_rows_s8; 7 runs W4A4's qint4 rows as int8 codes); act_clip: their range as a
  // fraction of their amax (QuaRot's clipping; 1: none).
  void run(const float* x, int64_t M, float* y, RunInfo* info = nullptr,
           ActScale act_scale = ActScale::kPerRow, int act_qmax = kActQMax, float act_clip = 1.0f) const;

  // Weight-only: float activations, no activation quantization (linear_f32_s8_reference, bit
  // for bit). Slower than run() but without activation rounding error.
  at::Tensor run_weight_only(const at::Tensor& x, RunInfo* info = nullptr) const;
  // Static activations: int8 codes q dense [M, K] of one per-tensor scale a_scale (a calibrated
  // input quantizer's) -> y dense [M, N] (gemv_s8s8f32, no oneDNN copy used); allocates nothing warm.
  void run_static(const int8_t* q, int64_t M, float a_scale, float* y, RunInfo* info = nullptr) const;
  // Decode: float activations quantized to int8 in blocks of 32 per call, integer dot products
  // (linear_q8b32s8f32; linear_q8b32_s8_reference bit for bit up to kWeightOnlyMaxM rows, and above
  // where AVX-512 VNNI runs the block-32 GEMM; else the exact weight-only result above).
  at::Tensor run_decode(const at::Tensor& x, RunInfo* info = nullptr) const;

  int64_t in_features() const { return k_; }
  int64_t out_features() const { return n_; }
  // Bytes of every buffer held: packed weights, column sums, scales, bias, oneDNN copy.
  int64_t bytes() const;
  bool has_onednn() const { return onednn_ != nullptr; }
  // M from which run() prefers oneDNN (kOneDnnMinMAmx or kOneDnnMinM).
  int64_t onednn_min_m() const { return onednn_min_m_; }
  // Why the oneDNN copy is absent (empty when present).
  const std::string& onednn_status() const { return onednn_status_; }

  at::Tensor weight() const;  // unpacked int8 [N, K]
  const at::Tensor& w_scale() const { return w_scale_; }
  const at::Tensor& bias() const { return bias_; }
  S8N16K4View view() const;

 private:
  int64_t n_ = 0, k_ = 0;
  at::Tensor packed_, colsum_, w_scale_, bias_;
  std::shared_ptr<const detail::OneDnnS8Weights> onednn_;
  std::string onednn_status_;
  int64_t onednn_min_m_ = kOneDnnMinM;
};

// int4 Linear: y = dequant(quant(x) . (W - z)^T) + bias with per-group scales and optional zero
// points (gemm_s8s4f32_reference semantics, bit for bit). W holds grid values of `qtype` (qint4:
// [-8, 7], quint4: [0, 15]) one per int8 element; groups of group_size along K (group_size >= K
// is per-channel).
class PackedLinearS4 {
 public:
  PackedLinearS4() = default;
  // weight: int8 [N, K]; w_scale: float [N, G] (or [N] when G == 1), every value finite and
  // exactly representable as IEEE float16 (stored as fp16; qforge::Error names the first [n, g]
  // that is not); w_zero: integer [N, G] in the qtype's grid, or undefined for zero points 0.
  // layout kN16B32 asks for the one-stream form of qint4 groups of 32 (Q4_0's), zero points 0, or
  // -1 beside positive scales (a negative block scale as gguf load keeps it, stored folded); a
  // weight that does not fit it stays n16k8 and layout_status() says why.
  PackedLinearS4(const at::Tensor& weight, const at::Tensor& w_scale, const at::Tensor& w_zero,
                 int64_t group_size, const at::Tensor& bias = {}, QType qtype = qint4,
                 S4Layout layout = S4Layout::kN16K8);

  at::Tensor run(const at::Tensor& x, RunInfo* info = nullptr,
                 ActScale act_scale = ActScale::kPerRow) const;
  // As PackedLinearS8::run (act_qmax, act_clip likewise).
  void run(const float* x, int64_t M, float* y, RunInfo* info = nullptr,
           ActScale act_scale = ActScale::kPerRow, int act_qmax = kActQMax, float act_clip = 1.0f) const;

  // Weight-only: float activations, no activation quantization (linear_f32_s4_reference, bit
  // for bit).
  at::Tensor run_weight_only(const at::Tensor& x, RunInfo* info = nullptr) const;
  // Static activations, as PackedLinearS8::run_static (gemv_s8s4f32).
  void run_static(const int8_t* q, int64_t M, float a_scale, float* y, RunInfo* info = nullptr) const;
  // Decode: as PackedLinearS8::run_decode (linear_q8b32s4f32, linear_q8b32_s4_reference).
  at::Tensor run_decode(const at::Tensor& x, RunInfo* info = nullptr) const;

  int64_t in_features() const { return k_; }
  int64_t out_features() const { return n_; }
  int64_t group_size() const { return group_size_; }
  int64_t groups() const { return groups_; }
  QType qtype() const { return qtype_; }
  // Bytes of every buffer held: Np * Kp / 2 packed codes, Np * G * (2 fp16 scale + 1 zero code),
  // bias (n16b32: Np / 16 * ceil(G / 2) * 576 bytes of codes and scales, bias).
  int64_t bytes() const;
  S4Layout layout() const { return layout_; }
  // Why an n16b32 request packed n16k8 ("" otherwise).
  const std::string& layout_status() const { return layout_status_; }

  // What the constructor received, exactly (an n16b32 form's folded signs unfolded).
  at::Tensor weight() const;  // unpacked grid values, int8 [N, K]
  at::Tensor w_scale() const;  // float [N, G], exact
  at::Tensor w_zero() const;   // int32 [N, G] zero points (0 where none were given)
  const at::Tensor& bias() const { return bias_; }
  S4N16K8View view() const;

 private:
  std::string fold_for_n16b32(at::Tensor* w, at::Tensor* s, at::Tensor* z);
  void to_n16b32();
  S4Unpacked unpacked() const;

  int64_t n_ = 0, k_ = 0, group_size_ = 0, groups_ = 0;
  QType qtype_ = qint4;
  at::Tensor packed_, scales_, zeros_, bias_;
  S4Layout layout_ = S4Layout::kN16K8;
  std::string layout_status_;
  bool signs_folded_ = false;  // n16b32 blocks with a negative stored scale came with zero point -1
};

// int8 Linear with a scale (and optional zero point) per column and group along K: GGUF's Q8_0
// blocks and qforge's per-group qint8. Weight-only: run_weight_only (float activations,
// linear_f32_s4_reference's formula on the int8 codes) and run_decode (block-32 int8 activations,
// linear_q8b32_s4_reference's), through linear_s8g.h's tables. Scales are kept as fp16 when every
// one is exactly a float16 (Q8_0's are), else as float.
class PackedLinearS8G {
 public:
  PackedLinearS8G() = default;
  // weight: int8 [N, K]; w_scale: float [N, G] (finite, positive or negative); w_zero: integer
  // [N, G] in [-128, 127], or undefined for zero points 0; bias: float [N] or undefined.
  PackedLinearS8G(const at::Tensor& weight, const at::Tensor& w_scale, const at::Tensor& w_zero, int64_t group_size,
                  const at::Tensor& bias = {});

  at::Tensor run_weight_only(const at::Tensor& x, RunInfo* info = nullptr) const;
  at::Tensor run_decode(const at::Tensor& x, RunInfo* info = nullptr) const;

  int64_t in_features() const { return k_; }
  int64_t out_features() const { return n_; }
  int64_t group_size() const { return group_size_; }
  int64_t groups() const { return groups_; }
  bool fp16_scales() const { return scales16_.defined(); }
  // Np * Kp codes, Np * G scales (2 or 4 bytes) and zero points (when any is nonzero), bias.
  int64_t bytes() const;

  at::Tensor weight() const;  // unpacked codes, int8 [N, K]
  const at::Tensor& bias() const { return bias_; }
  S8GroupView view() const;

 private:
  int64_t n_ = 0, k_ = 0, group_size_ = 0, groups_ = 0;
  at::Tensor packed_, scales16_, scales32_, zeros_, bias_;
};

}  // namespace qforge::kernels
