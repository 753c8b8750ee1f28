// The graph rewrite of the TorchScript front door: inlines a TorchScript module's forward, finds
// every aten::linear / conv1d / conv2d call (and a trace's aten::_convolution), x @ W^T, x @ W and
// W @ x matmul and aten::embedding whose weight is a module attribute, and each product of two
// activations (matmul, mm, bmm, baddbmm, a batched-matrix einsum), and replaces each with a qforge op taking a
// ScriptedLayer held as an attribute of the root module (an embedding table also read by Linear
// calls, a tied LM head, is one layer both use). Calls that cannot be quantized stay as they are
// and are listed with why.
#pragma once

#include <torch/csrc/jit/api/module.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "framework/jit/conv_chain.h"
#include "framework/jit/scripted_layer.h"

namespace qforge::jit {

// A call of the graph left in float.
struct FloatCall {
  std::string name;    // module path of its weight ("fc", "blocks.0.proj") or of the op's value
  std::string op;      // "aten::matmul", "aten::linear", ...
  std::string reason;  // why it stays float
};

// A call that shares another call's qforge layer (one weight tensor read twice: tied weights).
struct TiedCall {
  std::string name;   // module path of the weight as this call reads it ("lm_head", "tok")
  std::string op;     // "aten::linear", ...
  std::string layer;  // the qforge layer it runs ("tok")
  // A chunk / split of a Linear's weight or bias (nn.MultiheadAttention's packed q / k / v in its
  // unbatched and cross-attention branches): it reads the layer's tensor as the layer holds it.
  bool slice = false;
};

struct RewriteResult {
  std::vector<c10::intrusive_ptr<ScriptedLayer>> layers;  // new qforge layers, in graph order
  std::vector<FloatCall> kept_float;
  // {BatchNorm module path, convolution layer path} of each BatchNorm folded into a convolution.
  std::vector<std::pair<std::string, std::string>> folded;
  std::vector<TiedCall> tied;
  std::vector<ChainedCall> chained;  // every chain in the graph (new ones and a saved file's)
  std::vector<ResidualCall> residual;  // every fused residual addition (conv_chain.h), likewise
  int64_t max_pools = 0;  // aten::max_pool2d calls routed to qforge::max_pool2d (conv_chain.h)
};

// The root attributes a rewrite added earlier (a file saved after a rewrite), in attribute order.
std::vector<c10::intrusive_ptr<ScriptedLayer>> rewritten_layers(const torch::jit::Module& module);

// Sets the tensor attribute `attr` of the module at dotted path `owner` ("" for the root).
void set_attribute(torch::jit::Module& root, const std::string& owner, const std::string& attr, const at::Tensor& value);

// Dotted names ("bn.running_mean", "mix") of the tensor attributes module's forward graph reads.
std::set<std::string> tensor_attributes_read(const torch::jit::Module& module);

// Rewrites module's forward in place (the graph of its "forward" method; other methods are left
// as they are). The new layers are float and hold the module's own weight and bias tensors. An
// eval-mode aten::batch_norm on a convolution's output is folded into it (nn::fold_bn_tensors): the
// module's weight (and bias, where it has one) attributes become the folded tensors; a conv without
// bias gets the layer's own. Other batch_norm calls stay float and are listed with the reason.
// Then chains convolutions through int8 codes and fuses residual additions into convolutions
// (conv_chain.h; RewriteResult::chained, ::residual).
// Throws qforge::Error when the module has no forward.
RewriteResult rewrite_forward(torch::jit::Module& module);

}  // namespace qforge::jit
