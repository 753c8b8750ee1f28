// QSpec (how to quantize) and QParams (scale and zero point that do it), and the formulas that
// turn observed min/max into QParams. Formulas are in docs/numerics.md; they reproduce PyTorch's
// `ObserverBase._calculate_qparams` bit for bit.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "framework/core/qtype.h"

namespace qforge {

enum class Granularity : uint8_t { kPerTensor, kPerChannel, kPerGroup };

const char* to_string(Granularity g);
Granularity granularity_from_name(const std::string& name);
std::vector<std::string> granularity_names();  // "per_tensor", "per_channel", "per_group"

// Smallest scale any formula returns: torch.finfo(torch.float32).eps, as PyTorch's observers use.
inline constexpr float kScaleEps = 1.1920928955078125e-07f;

// What grid, how coarse, and how the range maps onto it.
struct QSpec {
  QType qtype = qint8;
  Granularity granularity = Granularity::kPerTensor;
  int64_t axis = 0;          // per-channel: the channel dimension
  int64_t group_size = 0;    // per-group: elements per group along the last dimension
  bool symmetric = false;    // zero point fixed (0 for signed, midpoint for unsigned)
  bool narrow_range = false; // drop the lowest level: qint8 becomes [-127, 127]
  bool reduce_range = false; // one bit less of range (PyTorch's reduce_range, for VPMADDUBSW overflow)

  // The integer range actually used, after narrow_range / reduce_range.
  int64_t quant_min() const;
  int64_t quant_max() const;
  // True when the range differs from the qtype's full range (PyTorch's has_customized_qrange).
  bool custom_range() const { return narrow_range || reduce_range; }
  // Validates the combination; throws qforge::Error naming the problem.
  void validate() const;
  std::string to_string() const;
};

// Scale and zero point. Per-tensor: 0-dim tensors. Per-channel: shape [C]. Per-group: the input's
// shape with the last dimension divided by group_size. scale is float32, zero_point int32.
// Codebook qtypes (qkmeans*) have no scale or zero point: `codebook` holds the levels instead,
// float32 of the qparam shape plus one last dimension of 2^bits entries (codebook_shape), and
//   float = codebook[..., code]
// with code the index of the nearest level (docs/numerics.md, "k-means weights").
// Microscaling qtypes (mxfp4, nvfp4) are per_group with the format's block size: scale holds
// each block's float32 scale, computed from the block itself (docs/formats.md), zero_point is 0.
struct QParams {
  QSpec spec;
  at::Tensor scale;
  at::Tensor zero_point;
  at::Tensor codebook{};  // codebook qtypes only
  // nvfp4 only: the per-tensor float32 scale g (0-dim); scale then holds e4m3(block) * g per block.
  at::Tensor tensor_scale{};

  bool defined() const { return scale.defined() || codebook.defined(); }
  // A per-tensor grid's scale and zero point as numbers: read from the CPU tensors directly (no ATen
  // call, which a per-call kernel's setup would pay at every layer), converted otherwise.
  float scale_value() const;
  int64_t zero_point_value() const;
};

// min/max (float32, shape as the QParams shape) to QParams. Throws when min > max anywhere or
// either is not finite (an observer that saw nothing, or only NaN/inf).
QParams calculate_qparams(const at::Tensor& min_val, const at::Tensor& max_val, const QSpec& spec);

// The shape of scale / zero_point for a tensor of `shape` under spec: [] per tensor, [C] per
// channel, `shape` with the last dimension divided by group_size per group.
std::vector<int64_t> qparam_shape(const QSpec& spec, const std::vector<int64_t>& shape);

// The shape of a codebook for a tensor of `shape` under a codebook spec: the qparam shape plus
// the 2^bits levels ([C, L] per channel, [..., G, L] per group, [L] per tensor).
std::vector<int64_t> codebook_shape(const QSpec& spec, at::IntArrayRef sizes);

// Codebook QParams from explicit levels: float32 of codebook_shape, every value finite and
// exactly representable in float16 (how files and frozen layers store them). Errors name the
// first offending entry.
QParams make_codebook_qparams(const QSpec& spec, const at::Tensor& codebook, at::IntArrayRef sizes);

// Every field equal (same grid, granularity, axis, group size and range).
bool same_spec(const QSpec& a, const QSpec& b);

// QParams from explicit values, checked for shape and range.
QParams make_qparams(const QSpec& spec, const at::Tensor& scale, const at::Tensor& zero_point);

// The shape scale/zero_point must have for `input_sizes` under `spec`, or an error naming both.
std::vector<int64_t> qparams_shape(const QSpec& spec, at::IntArrayRef input_sizes);

}  // namespace qforge
