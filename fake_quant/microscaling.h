// Microscaling 4-bit formats (MXFP4, NVFP4) on tensors: block scales from a tensor's own values,
// and fake quantisation with them. Scalar formulas: fake_quant/microscaling_math.h; the
// formats, roundings and special values: docs/formats.md.
#pragma once

#include <ATen/core/Tensor.h>

#include "framework/core/qparams.h"

namespace qforge {

// The only spec a microscaling qtype takes: per_group along the last dimension, the format's block.
QSpec microscaling_spec(const QType& qtype);

// Block scales of x (blocks of qtype.block_size along the last dimension) as QParams: scale of
// shape [..., K / block] (float32; MXFP4 2^(floor(log2(amax)) - 2), NVFP4 e4m3(amax / 6 / g) * g),
// zero_point 0, and for NVFP4 tensor_scale g: the one given (a one-element tensor, e.g. an
// observer's amax through nvfp4_tensor_scale) or amax(|x|) / (6 * 448). x must be finite: NaN or
// inf is refused with the index of the first one.
QParams microscaling_qparams(const at::Tensor& x, const QSpec& spec, const at::Tensor& tensor_scale = {});

// fake_quantize(x, microscaling_qparams(x, spec, tensor_scale)): differentiable in x with the
// straight-through estimator (gradient where |x / scale| <= 6).
at::Tensor fake_quantize_microscaling(const at::Tensor& x, const QSpec& spec, const at::Tensor& tensor_scale = {});

}  // namespace qforge
