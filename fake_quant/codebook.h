// Codebook (k-means) fake quantisation: every value becomes the nearest level of its channel's
// (or group's) codebook. The non-uniform counterpart of fake_quantize for the qkmeans qtypes;
// fake_quantize() dispatches here for them. Formulas: docs/numerics.md, "k-means weights".
#pragma once

#include <ATen/core/Tensor.h>

#include "framework/core/qparams.h"

namespace qforge {

// code = argmin_j |x - codebook[..., j]| for every element of x (distances in float32, ties to the
// lower index), uint8 of x's shape, with the codebook of x's channel / group / tensor (qp.codebook,
// codebook_shape(qp.spec, x.sizes())). Throws qforge::Error naming the first NaN / inf element.
at::Tensor codebook_assign(const at::Tensor& x, const QParams& qp);

// codebook[..., codebook_assign(x)] in x's shape. Differentiable: dX = dY (straight-through
// through the assignment, no clamping mask: every value has a nearest level), and when
// qp.codebook requires grad, dCodebook[..., j] = sum of dY over the values assigned to level j.
at::Tensor fake_quantize_codebook(const at::Tensor& x, const QParams& qp);

// codebook[..., codes] in the shape of codes (uint8 / any integer dtype): the dequantization.
at::Tensor codebook_lookup(const at::Tensor& codes, const QParams& qp);

}  // namespace qforge
