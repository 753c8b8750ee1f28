// The forward graph rewrite: aten::linear / conv calls on module attributes -> qforge ops.
#include "framework/jit/graph_rewrite.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "framework/core/error.h"
#include "framework/nn/conv_bn_fold.h"

namespace qforge::jit {

namespace {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// A tensor (or None) attribute of a module of the TorchScript module: its owner's path and name.
struct AttrRef {
  std::string owner;
  std::string attr;
  c10::IValue value;
  std::string key() const { return owner + "/" + attr; }
  // The layer name of a weight: the owning module's path for `weight`, else owner.attr.
  std::string layer_name() const { return attr == "weight" && !owner.empty() ? owner : (owner.empty() ? attr : owner + "." + attr); }
};

// The attribute v reads through a chain of prim::GetAttr from the graph's self, if it is one.
std::optional<AttrRef> resolve(const Value* v, const Value* self, const torch::jit::Module& root) {
  std::vector<std::string> chain;
  for (; v != self; v = v->node()->input(0)) {
    if (v->node()->kind() != c10::prim::GetAttr) return std::nullopt;
    chain.push_back(v->node()->s(c10::attr::name));
  }
  if (chain.empty()) return std::nullopt;
  std::reverse(chain.begin(), chain.end());
  c10::IValue value = root._ivalue();
  AttrRef ref;
  for (size_t i = 0; i < chain.size(); ++i) {
    if (!value.isObject()) return std::nullopt;
    value = value.toObject()->getAttr(chain[i]);
    if (i + 1 < chain.size()) ref.owner += (ref.owner.empty() ? "" : ".") + chain[i];
  }
  ref.attr = chain.back();
  ref.value = std::move(value);
  return ref;
}

void collect_nodes(torch::jit::Block* b, std::vector<Node*>* out) {
  for (Node* n : b->nodes()) {
    out->push_back(n);
    for (torch::jit::Block* sub : n->blocks()) collect_nodes(sub, out);
  }
}

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
  Value* x = nullptr;  // the op's input (an embedding's indices)
  LayerSpec spec;
  AttrRef weight;
  at::Tensor bias;
  std::string bias_attr;
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
  return (lo == 0 && hi == 1) || (lo == -2 && hi == -1) || (lo == 0 && hi == -1) || (lo == -2 && hi == 1) ? t->input(0)
                                                                                                        : nullptr;
}

// The weight operand of a matmul-like call, x @ W^T as torch emits nn.Linear (matmul / mm of x and
// t(W), addmm(b, x, t(W)) with beta = alpha = 1); returns why not (empty: *c's x, weight and bias set).
std::string matmul_operands(Node* n, const Value* self, const torch::jit::Module& root, Candidate* c) {
  const bool addmm = n->kind() == c10::aten::addmm;
  const Value* rhs = n->input(addmm ? 2 : 1);
  const Value* w = transposed_matrix(rhs);
  if (!w || !resolve(w, self, root)) {
    if (resolve(rhs, self, root))
      return "no qforge op for it in the TorchScript front door yet: the weight is used as [in, out] (x @ W); "
             "x @ W.t() and F.linear become qforge Linear layers";
    if (resolve(n->input(addmm ? 1 : 0), self, root))
      return "no qforge op for it in the TorchScript front door yet: the weight is the left operand (W @ x)";
    return "multiplies two computed tensors (activations): no weight to quantize";
  }
  if (addmm) {
    const auto beta = torch::jit::toIValue(n->input(3)), alpha = torch::jit::toIValue(n->input(4));
    if (!beta || !alpha || !(beta->isInt() || beta->isDouble()) || !(alpha->isInt() || alpha->isDouble()) ||
        beta->toScalar().toDouble() != 1.0 || alpha->toScalar().toDouble() != 1.0)
      return "addmm with beta or alpha other than the constant 1";
    const auto b = resolve(n->input(0), self, root);
    if (!b || !b->value.isTensor() || b->value.toTensor().dim() != 1)
      return "the added term is not a bias vector read from a module attribute";
  }
  c->x = n->input(addmm ? 1 : 0);
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
  c->spec.kind = LayerKind::kEmbedding;
  c->spec.in = w.size(0);
  c->spec.out = w.size(1);
  // A negative padding_idx counts from the end, as torch.nn.Embedding's does.
  const int64_t p = padding_idx->toInt();
  c->spec.padding_idx = p == -1 ? -1 : (p < 0 ? p + w.size(0) : p);
  c->spec.bias = false;
  return {};
}

// Why node n (a linear, convolution, matmul-like call or embedding) cannot become a qforge op, or
// empty with *c filled.
std::string analyse(Node* n, const Value* self, const torch::jit::Module& root, Candidate* c) {
  const auto k = n->kind();
  const bool matmul = k == c10::aten::matmul || k == c10::aten::mm || k == c10::aten::addmm;
  const bool embedding = k == c10::aten::embedding;
  c->x = n->input(embedding ? 1 : 0);
  if (matmul) {
    const std::string why = matmul_operands(n, self, root, c);
    if (!why.empty()) return why;
  }
  const Value* weight_value =
      matmul ? transposed_matrix(n->input(k == c10::aten::addmm ? 2 : 1)) : n->input(embedding ? 0 : 1);
  const auto w = resolve(weight_value, self, root);
  if (!w) return "the weight is computed in the graph, not read from a module attribute";
  if (!w->value.isTensor()) return "the weight attribute '" + w->key() + "' is not a tensor";
  const at::Tensor wt = w->value.toTensor();
  if (wt.scalar_type() != at::kFloat) return std::string("weight of dtype ") + c10::toString(wt.scalar_type()) + ": qforge layers hold float32 weights";
  if (!wt.is_cpu()) return "weight on " + wt.device().str() + ": load the TorchScript module on the CPU";
  c->node = n;
  c->weight = *w;
  if (embedding) return embedding_options(n, wt, c);
  const Value* bias_value = matmul ? (k == c10::aten::addmm ? n->input(0) : nullptr) : n->input(2);
  if (bias_value && bias_value->type()->kind() != c10::TypeKind::NoneType) {
    const auto b = resolve(bias_value, self, root);
    if (!b) return "the bias is computed in the graph, not read from a module attribute";
    if (!b->value.isNone()) {
      if (!b->value.isTensor() || b->value.toTensor().scalar_type() != at::kFloat) return "the bias is not a float32 tensor";
      c->bias = b->value.toTensor();
      c->bias_attr = b->attr;
      if (b->owner != w->owner) return "weight and bias belong to different modules";
    }
  }
  c->spec.bias = c->bias.defined();
  if (k == c10::aten::linear || matmul) {
    if (wt.dim() != 2) return "linear weight of " + std::to_string(wt.dim()) + " dimensions";
    c->spec.kind = LayerKind::kLinear;
    c->spec.out = wt.size(0);
    c->spec.in = wt.size(1);
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
         k == c10::aten::matmul || k == c10::aten::mm || k == c10::aten::addmm || k == c10::aten::embedding;
}

// Ops the front door leaves float (listed so the user sees what was not quantized).
bool listed_float_kind(const Node* n) {
  static const std::set<std::string> kinds{"aten::bmm",   "aten::einsum", "aten::conv3d", "aten::conv_transpose1d",
                                           "aten::conv_transpose2d", "aten::conv_transpose3d",
                                           "aten::embedding_bag",    "aten::baddbmm"};
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

// Replaces c.node by `op(x, self.<attr>, self.training)`: the module's train()/eval() reaches the layer.
void replace(Graph& g, Value* self, Node* n, Value* x, const std::string& attr, LayerKind kind) {
  torch::jit::WithInsertPoint guard(n);
  Value* holder = g.insertGetAttr(self, attr);
  Value* training = g.insertGetAttr(self, "training");
  Node* call = g.create(c10::Symbol::fromQualString(op_name(kind)), {x, holder, training}, 1);
  g.insertNode(call);
  call->output()->setType(c10::TensorType::get());
  n->output()->replaceAllUsesWith(call->output());
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

// The calls of the graph that become qforge ops; the others are listed in *kept_float.
std::vector<Candidate> candidates(const std::vector<Node*>& nodes, const Value* self, const torch::jit::Module& module,
                                  std::vector<FloatCall>* kept_float) {
  const auto reads = attribute_reads(nodes, self, module);
  std::vector<Candidate> todo;
  std::set<const Node*> bn_listed;
  for (Node* n : nodes) {
    if (n->kind() == c10::aten::layer_norm) {
      kept_float->push_back({op_value_name(n, self, module), "aten::layer_norm",
                             "kept float by design: normalisation runs in float32 between the quantized layers"});
      continue;
    }
    if (listed_float_kind(n)) {
      kept_float->push_back({op_value_name(n, self, module), n->kind().toQualString(),
                             "no qforge op for it in the TorchScript front door yet"});
      continue;
    }
    if (!quantizable_kind(n)) continue;
    Candidate c;
    std::string why = analyse(n, self, module, &c);
    if (why.empty() && reads.at(c.weight.key()) > 1)
      why = "its weight is read " + std::to_string(reads.at(c.weight.key())) + " times in the graph (tied weights)";
    if (!why.empty()) {
      kept_float->push_back({op_value_name(n, self, module), n->kind().toQualString(), why});
      continue;
    }
    const std::string bn_why = fold_batch_norm(self, module, &c);
    for (const torch::jit::Use& u : n->output()->uses())
      if (!bn_why.empty() && u.user->kind() == c10::aten::batch_norm && bn_listed.insert(u.user).second)
        kept_float->push_back({op_value_name(u.user, self, module), "aten::batch_norm", bn_why});
    if (c.batch_norm) bn_listed.insert(c.batch_norm);
    todo.push_back(std::move(c));
  }
  for (Node* n : nodes)
    if (n->kind() == c10::aten::batch_norm && !bn_listed.count(n))
      kept_float->push_back({op_value_name(n, self, module), "aten::batch_norm",
                             "does not follow a convolution qforge rewrites, so it cannot be folded"});
  return todo;
}

}  // namespace

RewriteResult rewrite_forward(torch::jit::Module& module) {
  const auto method = module.find_method("forward");
  QF_REQUIRE(method.has_value(), "framework/jit: the TorchScript module has no forward method");
  std::shared_ptr<Graph> g = method->graph();
  torch::jit::Inline(*g);
  torch::jit::ConstantPropagation(g);
  torch::jit::EliminateDeadCode(g);
  Value* self = g->inputs().at(0);
  std::vector<Node*> nodes;
  collect_nodes(g->block(), &nodes);

  RewriteResult result;
  std::vector<Candidate> todo = candidates(nodes, self, module, &result.kept_float);
  size_t next = rewritten_layers(module).size();
  for (Candidate& c : todo) {
    const at::Tensor weight = c.weight.value.toTensor();
    if (c.batch_norm) {
      // The folded tensors replace the module's own, so its parameters stay what the layer trains.
      set_attribute(module, c.weight.owner, c.weight.attr, weight);
      if (!c.bias_attr.empty()) set_attribute(module, c.weight.owner, c.bias_attr, c.bias);
      c.batch_norm->output()->replaceAllUsesWith(c.node->output());
      c.batch_norm->destroy();
      result.folded.emplace_back(c.bn_owner, c.weight.layer_name());
    }
    auto layer = c10::make_intrusive<ScriptedLayer>(c.weight.layer_name(), c.spec,
                                                    TensorHome{c.weight.owner, c.weight.attr, c.bias_attr}, weight,
                                                    c.bias);
    const std::string attr = free_attribute(module, &next);
    module.register_attribute(attr, scripted_layer_type(), c10::IValue(layer));
    replace(*g, self, c.node, c.x, attr, c.spec.kind);
    result.layers.push_back(std::move(layer));
  }
  torch::jit::EliminateDeadCode(g);
  return result;
}

}  // namespace qforge::jit
