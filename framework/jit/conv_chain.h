// Convolution epilogues in rewritten graphs. Convolutions chained through int8 codes: after the graph rewrite, `qforge::conv2d -> aten::relu /
// relu_ / hardtanh(_)(0, 6) -> qforge::conv2d`, where each output has that one use, becomes
// `qforge::conv2d_act_codes(x, first, second, clamp_max, training) -> qforge::conv2d` (clamp_max 6
// for ReLU6, -1 for ReLU): the same values until both layers are frozen on the integer path, then
// int8 codes between them (scripted_layer.cpp runs the op).
#pragma once

#include <torch/csrc/jit/api/module.h>

#include <string>
#include <vector>

namespace qforge::jit {

// Two convolutions chained through int8 codes: `from`'s output, after a ReLU or ReLU6, feeds only
// `to` (once both are frozen on the integer path it hands `to` the codes of its input quantizer
// instead of floats).
struct ChainedCall {
  std::string from, to;
  std::string activation;  // "aten::relu", "aten::hardtanh(0, 6)"
};

// Fuses every chain of g (the forward graph of module, rewritten), then lists every chain the
// graph holds (new ones and those of a file saved after a rewrite).
std::vector<ChainedCall> chain_conv_codes(torch::jit::Graph& g, const torch::jit::Module& module);

// A convolution's output plus a residual, optionally through a ReLU: after the graph rewrite,
// `qforge::conv2d -> aten::add_(conv, r, 1) / aten::add(conv, r, 1) / aten::add(r, conv, 1)
// [-> aten::relu(_)]`, where each output has that one use, r is a tensor, alpha is 1 and nothing
// between the conv and the add writes to a tensor, becomes `qforge::conv2d_add(x, layer, r, relu,
// in_place, training)` (in_place: the graph's add_, which keeps the conv output's type and shape):
// ATen's add (add_) then at::relu until the layer is frozen
// on the integer path, then the addition and the ReLU in its epilogue (nn::Conv2dImpl::forward_add,
// the same values bit for bit), with no float pass of their own (ResNet's blocks, MobileNetV2's
// inverted residuals).
struct ResidualCall {
  std::string layer;
  bool relu = false;
};

// Fuses every such residual of g, then lists every one the graph holds (new ones and those of a
// file saved after a rewrite). Runs after chain_conv_codes.
std::vector<ResidualCall> fuse_residual_adds(torch::jit::Graph& g, const torch::jit::Module& module);

// Every `aten::max_pool2d` of g becomes `qforge::max_pool2d` (same arguments): qforge's
// channels-last kernel (kernels/cpu/max_pool.h, ATen's values bit for bit) where the input is a
// float CPU tensor in channels-last memory, as integer convolutions leave their outputs, with no
// gradient to record; at::max_pool2d otherwise. Returns how many the graph holds.
int64_t route_max_pools(torch::jit::Graph& g);

}  // namespace qforge::jit
