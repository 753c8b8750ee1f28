// Fake quantisation: quantize then dequantize in float, with straight-through gradients.
// Integer grids reproduce at::fake_quantize_per_tensor_affine / _per_channel_affine bit for bit
// (forward and gradient mask); float8 grids emulate e4m3fn / e5m2 with round-to-nearest-even.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

#include "framework/core/qparams.h"

namespace qforge {

// y = fake_quantize(x) under qp, any granularity and grid. Differentiable in x: the gradient is
// the straight-through estimator, dX = dY where the unclamped quantized value lies in
// [quant_min, quant_max] (float8: where |x / scale| <= max_finite), 0 elsewhere.
at::Tensor fake_quantize(const at::Tensor& x, const QParams& qp);

// Same signatures and semantics as the ATen ops of the same name, on qforge's kernels.
at::Tensor fake_quantize_per_tensor_affine(const at::Tensor& x, double scale, int64_t zero_point,
                                           int64_t quant_min, int64_t quant_max);
at::Tensor fake_quantize_per_channel_affine(const at::Tensor& x, const at::Tensor& scale,
                                            const at::Tensor& zero_point, int64_t axis,
                                            int64_t quant_min, int64_t quant_max);

// Forward only, without autograd: y and the STE mask (bool, same shape), like ATen's *_cachemask.
std::tuple<at::Tensor, at::Tensor> fake_quantize_cachemask(const at::Tensor& x, const QParams& qp);
// Forward only, no mask (inference / PTQ evaluation): the fastest path.
at::Tensor fake_quantize_forward(const at::Tensor& x, const QParams& qp);
// dX = mask ? dY : 0.
at::Tensor fake_quantize_backward(const at::Tensor& dy, const at::Tensor& mask);

// Name of the kernel set in use ("avx512", "avx2", "reference"), for reports.
const char* fake_quantize_isa();

}  // namespace qforge
