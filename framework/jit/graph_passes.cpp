// Graph passes before the rewrite: configuration attributes as constants, identity tests of one
// value, and the fast-path branches of PyTorch's transformer modules made unreachable.
#include "framework/jit/graph_passes.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include <algorithm>
#include <set>

namespace qforge::jit {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

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
    const auto object = value.toObject();
    const auto slot = object->type()->findAttributeSlot(chain[i]);
    ref.parameter = slot && object->type()->is_parameter(*slot);
    value = object->getAttr(chain[i]);
    if (i + 1 < chain.size()) ref.owner += (ref.owner.empty() ? "" : ".") + chain[i];
  }
  ref.attr = chain.back();
  ref.value = std::move(value);
  return ref;
}

void collect_nodes(Block* b, std::vector<Node*>* out) {
  for (Node* n : b->nodes()) {
    out->push_back(n);
    for (Block* sub : n->blocks()) collect_nodes(sub, out);
  }
}

bool fast_path_op(const Node* n) {
  const std::string k = n->kind().toQualString();
  return k == "aten::_native_multi_head_attention" || k == "aten::_transformer_encoder_layer_fwd";
}

bool nested_fast_path_op(const Node* n) {
  return std::string(n->kind().toQualString()) == "aten::_nested_tensor_from_mask";
}

bool metadata_read(const Node* n) {
  return n->kind() == c10::prim::dtype || n->kind() == c10::prim::device || n->kind() == c10::prim::is_cuda;
}

bool slicing_read(const Node* n) {
  static const std::set<std::string> kinds{"aten::chunk", "aten::split", "aten::split_with_sizes",
                                           "aten::unsafe_chunk", "aten::unsafe_split"};
  return kinds.count(n->kind().toQualString()) != 0;
}

namespace {

// Replaces n's single output by the constant `value` (inserted before n).
void replace_by_constant(Graph& g, Node* n, const c10::IValue& value) {
  torch::jit::WithInsertPoint guard(n);
  n->output()->replaceAllUsesWith(g.insertConstant(value));
}

// The attribute names the forward assigns (prim::SetAttr): those are state, not configuration.
std::set<std::string> assigned_attributes(const std::vector<Node*>& nodes) {
  std::set<std::string> out;
  for (const Node* n : nodes)
    if (n->kind() == c10::prim::SetAttr) out.insert(n->s(c10::attr::name));
  return out;
}

// True when v is a string or computed from one by `not`, `len`, comparisons (`not reason`).
bool tests_a_reason(const Value* v, int depth = 0) {
  if (v->type()->kind() == c10::TypeKind::StringType) return true;
  if (depth > 3) return false;
  static const std::set<std::string> through{"aten::__not__", "aten::gt", "aten::len", "aten::Bool", "aten::ne",
                                             "aten::eq"};
  if (!through.count(v->node()->kind().toQualString())) return false;
  for (const Value* in : v->node()->inputs())
    if (tests_a_reason(in, depth + 1)) return true;
  return false;
}

// Each prim::If around fast-path op n whose condition tests a reason string takes its other branch.
bool bypass_fast_path(Graph& g, Node* n) {
  bool changed = false;
  for (Block* b = n->owningBlock(); b->owningNode() != nullptr; b = b->owningNode()->owningBlock()) {
    Node* branch = b->owningNode();
    if (branch->kind() != c10::prim::If || !tests_a_reason(branch->input(0))) continue;
    torch::jit::WithInsertPoint guard(branch);
    branch->replaceInput(0, g.insertConstant(branch->blocks()[0] != b));
    changed = true;
  }
  return changed;
}

// One round of the simplifications; true when it changed the graph.
bool simplify_once(Graph& g, const torch::jit::Module& root) {
  std::vector<Node*> nodes;
  collect_nodes(g.block(), &nodes);
  const std::set<std::string> assigned = assigned_attributes(nodes);
  const Value* self = g.inputs().at(0);
  bool changed = false;
  for (Node* n : nodes) {
    const auto k = n->kind();
    if (k == c10::prim::GetAttr) {
      const auto kind = n->output()->type()->kind();
      const std::string name = n->s(c10::attr::name);
      if (name == "training" || assigned.count(name) || n->output()->uses().empty()) continue;
      const auto ref = resolve(n->output(), self, root);
      if (!ref || !(ref->value.isBool() || ref->value.isNone()) || kind == c10::TypeKind::ClassType) continue;
      replace_by_constant(g, n, ref->value);
      changed = true;
    } else if ((k == c10::aten::__is__ || k == c10::aten::__isnot__) && n->input(0) == n->input(1)) {
      replace_by_constant(g, n, c10::IValue(k == c10::aten::__is__));
      changed = true;
    } else if (fast_path_op(n) || nested_fast_path_op(n)) {
      changed = bypass_fast_path(g, n) || changed;
    }
  }
  return changed;
}

}  // namespace

void simplify_for_rewrite(const std::shared_ptr<Graph>& g, const torch::jit::Module& root) {
  std::shared_ptr<Graph> graph = g;
  for (int round = 0; round < 16 && simplify_once(*graph, root); ++round) {
    torch::jit::ConstantPropagation(graph);
    torch::jit::EliminateDeadCode(graph);
  }
}

}  // namespace qforge::jit
