// Learned Step Size Quantization (LSQ, Esser et al. 2020) and LSQ+'s learnable offset.
// The learnable-affine ops reproduce PyTorch's _fake_quantize_learnable_per_tensor_affine /
// _per_channel_affine in forward and in all three gradients (formulas in docs/numerics.md).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace qforge {

// LSQ gradient scale g = 1 / sqrt(numel * quant_max), as PyTorch's _LearnableFakeQuantize uses.
double lsq_grad_factor(int64_t numel, int64_t quant_max);

// LSQ initial step: s0 = 2 * mean(|x|) / sqrt(quant_max) (per channel when axis >= 0), clamped
// to at least kScaleEps.
at::Tensor lsq_init_scale(const at::Tensor& x, int64_t quant_max, int64_t axis = -1);

// scale: float tensor of 1 element; zero_point: float tensor of 1 element (rounded with
// nearbyint in forward and with trunc(z + 0.5) in backward, exactly as PyTorch does).
// Differentiable in x, scale and zero_point.
at::Tensor fake_quantize_learnable_per_tensor_affine(const at::Tensor& x, const at::Tensor& scale,
                                                     const at::Tensor& zero_point, int64_t quant_min,
                                                     int64_t quant_max, double grad_factor);

// scale/zero_point: float tensors of shape [x.size(axis)]; zero_point is rounded half-to-even and
// clamped in forward and backward.
at::Tensor fake_quantize_learnable_per_channel_affine(const at::Tensor& x, const at::Tensor& scale,
                                                      const at::Tensor& zero_point, int64_t axis,
                                                      int64_t quant_min, int64_t quant_max,
                                                      double grad_factor);

// LSQ+ (Bhalgat et al. 2020) for activations: a continuous learnable offset beta instead of an
// integer zero point. y = clamp(rint((x - beta) / s), quant_min, quant_max) * s + beta.
// Gradients: dX = dY inside the range; dS = dY * (q - (x - beta) / s) inside, dY * quant_min or
// dY * quant_max outside; dBeta = dY outside, 0 inside; dS and dBeta are scaled by grad_factor.
at::Tensor fake_quantize_lsq_plus(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& beta,
                                  int64_t quant_min, int64_t quant_max, double grad_factor);

}  // namespace qforge
