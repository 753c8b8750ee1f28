// The forms of the calls the graph rewrite takes (call_forms.h).
#include "framework/jit/call_forms.h"

#include <torch/csrc/jit/ir/constants.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>

#include "framework/nn/conv_bn_fold.h"

namespace qforge::jit {

namespace {

using torch::jit::Node;
using torch::jit::Value;


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

}  // namespace

Value* product_operand(const Candidate& c, int which) {
  const size_t at = which == 0 ? c.x_at : c.other_at;
  return c.einsum ? c.node->input(1)->node()->input(at) : c.node->input(at);
}

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

namespace {

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

}  // namespace

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

bool listed_float_kind(const Node* n) {
  static const std::set<std::string> kinds{"aten::conv3d",           "aten::conv_transpose1d",
                                           "aten::conv_transpose2d", "aten::conv_transpose3d",
                                           "aten::embedding_bag",    "aten::scaled_dot_product_attention"};
  return kinds.count(n->kind().toQualString()) != 0;
}

}  // namespace qforge::jit
