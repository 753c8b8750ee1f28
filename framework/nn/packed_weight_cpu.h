// The CPU formats of PackedWeight (framework/nn/packed_weight.h): their common base and their
// constructors, which pack_linear() / pack_conv() pick from. Internal to framework/nn.
#pragma once

#include "framework/core/error.h"
#include "framework/nn/packed_weight.h"
#include "kernels/cpu/packed_linear.h"

namespace qforge::nn {

// What a frozen RPQ layer's packed weight runs (defined in framework/nn/rpq.h).
enum class RpqForward : uint8_t;

// The input quantizer's fake-quant forward of x (x itself for float activations).
inline at::Tensor fake_quantize_input(const FrozenInput& in, const at::Tensor& x) {
  return in.quantizer ? in.quantizer.ptr()->forward(x) : x;
}

// The Linear formats have no convolution epilogue (ReLU, requantized output).
inline void check_linear_call(const FrozenInput& in) {
  QF_CHECK(!in.relu && in.requant == nullptr, "a Linear packed weight was given a convolution epilogue");
}

// A packed weight whose kernels run on the CPU: to(kCUDA) makes its CUDA form
// (framework/cuda/packed_weight_cuda.h), which keeps this one for the way back.
class CpuPackedWeight : public PackedWeight {
 public:
  at::Device device() const override { return at::kCPU; }
  PackedWeightPtr to(const at::Device& device) const override;
};

// Symmetric int8 weights (Linear and convolution) must have zero points 0.
void require_symmetric_s8(const at::Tensor& zero_point, const std::string& who);
// The int8 kernel object of a Linear or convolution: one packed copy (1 byte per weight), no
// oneDNN copy; large M runs the GEMV kernels in row blocks.
std::shared_ptr<const kernels::PackedLinearS8> pack_s8_kernel(const at::Tensor& codes, const at::Tensor& scale_n,
                                                              const at::Tensor& bias);

// Linear formats, packed from the frozen weight fw [N, K] and the CPU bias (undefined: none).
PackedWeightPtr pack_linear_s8(QuantizedTensor fw, LinearPath path, const at::Tensor& bias, float static_scale);
PackedWeightPtr pack_linear_s4(QuantizedTensor fw, LinearPath path, const at::Tensor& bias, float static_scale);
PackedWeightPtr pack_linear_lut(QuantizedTensor fw, const at::Tensor& bias);
PackedWeightPtr pack_linear_s8g(QuantizedTensor fw, const at::Tensor& bias);  // int8 per group along K
PackedWeightPtr pack_linear_fp4(QuantizedTensor fw, const at::Tensor& bias);  // mxfp4 / nvfp4
// Any layer's weight kept packed as a QuantizedTensor and dequantized per call; for a Linear
// (`linear`) its forward is the product with the layer's bias; convolutions run LibTorch's own on
// weight().dequantize(), have no packed forward and stay on the CPU.
PackedWeightPtr pack_dequantize(QuantizedTensor fw, bool linear);

// RPQ layers' frozen form (packed_weight_rpq.cpp): codebooks float32 [H, 256, D], indices uint8
// [H, C], bias (undefined: none), all on the CPU and kept as given; `form` what forward runs.
PackedWeightPtr pack_rpq(at::Tensor codebooks, at::Tensor indices, at::Tensor bias, RpqForward form,
                         const std::string& who);
// The split-first weight [S, C] of an RPQ packed weight (the ATen op's weight for convolutions
// and Bilinear); throws for any other format.
at::Tensor rpq_split_weight(const PackedWeight& packed);

}  // namespace qforge::nn
