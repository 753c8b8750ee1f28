// The Hadamard transform (kernels/cpu/hadamard.h) as a tensor op: the last dimension of a CPU
// tensor rotated, y = x · Hᵀ / sqrt(n) row by row (transpose: x · H / sqrt(n), the inverse),
// differentiable to any order (the backward is this op in the other direction, since H / sqrt(n)
// is orthogonal, so double backward for Hessian-vector products works through it).
#pragma once

#include <ATen/core/Tensor.h>

namespace qforge::kernels {

// Computed in float32 by hadamard_transform (other float dtypes converted there and back); the
// result is a new tensor. Throws qforge::Error for a non-CPU or non-float tensor or an unsupported
// last dimension (naming the nearest supported sizes).
at::Tensor hadamard_rotate(const at::Tensor& x, bool transpose = false);

}  // namespace qforge::kernels
