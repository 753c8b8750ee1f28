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

#include "framework/core/error.h"

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
  LayerSpec spec;
  AttrRef weight;
  at::Tensor bias;
  std::string bias_attr;
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

// Why node n (a linear or convolution) cannot become a qforge op, or empty with *c filled.
std::string analyse(Node* n, const Value* self, const torch::jit::Module& root, Candidate* c) {
  const auto w = resolve(n->input(1), self, root);
  if (!w) return "the weight is computed in the graph, not read from a module attribute";
  if (!w->value.isTensor()) return "the weight attribute '" + w->key() + "' is not a tensor";
  const at::Tensor wt = w->value.toTensor();
  if (wt.scalar_type() != at::kFloat) return std::string("weight of dtype ") + c10::toString(wt.scalar_type()) + ": qforge layers hold float32 weights";
  if (!wt.is_cpu()) return "weight on " + wt.device().str() + ": load the TorchScript module on the CPU";
  c->node = n;
  c->weight = *w;
  if (n->input(2)->type()->kind() != c10::TypeKind::NoneType) {
    const auto b = resolve(n->input(2), self, root);
    if (!b) return "the bias is computed in the graph, not read from a module attribute";
    if (!b->value.isNone()) {
      if (!b->value.isTensor() || b->value.toTensor().scalar_type() != at::kFloat) return "the bias is not a float32 tensor";
      c->bias = b->value.toTensor();
      c->bias_attr = b->attr;
      if (b->owner != w->owner) return "weight and bias belong to different modules";
    }
  }
  c->spec.bias = c->bias.defined();
  if (n->kind() == c10::aten::linear) {
    if (wt.dim() != 2) return "linear weight of " + std::to_string(wt.dim()) + " dimensions";
    c->spec.kind = LayerKind::kLinear;
    c->spec.out = wt.size(0);
    c->spec.in = wt.size(1);
    return {};
  }
  return read_conv_options(n, wt, c);
}

bool quantizable_kind(const Node* n) {
  const auto k = n->kind();
  return k == c10::aten::linear || k == c10::aten::conv1d || k == c10::aten::conv2d || k == c10::aten::_convolution;
}

// Ops the front door leaves float (listed so the user sees what was not quantized).
bool listed_float_kind(const Node* n) {
  static const std::set<std::string> kinds{"aten::matmul",  "aten::mm",        "aten::bmm",
                                           "aten::addmm",   "aten::einsum",    "aten::embedding",
                                           "aten::conv3d",  "aten::conv_transpose1d", "aten::conv_transpose2d",
                                           "aten::conv_transpose3d", "aten::embedding_bag", "aten::baddbmm"};
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
void replace(Graph& g, Value* self, Node* n, const std::string& attr, LayerKind kind) {
  torch::jit::WithInsertPoint guard(n);
  Value* holder = g.insertGetAttr(self, attr);
  Value* training = g.insertGetAttr(self, "training");
  Node* call = g.create(c10::Symbol::fromQualString(op_name(kind)), {n->input(0), holder, training}, 1);
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
  const auto reads = attribute_reads(nodes, self, module);

  RewriteResult result;
  std::vector<Candidate> todo;
  for (Node* n : nodes) {
    if (listed_float_kind(n)) {
      result.kept_float.push_back({op_value_name(n, self, module), n->kind().toQualString(),
                                   "no qforge op for it in the TorchScript front door yet"});
      continue;
    }
    if (!quantizable_kind(n)) continue;
    Candidate c;
    std::string why = analyse(n, self, module, &c);
    if (why.empty() && reads.at(c.weight.key()) > 1)
      why = "its weight is read " + std::to_string(reads.at(c.weight.key())) + " times in the graph (tied weights)";
    if (!why.empty()) {
      result.kept_float.push_back({op_value_name(n, self, module), n->kind().toQualString(), why});
      continue;
    }
    todo.push_back(std::move(c));
  }
  size_t next = rewritten_layers(module).size();
  for (Candidate& c : todo) {
    auto layer = c10::make_intrusive<ScriptedLayer>(c.weight.layer_name(), c.spec,
                                                    TensorHome{c.weight.owner, c.weight.attr, c.bias_attr},
                                                    c.weight.value.toTensor(), c.bias);
    const std::string attr = free_attribute(module, &next);
    module.register_attribute(attr, scripted_layer_type(), c10::IValue(layer));
    replace(*g, self, c.node, attr, c.spec.kind);
    result.layers.push_back(std::move(layer));
  }
  torch::jit::EliminateDeadCode(g);
  return result;
}

}  // namespace qforge::jit
