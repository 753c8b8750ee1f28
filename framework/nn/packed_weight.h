// PackedWeight: the one interface a frozen Linear or convolution holds its weight behind (torchao's
// Layout classes, quanto's per-backend ops). freeze() packs the QuantizedTensor once for the
// layer's plan (int8, int4, look-up table, dequantize-per-call; convolutions in im2col order) and
// the layer forwards through it; device moves are the packed weight's to(device) (the CUDA form in
// framework/cuda/packed_weight_cuda.h keeps its CPU original for checkpoints and the way back).
// docs/architecture.md, "Packed weights: one interface", says how to add a format.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "framework/api/kernel_plan.h"
#include "framework/api/quantized_tensor.h"
#include "framework/api/quantizer.h"

namespace qforge::nn {

// What a frozen forward takes from its layer besides the input.
struct FrozenInput {
  Quantizer quantizer{nullptr};      // the layer's input quantizer (null: float activations)
  at::Tensor layer_bias;             // the bias the layer keeps itself (used when the packed weight holds none)
  bool relu = false;                 // convolutions: at::relu in the kernel's epilogue
  const QParams* requant = nullptr;  // convolutions: emit int8 codes of this static quantizer instead of floats
  // Integer convolutions: a residual added to the float output before the ReLU, in the epilogue
  // where it is a CPU float tensor of the output's shape (else at::add after the convolution);
  // not with requant.
  const at::Tensor* residual = nullptr;
  bool residual_in_place = false;  // added after: out.add_(residual) (else at::add)
  DecodeActivations decode = DecodeActivations::kExact;  // weight-only int8 / int4 Linear on the CPU
};

// The unfused residual connection, as a graph writes it: y.add_(r) (in_place: y's type and shape
// kept) or at::add(y, r), then at::relu when relu. The fused epilogues give the same values.
at::Tensor add_residual(at::Tensor y, const at::Tensor& r, bool relu, bool in_place);

class PackedWeight;
using PackedWeightPtr = std::shared_ptr<const PackedWeight>;

class PackedWeight : public std::enable_shared_from_this<PackedWeight> {
 public:
  virtual ~PackedWeight() = default;
  // The integer path it was packed for (the layer's plan().path).
  virtual LinearPath path() const = 0;
  virtual at::Device device() const = 0;
  // The frozen forward for the layer's activation mode. Linear: x [..., K] -> [..., N].
  // Convolutions: x [B, C, H, W] float or int8 codes of the input quantizer -> [B, N, OH, OW]
  // (channels-last memory; int8 codes when in.requant is given).
  virtual at::Tensor forward(const at::Tensor& x, const FrozenInput& in) const = 0;
  // The frozen weight in the layer's layout with its qparams (checkpoints, exports, describe).
  virtual QuantizedTensor weight() const = 0;
  // The bias the packed weight holds (undefined: the layer keeps its own, or there is none).
  virtual at::Tensor bias() const = 0;
  // Bytes of what it holds (model_size, describe).
  virtual int64_t bytes() const = 0;
  // The static input quantizer's scale it was packed with (static paths; 0 otherwise).
  virtual float static_input_scale() const { return 0.0f; }
  // The int4 CPU formats' layout (the plan follows it); null for every other format.
  virtual const S4Packing* s4_packing() const { return nullptr; }
  // This weight on `device`: itself when it is there already; throws qforge::Error when the
  // format has no kernels there.
  virtual PackedWeightPtr to(const at::Device& device) const = 0;
};

// Packs a frozen Linear weight `fw` [N, K] for `path` on the CPU. bias: float [N] on the CPU, or
// undefined (kDequant never takes it: the layer keeps its own). static_scale: the input quantizer's
// scale, for the static paths. `who` prefixes errors (the layer's path and type).
PackedWeightPtr pack_linear(QuantizedTensor fw, LinearPath path, const at::Tensor& bias, float static_scale,
                            const std::string& who);

// What the integer convolution needs of a convolution's options, as 2-D (Conv1d: height 1).
struct ConvShape {
  int64_t in_channels = 0, out_channels = 0, groups = 1;
  std::array<int64_t, 2> kernel{1, 1}, stride{1, 1}, dilation{1, 1}, padding{0, 0};
  bool explicit_padding = true;  // false: padding 'same' (sizes decided per input)
  bool zeros_padding = true;     // padding_mode zeros
  // One filter per channel (MobileNet's 3x3 blocks): the depthwise kernel, not im2col.
  bool depthwise() const { return groups > 1 && groups == in_channels && out_channels == in_channels; }
};

// Packs a frozen convolution weight `fw` [N, C, kh(, kw)] of shape `s` for the integer
// convolution (`path` kS8Static or kS4Static; any other path keeps it packed and dequantizes per
// call). onednn: also build oneDNN's int8 convolution (int8 weights), which the convolution's
// kernel table (kernels/cpu/conv_s8.h) runs for large inputs; *onednn_missing says why it could
// not be built when it was asked for (left unchanged otherwise).
PackedWeightPtr pack_conv(QuantizedTensor fw, LinearPath path, const ConvShape& s, float static_scale, bool onednn,
                          const std::string& who, std::string* onednn_missing);

// How a frozen Embedding looks rows up, the one rule its plan() and pack_embedding() read.
enum class EmbeddingLookup : uint8_t {
  kGatherS8,        // int8 per-row / per-group tables: the rows' codes and scales, dequantized
  kGatherNibbles,   // int4 / int3 per-row / per-group tables of even width: the rows' bytes, unpacked
  kGatherCodebook,  // codebook tables whose rows start on a byte: the rows' indices and levels
  kDequantize,      // any other table: dequantized per call, then at::embedding
};
EmbeddingLookup embedding_lookup(const QSpec& table, int64_t embedding_dim);

// Packs a frozen Embedding table fw [num_embeddings, dim] (the checkpoint's QuantizedTensor, kept
// as is: weight() returns it). forward(indices, {}) -> [..., dim] floats on the indices' device, by
// embedding_lookup(). to(device) returns the same CPU table; each call's rows are copied to the device.
PackedWeightPtr pack_embedding(QuantizedTensor fw, const std::string& who);

// Per-group scales and zero points of a 4-bit weight as [N, K / g] (per-tensor qparams repeat one
// value for every row); zero points undefined when all are 0.
std::pair<at::Tensor, at::Tensor> int4_group_params(const QParams& qp, int64_t N, int64_t K, int64_t g);
// The group size of 4-bit weights along K (K itself unless per-group).
int64_t int4_group_size(const QSpec& ws, int64_t K);

}  // namespace qforge::nn
