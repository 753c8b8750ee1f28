// What one call of a TorchScript graph is, for the graph rewrite (graph_rewrite.h): which calls are
// a Linear / Conv1d / Conv2d / Embedding on a module attribute (in which of the forms torch emits),
// a product of two activations (matmul, mm, bmm, baddbmm, a batched-matrix einsum), or neither and
// why; and the eval-mode BatchNorm folded into a convolution. An internal header of framework/jit.
#pragma once

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>

#include <cstdint>
#include <string>
#include <vector>

#include "framework/jit/graph_passes.h"
#include "framework/jit/scripted_layer.h"

namespace qforge::jit {

// A call that becomes a qforge op.
struct Candidate {
  torch::jit::Node* node = nullptr;
  // Operand positions, not values: rewriting an earlier call replaces the value a later one reads.
  size_t x_at = 0;    // the op's input (an embedding's indices; a product's first operand)
  // A product of two activations (spec.kind MatMul): its second operand, and baddbmm's added term.
  bool product = false;
  size_t other_at = 1;
  int added_at = -1;
  // An einsum product: its operands are the equation's list's (x_at, other_at index that list),
  // permuted to [batch..., free, contracted] and [batch..., contracted, free], the product
  // [batch..., free_a, free_b] permuted to the equation's output (empty: no permute).
  bool einsum = false;
  std::vector<int64_t> perm_a, perm_b, perm_out;
  // W @ x (matmul / mm with the weight on the left): a Linear holding W run by qforge::linear_left
  // on x with its last two dimensions swapped (x_at is 1).
  bool weight_left = false;
  int bias_at = -1;   // the bias operand, if the call has one (a tied Linear passes it on)
  int tied_to = -1;  // the candidate whose layer this call shares (one weight tensor read twice)
  std::string own_layer_why;  // why the call cannot hold a layer of its own (a tied call needs none)
  LayerSpec spec;
  AttrRef weight;
  at::Tensor bias;
  std::string bias_attr;
  bool sliced_elsewhere = false;  // the weight is also read by chunk / split calls (slicing_read)
  torch::jit::Node* batch_norm = nullptr;  // an aten::batch_norm on the call's output, folded into it
  std::string bn_owner;
};

// True for the calls analyse() looks at.
bool quantizable_kind(const torch::jit::Node* n);
// True for ops the front door leaves float and lists (no qforge op for them yet).
bool listed_float_kind(const torch::jit::Node* n);

// Why node n (a linear, convolution, matmul-like call, einsum or embedding) cannot become a qforge
// op, or empty with *c filled.
std::string analyse(torch::jit::Node* n, const torch::jit::Value* self, const torch::jit::Module& root, Candidate* c);

// A product's first (which 0) or second operand, as the graph holds it now.
torch::jit::Value* product_operand(const Candidate& c, int which);

// The eval-mode aten::batch_norm reading c's output, folded into c's weight and bias (the formula
// of nn::fold_bn_tensors); returns why one that follows cannot be folded (empty: folded or none).
std::string fold_batch_norm(const torch::jit::Value* self, const torch::jit::Module& root, Candidate* c);

}  // namespace qforge::jit
