// The forward graph rewrite: aten::linear / conv calls on module attributes -> qforge ops.
#include "framework/jit/graph_rewrite.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "framework/core/error.h"
#include "framework/jit/conv_chain.h"
#include "framework/jit/graph_passes.h"
#include "framework/nn/conv_bn_fold.h"

namespace qforge::jit {

namespace {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// How many nodes read each tensor attribute (AttrRef::key) of the graph.
std::map<std::string, size_t> attribute_reads(const std::vector<Node*>& nodes, const Value* self,
                                              const torch::jit::Module& root) {
  std::map<std::string, size_t> reads;
  for (Node* n : nodes) {
    if (n->kind() != c10::prim::GetAttr || n->output()->type()->kind() == c10::TypeKind::ClassType) continue;
    if (auto ref = resolve(n->output(), self, root)) reads[ref->key()] += n->output()->uses().size();
  }
  return reads;
}

// A call that becomes a qforge op.
struct Candidate {
  Node* node = nullptr;
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
  Node* batch_norm = nullptr;  // an aten::batch_norm on the call's output, folded into it
  std::string bn_owner;
};

// The int list a constant argument holds, repeated to `dims` values when it holds one.
std::optional<std::vector<int64_t>> int_list(const Value* v, size_t dims) {
  const auto iv = torch::jit::toIValue(v);
  if (!iv || !iv->isIntList()) return std::nullopt;
  std::vector<int64_t> out = iv->toIntVector();
  if (out.size() == 1 && dims > 1) out.assign(dims, out[0]);
  if (out.size() != dims) return std::nullopt;
  return out;
}

// Fills c->spec's convolution options from node n; returns why not (empty: done).
std::string read_conv_options(const Node* n, const at::Tensor& w, Candidate* c) {
  const bool traced = n->kind() == c10::aten::_convolution;
  if (w.dim() != 3 && w.dim() != 4) return "weight of " + std::to_string(w.dim()) + " dimensions: qforge has Conv1d and Conv2d";
  const size_t d = static_cast<size_t>(w.dim() - 2);
  if (traced) {
    const auto transposed = torch::jit::toIValue(n->input(6));
    if (!transposed || !transposed->isBool()) return "'transposed' is not a constant";
    if (transposed->toBool()) return "transposed convolution: no qforge layer";
  } else if (n->input(4)->type()->kind() == c10::TypeKind::StringType) {
    return "padding given as a string ('same' / 'valid'): give the sizes";
  }
  const auto stride = int_list(n->input(3), d), padding = int_list(n->input(4), d), dilation = int_list(n->input(5), d);
  const auto groups = torch::jit::toIValue(n->input(traced ? 8 : 6));
  if (!stride || !padding || !dilation || !groups || !groups->isInt())
    return "stride, padding, dilation or groups is not a constant of the graph";
  LayerSpec& s = c->spec;
  s.kind = d == 1 ? LayerKind::kConv1d : LayerKind::kConv2d;
  s.groups = groups->toInt();
  s.out = w.size(0);
  s.in = w.size(1) * s.groups;
  s.kernel = w.sizes().slice(2).vec();
  s.stride = *stride;
  s.padding = *padding;
  s.dilation = *dilation;
  return {};
}

// The matrix v transposes when it is t(m) / m.T / m.transpose(0, 1) of a 2-D m read by nothing else.
const Value* transposed_matrix(const Value* v) {
  const Node* t = v->node();
  const std::string k = t->kind().toQualString();
  if (v->uses().size() != 1) return nullptr;
  if (k == "aten::t" || k == "aten::numpy_T") return t->input(0);
  if (k != "aten::transpose") return nullptr;
  const auto a = torch::jit::toIValue(t->input(1)), b = torch::jit::toIValue(t->input(2));
  if (!a || !b || !a->isInt() || !b->isInt()) return nullptr;
  const int64_t lo = std::min(a->toInt(), b->toInt()), hi = std::max(a->toInt(), b->toInt());
  return (lo == 0 && hi == 1) || (lo == -2 && hi == -1) || (lo == -1 && hi == 0) || (lo == -2 && hi == 1) ? t->input(0)
                                                                                                        : nullptr;
}

// The module attribute v is one op of, when that op reads no other tensor (t(W), W.mT,
// W.expand(...): a weight in another form; x * self.scale is an activation).
std::optional<AttrRef> one_op_from_attribute(const Value* v, const Value* self, const torch::jit::Module& root) {
  std::optional<AttrRef> found;
  for (const Value* in : v->node()->inputs()) {
    if (auto ref = resolve(in, self, root)) {
      found = ref;
    } else if (in->type()->kind() == c10::TypeKind::TensorType) {
      return std::nullopt;
    }
  }
  return found;
}

// The weight operand of a matmul-like call, x @ W^T as torch emits nn.Linear (matmul / mm of x and
// t(W), addmm(b, x, t(W)) with beta = alpha = 1); returns why not (empty: *c's x, weight and bias set).
std::string matmul_operands(Node* n, const Value* self, const torch::jit::Module& root, Candidate* c) {
  const bool addmm = n->kind() == c10::aten::addmm;
  const Value* rhs = n->input(addmm ? 2 : 1);
  const Value* w = transposed_matrix(rhs);
  if (!w || !resolve(w, self, root)) {
    const auto attr = resolve(rhs, self, root);
    if (attr && !attr->parameter) {
      return "x @ B on a buffer or plain attribute (a fixed matrix such as a rotation or a table, not a trained "
             "weight): kept float";
    } else if (attr) {
      // x @ W with W stored [in, out] (GPT-2's Conv1D): a Linear holding W's transpose.
      c->spec.weight_transposed = true;
      w = rhs;
    } else if (const auto left = resolve(n->input(addmm ? 1 : 0), self, root)) {
      if (addmm) return "addmm with the weight on the left (b + W @ x): no qforge op for it (write F.linear)";
      if (!left->parameter)
        return "B @ x on a buffer or plain attribute (a fixed matrix such as a rotation or a table, not a trained "
               "weight): kept float";
      // W @ x: a Linear holding W on x's last two dimensions swapped (a vector x: the Linear itself).
      c->weight_left = true;
      c->x_at = 1;
      return {};
    } else {
      // t(W) read twice, W.mT, permute(W, ...): a module attribute one op away that is not x @ W^T.
      if (one_op_from_attribute(rhs, self, root))
        return "the weight operand is " + std::string(rhs->node()->kind().toQualString()) +
               " of a module attribute, a form the front door does not recognise (it takes x @ W.t() with "
               "t(W) read once, and x @ W)";
      if (addmm) return "addmm of two computed tensors: no qforge op for the added term (write a + x @ y)";
      const Value* lhs = n->input(0);
      if (one_op_from_attribute(lhs, self, root))
        return "the left operand is " + std::string(lhs->node()->kind().toQualString()) +
               " of a module attribute (a weight on the left, W.t() @ x): no qforge op for it (write x @ W)";
      // Two activations (attention's q @ k^T, att @ v): a qforge MatMul quantizing both operands.
      c->product = true;
      c->x_at = 0;
      c->other_at = 1;
      return {};
    }
  }
  if (addmm) {
    const auto beta = torch::jit::toIValue(n->input(3)), alpha = torch::jit::toIValue(n->input(4));
    if (!beta || !alpha || !(beta->isInt() || beta->isDouble()) || !(alpha->isInt() || alpha->isDouble()) ||
        beta->toScalar().toDouble() != 1.0 || alpha->toScalar().toDouble() != 1.0)
      return "addmm with beta or alpha other than the constant 1";
    const auto b = resolve(n->input(0), self, root);
    if (!b || !b->value.isTensor() || b->value.toTensor().dim() != 1)
      return "the added term is not a bias vector read from a module attribute";
    // A broadcast term ([1]) is no per-output bias a Linear layer can hold.
    const c10::IValue weight = resolve(w, self, root)->value;
    const int64_t out_dim = c->spec.weight_transposed ? 1 : 0;
    if (weight.isTensor() && weight.toTensor().dim() == 2 && b->value.toTensor().numel() != weight.toTensor().size(out_dim))
      return "the added term has " + std::to_string(b->value.toTensor().numel()) + " values for " +
             std::to_string(weight.toTensor().size(out_dim)) + " outputs (a broadcast, not a bias qforge Linear holds)";
  }
  c->x_at = addmm ? 1 : 0;
  return {};
}

// An aten::embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse) call's options;
// returns why it stays float (empty: c->spec filled).
std::string embedding_options(const Node* n, const at::Tensor& w, Candidate* c) {
  if (w.dim() != 2) return "embedding table of " + std::to_string(w.dim()) + " dimensions";
  const auto padding_idx = torch::jit::toIValue(n->input(2));
  const auto by_freq = torch::jit::toIValue(n->input(3)), sparse = torch::jit::toIValue(n->input(4));
  if (!padding_idx || !padding_idx->isInt() || !by_freq || !by_freq->isBool() || !sparse || !sparse->isBool())
    return "padding_idx, scale_grad_by_freq or sparse is not a constant of the graph";
  if (by_freq->toBool() || sparse->toBool()) return "scale_grad_by_freq / sparse gradients: no qforge Embedding option";
  // aten::embedding gets padding_idx as nn.Embedding / F.embedding normalised it: negative is none.
  const int64_t p = padding_idx->toInt();
  if (p >= w.size(0))
    return "padding_idx " + std::to_string(p) + " is past the table's " + std::to_string(w.size(0)) + " rows";
  c->spec.kind = LayerKind::kEmbedding;
  c->spec.in = w.size(0);
  c->spec.out = w.size(1);
  c->spec.padding_idx = p < 0 ? -1 : p;
  c->spec.bias = false;
  return {};
}

// bmm(a, b) / baddbmm(t, a, b, beta = 1, alpha = 1) of two activations: a MatMul (the batched
// product at::matmul computes for 3-D operands), baddbmm's term added after it; returns why not.
std::string batched_product(const Node* n, const Value* self, const torch::jit::Module& root, Candidate* c) {
  const bool baddbmm = n->kind() == c10::aten::baddbmm;
  const size_t a = baddbmm ? 1 : 0;
  for (size_t i : {a, a + 1})
    if (resolve(n->input(i), self, root) || one_op_from_attribute(n->input(i), self, root))
      return "a module attribute (or one op of one) as an operand of " + std::string(n->kind().toQualString()) +
             ": no qforge op for a batched product with a weight (write x @ W.t())";
  if (baddbmm) {
    const auto beta = torch::jit::toIValue(n->input(3)), alpha = torch::jit::toIValue(n->input(4));
    if (!beta || !alpha || !(beta->isInt() || beta->isDouble()) || !(alpha->isInt() || alpha->isDouble()) ||
        beta->toScalar().toDouble() != 1.0 || alpha->toScalar().toDouble() != 1.0)
      return "baddbmm with beta or alpha other than the constant 1";
    c->added_at = 0;
  }
  c->product = true;
  c->x_at = a;
  c->other_at = a + 1;
  return {};
}

// einsum(equation, [a, b]) of two activations with one contracted index and one free index per
// operand, any batch indices ("bhqd,bhkd->bhqk", "bhqk,bhkd->bhqd", "bij,bjk->bik", or the implicit
// "ij,jk", whose output is "ik"): a MatMul on
// the operands permuted to [batch..., free, contracted] and [batch..., contracted, free]; returns why not.
std::string einsum_product(const Node* n, const Value* self, const torch::jit::Module& root, Candidate* c) {
  const auto eq = torch::jit::toIValue(n->input(0));
  if (!eq || !eq->isString()) return "the einsum equation is not a constant of the graph";
  const Node* list = n->input(1)->node();
  if (list->kind() != c10::prim::ListConstruct)
    return "the einsum's operands are not a list built in the graph (its contents are unknown here)";
  if (list->inputs().size() != 2) return "einsum of other than two operands";
  // A list also read (or changed: ops[1] = ...) elsewhere may not hold at the einsum what it was built with.
  if (list->output()->uses().size() != 1) return "the einsum's operand list is read by other ops too";
  for (const Value* v : list->inputs())
    if (resolve(v, self, root) || one_op_from_attribute(v, self, root))
      return "a module attribute (or one op of one) as an einsum operand: no qforge op for a product with a weight";
  std::string e;
  for (const char ch : eq->toStringRef())
    if (ch != ' ') e += ch;
  const size_t arrow = e.find("->"), comma = e.find(',');
  if (comma == std::string::npos || (arrow != std::string::npos && comma > arrow))
    return "einsum equation '" + e + "' is malformed for two operands";
  const std::string a = e.substr(0, comma), b = e.substr(comma + 1, arrow == std::string::npos ? std::string::npos : arrow - comma - 1);
  std::string out;
  if (arrow != std::string::npos) {
    out = e.substr(arrow + 2);
  } else {
    // Implicit output, as torch.einsum defines it: the indices that appear once, in alphabetical order.
    for (const char ch : a + b)
      if (std::count(a.begin(), a.end(), ch) + std::count(b.begin(), b.end(), ch) == 1) out += ch;
    std::sort(out.begin(), out.end());
  }
  const auto distinct_letters = [](const std::string& t) {
    std::set<char> seen;
    for (const char ch : t)
      if (!std::isalpha(static_cast<unsigned char>(ch)) || !seen.insert(ch).second) return false;
    return true;
  };
  if (!distinct_letters(a) || !distinct_letters(b) || !distinct_letters(out))
    return "einsum equation '" + e + "' with '...', a repeated index, a third operand or a malformed output";
  std::string batch, free_a, free_b, contracted;
  for (const char ch : out) {
    const bool in_a = a.find(ch) != std::string::npos, in_b = b.find(ch) != std::string::npos;
    if (in_a && in_b) batch += ch;
    else if (in_a) free_a += ch;
    else if (in_b) free_b += ch;
    else return "einsum equation '" + e + "' with an output index in no operand";
  }
  for (const char ch : a)
    if (out.find(ch) == std::string::npos) {
      if (b.find(ch) == std::string::npos) return "einsum equation '" + e + "' sums an index of one operand alone";
      contracted += ch;
    }
  for (const char ch : b)
    if (out.find(ch) == std::string::npos && a.find(ch) == std::string::npos)
      return "einsum equation '" + e + "' sums an index of one operand alone";
  if (contracted.size() != 1 || free_a.size() != 1 || free_b.size() != 1)
    return "einsum equation '" + e + "' is not a batched matrix product (one contracted index and one free index "
           "per operand)";
  const auto positions = [](const std::string& of, const std::string& order) {
    std::vector<int64_t> p;
    for (const char ch : order) p.push_back(static_cast<int64_t>(of.find(ch)));
    bool identity = true;
    for (size_t i = 0; i < p.size(); ++i) identity = identity && p[i] == static_cast<int64_t>(i);
    return identity ? std::vector<int64_t>{} : p;
  };
  c->perm_a = positions(a, batch + free_a + contracted);
  c->perm_b = positions(b, batch + contracted + free_b);
  c->perm_out = positions(batch + free_a + free_b, out);
  c->einsum = true;
  c->product = true;
  c->x_at = 0;
  c->other_at = 1;
  return {};
}

// A product's first (which 0) or second operand.
Value* product_operand(const Candidate& c, int which) {
  const size_t at = which == 0 ? c.x_at : c.other_at;
  return c.einsum ? c.node->input(1)->node()->input(at) : c.node->input(at);
}

// Why node n (a linear, convolution, matmul-like call or embedding) cannot become a qforge op, or
// empty with *c filled.
std::string analyse(Node* n, const Value* self, const torch::jit::Module& root, Candidate* c) {
  const auto k = n->kind();
  // matmul.out / bmm.out write into a tensor the graph reads afterwards: a qforge op returns a new one.
  if (const c10::FunctionSchema* schema = n->maybeSchema(); schema != nullptr && schema->is_mutable())
    return "writes its result into an out= tensor: kept float";
  const bool matmul = k == c10::aten::matmul || k == c10::aten::mm || k == c10::aten::addmm;
  const bool embedding = k == c10::aten::embedding;
  c->x_at = embedding ? 1 : 0;
  if (k == c10::aten::bmm || k == c10::aten::baddbmm) {
    const std::string why = batched_product(n, self, root, c);
    if (!why.empty()) return why;
  } else if (k == c10::aten::einsum) {
    const std::string why = einsum_product(n, self, root, c);
    if (!why.empty()) return why;
  } else if (matmul) {
    const std::string why = matmul_operands(n, self, root, c);
    if (!why.empty()) return why;
  }
  if (c->product) {
    c->node = n;
    c->spec.kind = LayerKind::kMatMul;
    return {};
  }
  const Value* rhs = n->input(k == c10::aten::addmm ? 2 : 1);
  const Value* weight_value = !matmul             ? n->input(embedding ? 0 : 1)
                             : c->weight_left      ? n->input(0)
                             : c->spec.weight_transposed ? rhs
                                                         : transposed_matrix(rhs);
  const auto w = resolve(weight_value, self, root);
  if (!w) return "the weight is computed in the graph, not read from a module attribute";
  if (!w->value.isTensor()) return "the weight attribute '" + w->key() + "' is not a tensor";
  const at::Tensor wt = w->value.toTensor();
  if (wt.scalar_type() != at::kFloat) return std::string("weight of dtype ") + c10::toString(wt.scalar_type()) + ": qforge layers hold float32 weights";
  if (!wt.is_cpu()) return "weight on " + wt.device().str() + ": load the TorchScript module on the CPU";
  c->node = n;
  c->weight = *w;
  if (embedding) return embedding_options(n, wt, c);
  c->bias_at = matmul ? (k == c10::aten::addmm ? 0 : -1) : 2;
  const Value* bias_value = c->bias_at >= 0 ? n->input(static_cast<size_t>(c->bias_at)) : nullptr;
  if (bias_value && bias_value->type()->kind() != c10::TypeKind::NoneType) {
    const auto b = resolve(bias_value, self, root);
    if (!b) return "the bias is computed in the graph, not read from a module attribute";
    if (!b->value.isNone()) {
      if (!b->value.isTensor() || b->value.toTensor().scalar_type() != at::kFloat) return "the bias is not a float32 tensor";
      c->bias = b->value.toTensor();
      c->bias_attr = b->attr;
      // A tied head's bias stays the script's; a layer of its own holds weight and bias of one module.
      if (b->owner != w->owner) c->own_layer_why = "weight and bias belong to different modules";
    }
  }
  c->spec.bias = c->bias.defined();
  if (k == c10::aten::linear || matmul) {
    if (wt.dim() != 2) return "linear weight of " + std::to_string(wt.dim()) + " dimensions";
    c->spec.kind = LayerKind::kLinear;
    c->spec.out = wt.size(c->spec.weight_transposed ? 1 : 0);
    c->spec.in = wt.size(c->spec.weight_transposed ? 0 : 1);
    return {};
  }
  return read_conv_options(n, wt, c);
}

// The tensor a batch_norm input (weight, bias, running statistics) reads, or undefined for None.
std::optional<at::Tensor> bn_tensor(const Value* v, const Value* self, const torch::jit::Module& root,
                                    std::string* owner) {
  if (v->type()->kind() == c10::TypeKind::NoneType) return at::Tensor();
  const auto ref = resolve(v, self, root);
  if (!ref || !(ref->value.isTensor() || ref->value.isNone())) return std::nullopt;
  if (!owner->empty() && *owner != ref->owner) return std::nullopt;
  *owner = ref->owner;
  return ref->value.isNone() ? at::Tensor() : ref->value.toTensor();
}

// The eval-mode aten::batch_norm reading c's output, folded into c's weight and bias (the formula
// of nn::fold_bn_tensors); returns why one that follows cannot be folded (empty: folded or none).
std::string fold_batch_norm(const Value* self, const torch::jit::Module& root, Candidate* c) {
  if (c->spec.kind != LayerKind::kConv1d && c->spec.kind != LayerKind::kConv2d) return {};
  Node* bn = nullptr;
  for (const torch::jit::Use& u : c->node->output()->uses())
    if (u.user->kind() == c10::aten::batch_norm && u.offset == 0) bn = u.user;
  if (!bn) return {};
  // Folding changes the convolution's output: only the BatchNorm and shape queries may read it.
  for (const torch::jit::Use& u : c->node->output()->uses())
    if (u.user != bn && u.user->kind() != c10::aten::dim && u.user->kind() != c10::aten::size)
      return "the convolution's output is also read by " + std::string(u.user->kind().toQualString()) +
             ", which must see it unfolded";
  const auto training = torch::jit::toIValue(bn->input(5));
  const bool eval = training ? (training->isBool() && !training->toBool()) : !root.is_training();
  if (!eval) return "a BatchNorm in training mode uses batch statistics: load a module saved after eval() to fold it";
  const auto eps = torch::jit::toIValue(bn->input(7));
  if (!eps || !eps->isDouble()) return "the BatchNorm's eps is not a constant of the graph";
  std::string owner;
  const auto gamma = bn_tensor(bn->input(1), self, root, &owner), beta = bn_tensor(bn->input(2), self, root, &owner);
  const auto mean = bn_tensor(bn->input(3), self, root, &owner), var = bn_tensor(bn->input(4), self, root, &owner);
  if (!gamma || !beta || !mean || !var) return "the BatchNorm's tensors are not attributes of one module";
  if (!mean->defined() || !var->defined()) return "the BatchNorm keeps no running statistics";
  const at::Tensor w = c->weight.value.toTensor();
  if (mean->numel() != w.size(0)) return "the BatchNorm's channels are not the convolution's output channels";
  auto [fw, fb] = nn::fold_bn_tensors(w, c->bias, *mean, *var, *gamma, *beta, eps->toDouble());
  c->weight.value = fw.set_requires_grad(w.requires_grad());
  c->bias = fb.set_requires_grad(c->bias.defined() ? c->bias.requires_grad() : w.requires_grad());
  c->spec.bias = true;
  c->batch_norm = bn;
  c->bn_owner = owner;
  return {};
}

bool quantizable_kind(const Node* n) {
  const auto k = n->kind();
  return k == c10::aten::linear || k == c10::aten::conv1d || k == c10::aten::conv2d || k == c10::aten::_convolution ||
         k == c10::aten::matmul || k == c10::aten::mm || k == c10::aten::addmm || k == c10::aten::embedding ||
         k == c10::aten::bmm || k == c10::aten::baddbmm || k == c10::aten::einsum;
}

// Ops the front door leaves float (listed so the user sees what was not quantized).
bool listed_float_kind(const Node* n) {
  static const std::set<std::string> kinds{"aten::conv3d",           "aten::conv_transpose1d",
                                           "aten::conv_transpose2d", "aten::conv_transpose3d",
                                           "aten::embedding_bag",    "aten::scaled_dot_product_attention"};
  return kinds.count(n->kind().toQualString()) != 0;
}

// A name for a float op: the first module attribute it reads, else its output's name.
std::string op_value_name(const Node* n, const Value* self, const torch::jit::Module& root) {
  for (const Value* in : n->inputs())
    if (auto ref = resolve(in, self, root)) return ref->layer_name();
  return "%" + n->output(0)->debugName();
}

// A root attribute name not taken yet.
std::string free_attribute(const torch::jit::Module& module, size_t* next) {
  std::string name;
  do {
    name = "_qforge_" + std::to_string((*next)++);
  } while (module.type()->hasAttribute(name));
  return name;
}

// Replaces c.node by `op(x, self.<attr>, self.training)`: the module's train()/eval() reaches the
// layer. A Linear call tied to an embedding's table: `qforge::tied_linear(x, layer, bias, training)`.
void replace(Graph& g, Value* self, const Candidate& c, const std::string& attr, LayerKind kind) {
  Node* n = c.node;
  torch::jit::WithInsertPoint guard(n);
  Value* holder = g.insertGetAttr(self, attr);
  Value* training = g.insertGetAttr(self, "training");
  const bool tied_table = kind == LayerKind::kEmbedding && c.spec.kind == LayerKind::kLinear;
  Value* x = c.product ? product_operand(c, 0) : n->input(c.x_at);
  Node* call = nullptr;
  const auto permuted = [&](Value* v, const std::vector<int64_t>& perm) {
    return perm.empty() ? v : g.insert(c10::aten::permute, {v, g.insertConstant(c10::IValue(perm))});
  };
  if (kind == LayerKind::kMatMul) {
    call = g.create(c10::Symbol::fromQualString(op_name(kind)),
                    {permuted(x, c.perm_a), permuted(product_operand(c, 1), c.perm_b), holder, training}, 1);
  } else if (tied_table) {
    Value* bias = c.bias_at >= 0 ? n->input(static_cast<size_t>(c.bias_at)) : g.insertConstant(c10::IValue());
    call = g.create(c10::Symbol::fromQualString("qforge::tied_linear"), {x, holder, bias, training}, 1);
  } else {
    const char* op = c.weight_left ? "qforge::linear_left" : op_name(kind);
    call = g.create(c10::Symbol::fromQualString(op), {x, holder, training}, 1);
  }
  g.insertNode(call);
  call->output()->setType(c10::TensorType::get());
  Value* out = permuted(call->output(), c.perm_out);
  // baddbmm(t, a, b) with beta = alpha = 1: t + a @ b.
  if (c.added_at >= 0) out = g.insert(c10::aten::add, {n->input(static_cast<size_t>(c.added_at)), out});
  n->output()->replaceAllUsesWith(out);
  n->destroy();
}

}  // namespace

std::vector<c10::intrusive_ptr<ScriptedLayer>> rewritten_layers(const torch::jit::Module& module) {
  std::vector<c10::intrusive_ptr<ScriptedLayer>> out;
  const c10::ClassTypePtr type = module.type();
  const c10::ClassTypePtr layer_type = scripted_layer_type();
  for (size_t i = 0; i < type->numAttributes(); ++i)
    if (*type->getAttribute(i) == *layer_type) out.push_back(module._ivalue()->getSlot(i).toCustomClass<ScriptedLayer>());
  return out;
}

void set_attribute(torch::jit::Module& root, const std::string& owner, const std::string& attr, const at::Tensor& value) {
  torch::jit::Module m = root;
  std::stringstream path(owner);
  for (std::string name; std::getline(path, name, '.');) m = m.attr(name).toModule();
  m.setattr(attr, value);
}

std::set<std::string> tensor_attributes_read(const torch::jit::Module& module) {
  const auto method = module.find_method("forward");
  QF_REQUIRE(method.has_value(), "framework/jit: the TorchScript module has no forward method");
  std::shared_ptr<Graph> g = method->graph();
  std::vector<Node*> nodes;
  collect_nodes(g->block(), &nodes);
  std::set<std::string> out;
  for (const auto& [key, uses] : attribute_reads(nodes, g->inputs().at(0), module)) {
    const size_t slash = key.find('/');
    const std::string owner = key.substr(0, slash), attr = key.substr(slash + 1);
    if (uses > 0) out.insert(owner.empty() ? attr : owner + "." + attr);
  }
  return out;
}

namespace {

// How many graph uses read each tensor, by TensorImpl: a tied tensor (lm_head.weight = tok.weight)
// is one tensor under several attribute names. Metadata reads (dtype, device) are not counted;
// slicing reads (chunk, split) are counted in both `all` and `slicing`.
struct TensorReads {
  std::map<const c10::TensorImpl*, size_t> all, slicing;
};
TensorReads tensor_reads(const std::vector<Node*>& nodes, const Value* self, const torch::jit::Module& root) {
  TensorReads reads;
  for (Node* n : nodes) {
    if (n->kind() != c10::prim::GetAttr || n->output()->type()->kind() == c10::TypeKind::ClassType) continue;
    const auto ref = resolve(n->output(), self, root);
    if (!ref || !ref->value.isTensor()) continue;
    const c10::TensorImpl* impl = ref->value.toTensor().unsafeGetTensorImpl();
    for (const torch::jit::Use& u : n->output()->uses()) {
      if (metadata_read(u.user)) continue;
      ++reads.all[impl];
      if (slicing_read(u.user) && u.offset == 0) ++reads.slicing[impl];
    }
  }
  return reads;
}

// Calls reading one weight tensor share one qforge layer (quantized once, saved once): an
// embedding's table read by Linear calls too (a tied LM head; they run qforge::tied_linear on the
// table's quantized rows). Other sharing, or other reads of the tensor, keep the calls float.
std::vector<Candidate> resolve_ties(std::vector<Candidate> found, const TensorReads& tensor_reads,
                                    const Value* self, const torch::jit::Module& module,
                                    std::vector<FloatCall>* kept_float) {
  const auto& reads = tensor_reads.all;
  std::map<const c10::TensorImpl*, std::vector<size_t>> groups;
  for (size_t i = 0; i < found.size(); ++i)
    if (!found[i].product) groups[found[i].weight.value.toTensor().unsafeGetTensorImpl()].push_back(i);
  std::vector<std::string> why(found.size());
  for (const auto& [impl, members] : groups) {
    if (members.size() == 1 && reads.at(impl) == 1) continue;
    // A Linear's weight also sliced elsewhere (nn.MultiheadAttention's packed q / k / v weight, read
    // by its unbatched and cross-attention branches): the slices read the layer's weight.
    const auto sliced = tensor_reads.slicing.find(impl);
    const LayerSpec& first = found[members[0]].spec;
    if (members.size() == 1 && first.kind == LayerKind::kLinear && !first.weight_transposed && sliced != tensor_reads.slicing.end() &&
        reads.at(impl) == 1 + sliced->second) {
      found[members[0]].sliced_elsewhere = true;
      continue;
    }
    size_t owner = members[0];
    for (size_t i : members)
      if (found[i].spec.kind == LayerKind::kEmbedding) owner = i;
    std::string reason;
    if (reads.at(impl) != members.size())
      reason = "its weight is read " + std::to_string(reads.at(impl)) + " times in the graph, " +
               std::to_string(reads.at(impl) - members.size()) + " of them by other ops (tied weights)";
    for (size_t i : members) {
      const Candidate& c = found[i];
      if (!reason.empty() || i == owner) continue;
      const LayerKind own = found[owner].spec.kind, kind = c.spec.kind;
      if (own != LayerKind::kEmbedding || (kind != LayerKind::kLinear && kind != LayerKind::kEmbedding) ||
          c.spec.weight_transposed || c.weight_left)
        reason = "its weight is shared by calls qforge cannot serve with one layer (tied weights are shared "
                 "only between an embedding table and Linear calls on it)";
    }
    for (size_t i : members) {
      if (!reason.empty()) why[i] = reason;
      else if (i != owner) found[i].tied_to = static_cast<int>(owner);
    }
  }
  std::vector<Candidate> todo;
  std::vector<int> index(found.size(), -1);
  for (size_t i = 0; i < found.size(); ++i) {
    if (why[i].empty() && found[i].tied_to < 0) why[i] = found[i].own_layer_why;
    if (!why[i].empty()) {
      kept_float->push_back({op_value_name(found[i].node, self, module), found[i].node->kind().toQualString(), why[i]});
      continue;
    }
    index[i] = static_cast<int>(todo.size());
    todo.push_back(std::move(found[i]));
  }
  for (Candidate& c : todo)
    if (c.tied_to >= 0) c.tied_to = index[static_cast<size_t>(c.tied_to)];
  return todo;
}

// The calls of the graph that become qforge ops; the others are listed in *kept_float.
std::vector<Candidate> candidates(const std::vector<Node*>& nodes, const Value* self, const torch::jit::Module& module,
                                  std::vector<FloatCall>* kept_float) {
  std::vector<Candidate> found;
  std::set<const Node*> bn_listed;
  for (Node* n : nodes) {
    if (n->kind() == c10::aten::layer_norm) {
      kept_float->push_back({op_value_name(n, self, module), "aten::layer_norm",
                             "kept float by design: normalisation runs in float32 between the quantized layers"});
      continue;
    }
    if (fast_path_op(n)) {
      kept_float->push_back({op_value_name(n, self, module), n->kind().toQualString(),
                             "PyTorch's fused inference path reads the weights itself (a trace made under "
                             "torch.no_grad() in eval mode records it): trace with gradients enabled, or script"});
      continue;
    }
    if (listed_float_kind(n)) {
      kept_float->push_back({op_value_name(n, self, module), n->kind().toQualString(),
                             "no qforge op for it in the TorchScript front door yet"});
      continue;
    }
    if (!quantizable_kind(n)) continue;
    Candidate c;
    const std::string why = analyse(n, self, module, &c);
    if (!why.empty()) {
      kept_float->push_back({op_value_name(n, self, module), n->kind().toQualString(), why});
      continue;
    }
    found.push_back(std::move(c));
  }
  std::vector<Candidate> todo =
      resolve_ties(std::move(found), tensor_reads(nodes, self, module), self, module, kept_float);
  for (Candidate& c : todo) {
    if (c.tied_to >= 0 || c.sliced_elsewhere || c.product) continue;  // a shared weight is never folded: its other readers need it as it is
    const std::string bn_why = fold_batch_norm(self, module, &c);
    for (const torch::jit::Use& u : c.node->output()->uses())
      if (!bn_why.empty() && u.user->kind() == c10::aten::batch_norm && bn_listed.insert(u.user).second)
        kept_float->push_back({op_value_name(u.user, self, module), "aten::batch_norm", bn_why});
    if (c.batch_norm) bn_listed.insert(c.batch_norm);
  }
  for (Node* n : nodes)
    if (n->kind() == c10::aten::batch_norm && !bn_listed.count(n))
      kept_float->push_back({op_value_name(n, self, module), "aten::batch_norm",
                             "does not follow a convolution qforge rewrites, so it cannot be folded"});
  return todo;
}

// The qforge layer a sliced tensor's reads come from: its attribute, the op reading it, its name.
struct SliceSource {
  std::string attr;
  const char* op = "";
  std::string layer;
};

// Points every slicing read (chunk, split) of a tensor in `sources` at `op(self.<attr>, self.training)`:
// the layer's weight or bias as the layer holds it (float, fake-quantized, dequantized once frozen).
void read_slices_from_layers(Graph& g, Value* self, const torch::jit::Module& module,
                             const std::map<const c10::TensorImpl*, SliceSource>& sources, std::vector<TiedCall>* notes) {
  if (sources.empty()) return;
  std::vector<Node*> nodes;
  collect_nodes(g.block(), &nodes);
  for (Node* n : nodes) {
    if (n->kind() != c10::prim::GetAttr || n->output()->type()->kind() == c10::TypeKind::ClassType) continue;
    const auto ref = resolve(n->output(), self, module);
    if (!ref || !ref->value.isTensor()) continue;
    const auto source = sources.find(ref->value.toTensor().unsafeGetTensorImpl());
    if (source == sources.end()) continue;
    for (const torch::jit::Use& u : n->output()->uses()) {
      if (!slicing_read(u.user) || u.offset != 0) continue;
      torch::jit::WithInsertPoint guard(u.user);
      Node* read = g.create(c10::Symbol::fromQualString(source->second.op),
                            {g.insertGetAttr(self, source->second.attr), g.insertGetAttr(self, "training")}, 1);
      g.insertNode(read);
      read->output()->setType(c10::TensorType::get());
      u.user->replaceInput(0, read->output());
      notes->push_back({ref->layer_name(), u.user->kind().toQualString(), source->second.layer, true});
    }
  }
}

}  // namespace

namespace {

// Where an inlined node comes from: one entry per call it was inlined through, outermost first
// (the function called, the call's place in the source, the module instance's attribute name).
using CallKey = std::vector<std::tuple<const void*, const void*, size_t, size_t, std::string>>;

CallKey call_key(const Node* n) {
  CallKey key;
  if (!n->callstack()) return key;
  for (const auto& entry : (*n->callstack())->vec()) {
    const torch::jit::SourceRange& range = std::get<1>(entry);
    const auto& instance = std::get<2>(entry);
    key.emplace_back(std::get<0>(entry), range.source().get(), range.start(), range.end(),
                     instance ? instance->instance_name() : std::string());
  }
  return key;
}

// The dotted path of module value v, read through prim::GetAttr from the graph's self.
std::optional<std::string> module_path(const Value* v, const Value* self) {
  std::vector<std::string> names;
  for (; v != self; v = v->node()->input(0)) {
    if (v->node()->kind() != c10::prim::GetAttr) return std::nullopt;
    names.push_back(v->node()->s(c10::attr::name));
  }
  std::string path;
  for (auto it = names.rbegin(); it != names.rend(); ++it) path += (path.empty() ? "" : ".") + *it;
  return path;
}

// The module whose forward made a node of the inlined graph. Each inlined call gives the nodes it
// inserted a call-stack object of their own (one per call and inner call chain), so a node shares
// its object with the prim::GetAttr reads of the method's body, whose self is the module (the
// shortest path read there). A body that reads nothing (a free function such as
// F.multi_head_attention_forward, a module without attributes) is found by its call chain instead:
// the caller's module, then the instance's attribute name. Calls of one method at one place in the
// source (a loop over a ModuleList unrolled) share a chain: several modules for one chain give their
// common module path.
class CallerPaths {
 public:
  // `modules`: the TorchScript module's module paths (named_modules).
  CallerPaths(const std::vector<Node*>& nodes, const Value* self, std::set<std::string> modules)
      : modules_(std::move(modules)) {
    for (const Node* n : nodes) {
      if (n->kind() != c10::prim::GetAttr) continue;
      const auto path = module_path(n->input(0), self);
      if (!path) continue;
      auto [it, fresh] = by_stack_.emplace(stack_of(n), *path);
      if (!fresh && depth(*path) < depth(it->second)) it->second = *path;
      std::set<std::string>& paths = by_key_[call_key(n)];
      if (!paths.empty() && depth(*path) < depth(*paths.begin())) paths.clear();
      if (paths.empty() || depth(*path) == depth(*paths.begin())) paths.insert(*path);
    }
  }
  std::string of(const Node* n) const {
    if (const auto it = by_stack_.find(stack_of(n)); it != by_stack_.end()) return it->second;
    return of(call_key(n));
  }

 private:
  static const void* stack_of(const Node* n) { return n->callstack() ? n->callstack()->get() : nullptr; }
  static size_t depth(const std::string& path) {
    return path.empty() ? 0 : 1 + static_cast<size_t>(std::count(path.begin(), path.end(), '.'));
  }
  // The longest dotted prefix the paths share ("blocks" for "blocks.0.attn" and "blocks.1.attn").
  static std::string common_module(const std::set<std::string>& paths) {
    std::string out;
    for (size_t end = 0;; ++end) {
      end = paths.begin()->find('.', end);
      const std::string prefix = paths.begin()->substr(0, end);
      for (const std::string& p : paths)
        if (p.compare(0, prefix.size(), prefix) != 0 || (p.size() > prefix.size() && p[prefix.size()] != '.')) return out;
      out = prefix;
      if (end == std::string::npos) return out;
    }
  }
  std::string of(CallKey key) const {
    if (key.empty()) return "";
    if (const auto it = by_key_.find(key); it != by_key_.end())
      return it->second.size() == 1 ? *it->second.begin() : common_module(it->second);
    const std::string name = std::get<4>(key.back());
    key.pop_back();
    const std::string caller = of(key);
    if (name.empty() || name == "SELF" || name == "INSTANCE_NAME_UNKNOWN") return caller;
    const std::string joined = caller.empty() ? name : caller + "." + name;
    if (modules_.count(joined)) return joined;
    // The instance name is the receiver's last attribute only (blk.sdpa in a loop over blocks):
    // the common path of the modules under the caller that end in it.
    std::set<std::string> found;
    for (const std::string& m : modules_)
      if ((caller.empty() || m.compare(0, caller.size() + 1, caller + ".") == 0) && m.size() > name.size() &&
          m.compare(m.size() - name.size() - 1, name.size() + 1, "." + name) == 0)
        found.insert(m);
    return found.empty() ? caller : common_module(found);
  }
  std::set<std::string> modules_;
  std::map<const void*, std::string> by_stack_;
  std::map<CallKey, std::set<std::string>> by_key_;
};

// The module path of every new layer (empty for a call sharing another's), none equal to a name the
// TorchScript module or another layer already uses. A weight's layer: its layer_name(); a product
// of two activations: "<module>.matmul_<i>" in graph order (i counted per module). A layer holds no
// children, so a path under another layer's goes beside it (outside_layers: "attn_table" for an
// embedding at "attn.table" when "attn" is a Linear's, "attn_matmul_0" for attn's product).
std::vector<std::string> layer_paths(const std::vector<Candidate>& todo, const std::vector<Node*>& nodes,
                                     const Value* self, const torch::jit::Module& module) {
  std::set<std::string> weights, modules, taken;
  for (const auto& l : rewritten_layers(module)) weights.insert(l->path());
  for (const Candidate& c : todo)
    if (!c.product && c.tied_to < 0) weights.insert(c.weight.layer_name());
  for (const auto& m : module.named_modules()) modules.insert(m.name);
  for (const auto& m : module.named_modules()) taken.insert(outside_layers(m.name, weights));
  for (const auto& a : module.named_attributes(/*recurse=*/true)) taken.insert(outside_layers(a.name, weights));
  for (const auto& l : rewritten_layers(module)) taken.insert(l->path());
  std::vector<std::string> out(todo.size());
  for (size_t i = 0; i < todo.size(); ++i)
    if (!todo[i].product && todo[i].tied_to < 0) taken.insert(out[i] = outside_layers(todo[i].weight.layer_name(), weights));
  const CallerPaths callers(nodes, self, modules);
  std::map<std::string, int> next;
  for (size_t i = 0; i < todo.size(); ++i) {
    if (!todo[i].product || todo[i].tied_to >= 0) continue;  // a shared product has its first call's path
    const std::string owner = callers.of(todo[i].node);
    do {
      out[i] = outside_layers((owner.empty() ? "" : owner + ".") + "matmul_" + std::to_string(next[owner]++), weights);
    } while (!taken.insert(out[i]).second);
  }
  return out;
}

// Whether a and b hold the same values: one graph value, equal constants, or one pure shape or
// scaling op (transpose, view, division by a constant, ...) of the same values, up to `depth` ops back.
bool same_value(const Value* a, const Value* b, int depth) {
  if (a == b) return true;
  const Node* na = a->node();
  const Node* nb = b->node();
  if (na->kind() == c10::prim::Constant && nb->kind() == c10::prim::Constant) {
    const auto va = torch::jit::toIValue(a), vb = torch::jit::toIValue(b);
    return va && vb && !va->isTensor() && !vb->isTensor() && *va == *vb;
  }
  static const std::set<c10::Symbol> pure{c10::aten::transpose, c10::aten::t,       c10::aten::numpy_T,
                                          c10::aten::permute,   c10::aten::view,    c10::aten::reshape,
                                          c10::aten::contiguous, c10::aten::div,    c10::aten::mul};
  if (depth == 0 || na->kind() != nb->kind() || !pure.count(na->kind()) || na->inputs().size() != nb->inputs().size() ||
      na->outputs().size() != 1 || nb->outputs().size() != 1)
    return false;
  for (size_t i = 0; i < na->inputs().size(); ++i)
    if (!same_value(na->input(i), nb->input(i), depth - 1)) return false;
  return true;
}

// A product of the same two operands as an earlier one shares its MatMul (nn.MultiheadAttention's
// q @ k^T is a baddbmm in the branch with a mask and a bmm in the other: one layer for both, so
// the one calibration sees serves either branch).
void share_products(std::vector<Candidate>* todo) {
  for (size_t i = 0; i < todo->size(); ++i) {
    Candidate& c = (*todo)[i];
    if (!c.product) continue;
    for (size_t j = 0; j < i; ++j) {
      const Candidate& o = (*todo)[j];
      if (!o.product || o.tied_to >= 0) continue;
      // (An einsum shares only with an einsum of the same permutations.)
      if (c.einsum == o.einsum && c.perm_a == o.perm_a && c.perm_b == o.perm_b &&
          same_value(product_operand(c, 0), product_operand(o, 0), 3) &&
          same_value(product_operand(c, 1), product_operand(o, 1), 3)) {
        c.tied_to = static_cast<int>(j);
        break;
      }
    }
  }
}

}  // namespace

RewriteResult rewrite_forward(torch::jit::Module& module) {
  const auto method = module.find_method("forward");
  QF_REQUIRE(method.has_value(), "framework/jit: the TorchScript module has no forward method");
  std::shared_ptr<Graph> g = method->graph();
  torch::jit::Inline(*g);
  torch::jit::ConstantPropagation(g);
  torch::jit::EliminateDeadCode(g);
  simplify_for_rewrite(g, module);
  Value* self = g->inputs().at(0);
  std::vector<Node*> nodes;
  collect_nodes(g->block(), &nodes);

  RewriteResult result;
  std::vector<Candidate> todo = candidates(nodes, self, module, &result.kept_float);
  share_products(&todo);
  const std::vector<std::string> paths = layer_paths(todo, nodes, self, module);
  size_t next = rewritten_layers(module).size();
  std::vector<std::string> attrs(todo.size());
  for (size_t i = 0; i < todo.size(); ++i) {
    Candidate& c = todo[i];
    if (c.tied_to >= 0) continue;
    if (c.product) {
      // The module whose forward makes the product owns it (no tensors to point at).
      const size_t dot = paths[i].rfind('.');
      auto layer = c10::make_intrusive<ScriptedLayer>(
          paths[i], c.spec, TensorHome{dot == std::string::npos ? "" : paths[i].substr(0, dot), "", ""},
          at::Tensor(), at::Tensor());
      const std::string attr = free_attribute(module, &next);
      module.register_attribute(attr, scripted_layer_type(), c10::IValue(layer));
      replace(*g, self, c, attr, c.spec.kind);
      attrs[i] = attr;
      result.layers.push_back(std::move(layer));
      continue;
    }
    const at::Tensor weight = c.weight.value.toTensor();
    if (c.batch_norm) {
      // The folded tensors replace the module's own, so its parameters stay what the layer trains.
      set_attribute(module, c.weight.owner, c.weight.attr, weight);
      if (!c.bias_attr.empty()) set_attribute(module, c.weight.owner, c.bias_attr, c.bias);
      c.batch_norm->output()->replaceAllUsesWith(c.node->output());
      c.batch_norm->destroy();
      result.folded.emplace_back(c.bn_owner, paths[i]);
    }
    // x @ W: the layer's weight is W's transpose, a view of W's storage (an optimizer step on it
    // updates the script's W; the graph no longer reads W itself).
    const at::Tensor bound = c.spec.weight_transposed ? weight.detach().t().requires_grad_(weight.requires_grad()) : weight;
    auto layer = c10::make_intrusive<ScriptedLayer>(paths[i], c.spec,
                                                    TensorHome{c.weight.owner, c.weight.attr, c.bias_attr}, bound,
                                                    c.bias);
    const std::string attr = free_attribute(module, &next);
    module.register_attribute(attr, scripted_layer_type(), c10::IValue(layer));
    replace(*g, self, c, attr, c.spec.kind);
    attrs[i] = attr;
    result.layers.push_back(std::move(layer));
  }
  for (const Candidate& c : todo) {
    if (c.tied_to < 0) continue;
    const Candidate& owner = todo[static_cast<size_t>(c.tied_to)];
    const std::string& layer = paths[static_cast<size_t>(c.tied_to)];
    result.tied.push_back({c.product ? layer : c.weight.layer_name(), c.node->kind().toQualString(), layer});
    replace(*g, self, c, attrs[static_cast<size_t>(c.tied_to)], owner.spec.kind);
  }
  std::map<const c10::TensorImpl*, SliceSource> sources;
  for (size_t i = 0; i < todo.size(); ++i) {
    if (!todo[i].sliced_elsewhere) continue;
    sources[todo[i].weight.value.toTensor().unsafeGetTensorImpl()] = {attrs[i], "qforge::weight", paths[i]};
    if (todo[i].bias.defined()) sources[todo[i].bias.unsafeGetTensorImpl()] = {attrs[i], "qforge::bias", paths[i]};
  }
  read_slices_from_layers(*g, self, module, sources, &result.tied);
  torch::jit::EliminateDeadCode(g);
  result.chained = chain_conv_codes(*g, module);
  result.residual = fuse_residual_adds(*g, module);
  result.max_pools = route_max_pools(*g);
  torch::jit::EliminateDeadCode(g);
  return result;
}

}  // namespace qforge::jit
