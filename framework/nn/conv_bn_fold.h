// Conv + BatchNorm folding (Conv2d + BatchNorm2d, Conv1d + BatchNorm1d): the one home of the formula. The CNN's conv-BN-ReLU blocks
// (models::ConvBnRelu::fold_batch_norm) and convert()'s Sequential pairs both call it.
#pragma once

#include <torch/nn/modules/batchnorm.h>

#include <utility>

#include "framework/nn/conv.h"

namespace qforge::nn {

// A new qforge Conv2d (with bias) computing `conv` followed by `bn` in eval mode, per output channel c:
//   w'[c] = w[c] · γ[c] / sqrt(var[c] + eps),   b'[c] = (b[c] − mean[c]) · γ[c] / sqrt(var[c] + eps) + β[c]
// with var, mean bn's running statistics, γ = 1 and β = 0 when bn has no affine parameters, b = 0
// when conv has no bias. Same options, device and dtype as conv. Throws when conv is already
// quantized (fold first, then quantize), when bn keeps no running statistics or its feature count
// is not conv's output channels; nothing changes then.
Conv2d fold_conv_bn(const Conv2d& conv, const torch::nn::BatchNorm2d& bn);
// The same for a Conv1d followed by a BatchNorm1d (1-D CNNs: audio, sequences).
Conv1d fold_conv_bn(const Conv1d& conv, const torch::nn::BatchNorm1d& bn);

// The same formula on tensors, for a convolution of any dimension (the TorchScript graph's
// conv -> batch_norm pairs): returns {w', b'} as new tensors without autograd history. Undefined
// `bias`, `gamma`, `beta` stand for 0, 1, 0. Throws when the statistics are not w's output channels.
std::pair<at::Tensor, at::Tensor> fold_bn_tensors(const at::Tensor& weight, const at::Tensor& bias,
                                                  const at::Tensor& running_mean, const at::Tensor& running_var,
                                                  const at::Tensor& gamma, const at::Tensor& beta, double eps);

}  // namespace qforge::nn
