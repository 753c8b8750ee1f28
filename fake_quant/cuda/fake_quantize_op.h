// The CUDA override of qforge's fake-quant ops. fake_quant/fake_quantize.cpp is the one dispatch
// point of each op: CPU tensors run the CPU kernels, CUDA tensors come here, with the same
// layout, validation and formulas. Defined by fake_quant/cuda/fake_quantize_op.cpp when qforge
// is built against a CUDA-enabled LibTorch (CMake: QFORGE_TORCH_CUDA), otherwise by
// fake_quant/fake_quantize_no_cuda.cpp, whose functions throw qforge::Error saying so.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "fake_quant/fake_quant_math.h"
#include "fake_quant/fake_quantize_kernels.h"

namespace qforge::fq {

// One fake-quant call: x (float32, contiguous) viewed as [outer, C, inner], channel c on grid c.
struct DeviceFakeQuant {
  int64_t C = 1, inner = 1;
  std::vector<float> scale, zero_point;  // C values each, validated on the host (scale > 0, finite)
  float quant_min = 0, quant_max = 0;
  const Float8Format* float8 = nullptr;  // set: the float8 grid (scale only) instead of the affine one
};

// True when this build has the CUDA override (a CUDA-enabled LibTorch and the CUDA kernels).
bool cuda_fake_quantize_built();

// y and, when want_mask, the STE mask (bool) of x on x's CUDA device and current stream.
std::tuple<at::Tensor, at::Tensor> cuda_fake_quantize(const at::Tensor& x, const DeviceFakeQuant& op,
                                                      bool want_mask);

// dx = mask ? dy : 0 on dy's CUDA device (dy float32 contiguous, mask bool of the same shape).
at::Tensor cuda_mask_grad(const at::Tensor& dy, const at::Tensor& mask);

// LSQ's backward on x's CUDA device: x and dy [C, inner] float32 contiguous, channel c on grids[c];
// returns {dx, dscale [C], dzero_point [C]} (fake_quant/cuda/lsq_backward_cuda.h: dx bit for bit
// the CPU's, the sums within about 2^-16 of the sum of their |terms| of the CPU kernels').
std::tuple<at::Tensor, at::Tensor, at::Tensor> cuda_lsq_backward_rows(const at::Tensor& x, const at::Tensor& dy,
                                                                      const std::vector<LsqGrid>& grids);

}  // namespace qforge::fq
