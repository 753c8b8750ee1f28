// The passes that prepare an inlined TorchScript forward for the rewrite (graph_rewrite.h), and the
// attribute lookup both share. PyTorch's own nn.MultiheadAttention and nn.TransformerEncoderLayer
// hold a second, fused implementation (aten::_native_multi_head_attention,
// aten::_transformer_encoder_layer_fwd) behind a chain of "why not the fast path" tests and
// branches on configuration attributes; these passes leave the composite path only, whose Linear
// calls the rewrite can serve. An internal header of framework/jit.
#pragma once

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace qforge::jit {

// A tensor (or None) attribute of a module of the TorchScript module: its owner's path and name.
struct AttrRef {
  std::string owner;
  std::string attr;
  c10::IValue value;
  bool parameter = false;  // a registered parameter (not a buffer or a plain attribute)
  std::string key() const { return owner + "/" + attr; }
  // The layer name of a weight: the owning module's path for `weight`, else owner.attr.
  std::string layer_name() const {
    return attr == "weight" && !owner.empty() ? owner : (owner.empty() ? attr : owner + "." + attr);
  }
};

// The attribute v reads through a chain of prim::GetAttr from the graph's self, if it is one.
std::optional<AttrRef> resolve(const torch::jit::Value* v, const torch::jit::Value* self,
                               const torch::jit::Module& root);

// Every node of block b and of its sub-blocks, in graph order.
void collect_nodes(torch::jit::Block* b, std::vector<torch::jit::Node*>* out);

// True for the fused inference ops of PyTorch's transformer modules, which read the weights directly.
bool fast_path_op(const torch::jit::Node* n);

// True for nn.TransformerEncoder's conversion of a padded batch into a nested tensor
// (aten::_nested_tensor_from_mask), the entry of its fast path through the fused layers.
bool nested_fast_path_op(const torch::jit::Node* n);

// True for ops that read a tensor's metadata only (dtype, device): they stay valid when a frozen
// layer's float weight is released from the module.
bool metadata_read(const torch::jit::Node* n);

// True for ops that slice a tensor along its first dimension into pieces (chunk, split): the
// packed q / k / v weight of nn.MultiheadAttention read by its other branches.
bool slicing_read(const torch::jit::Node* n);

// Simplifies g (the module's inlined forward) until nothing changes:
// - bool and None attributes of the modules (configuration such as batch_first, norm_first,
//   _qkv_same_embed_dim, bias_k) become constants, except `training` and attributes the forward sets;
// - `a is a` / `a is not a` of one graph value become true / false;
// - every prim::If around a fast-path op or the encoder stack's nested-tensor conversion whose
//   condition tests a reason string (PyTorch's `if not why_not_fast_path:`) takes the branch without
//   it: the composite path runs, as it does in PyTorch whenever a reason exists (training, gradients
//   enabled, ...);
// then constant propagation and dead code elimination.
void simplify_for_rewrite(const std::shared_ptr<torch::jit::Graph>& g, const torch::jit::Module& root);

}  // namespace qforge::jit
