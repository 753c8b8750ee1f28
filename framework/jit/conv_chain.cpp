// Convolutions chained through int8 codes (conv_chain.h).
#include "framework/jit/conv_chain.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>

#include <optional>
#include <set>

#include "framework/jit/graph_passes.h"
#include "framework/jit/scripted_layer.h"

namespace qforge::jit {

namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// clamp_max of n as a chainable activation: -1 for a ReLU, 6 for a ReLU6 (hardtanh(0, 6)); none otherwise.
std::optional<double> relu_clamp(const Node* n) {
  const std::string k = n->kind().toQualString();
  if (k == "aten::relu" || k == "aten::relu_") return -1.0;
  if (k != "aten::hardtanh" && k != "aten::hardtanh_") return std::nullopt;
  const std::optional<c10::IValue> lo = torch::jit::toIValue(n->input(1)), hi = torch::jit::toIValue(n->input(2));
  if (!lo || !hi || !lo->isScalar() || !hi->isScalar()) return std::nullopt;
  if (lo->toScalar().toDouble() != 0.0 || hi->toScalar().toDouble() != 6.0) return std::nullopt;
  return 6.0;
}

// The qforge layer a qforge op reads through `self.<attr>` (its input 1).
std::string layer_path_of(const Node* call, const torch::jit::Module& module) {
  const Node* get = call->input(1)->node();
  if (get->kind() != c10::prim::GetAttr) return "?";
  const c10::IValue v = module.attr(get->s(c10::attr::name));
  return v.isCustomClass() ? v.toCustomClass<ScriptedLayer>()->path() : "?";
}

const c10::Symbol& conv2d_symbol() {
  static const c10::Symbol s = c10::Symbol::fromQualString("qforge::conv2d");
  return s;
}
const c10::Symbol& chained_symbol() {
  static const c10::Symbol s = c10::Symbol::fromQualString("qforge::conv2d_act_codes");
  return s;
}
const c10::Symbol& residual_symbol() {
  static const c10::Symbol s = c10::Symbol::fromQualString("qforge::conv2d_add");
  return s;
}

bool is_relu(const Node* n) {
  const std::string k = n->kind().toQualString();
  return k == "aten::relu" || k == "aten::relu_";
}

// True when no node strictly between a and b (same block, b after a) may write to a tensor: no
// in-place ATen op (`aten::relu_`, not the `__dunder__` ones), nothing with side effects, in their
// sub-blocks neither. The fused call runs at b, so a's inputs must read the same there.
bool no_writes_between(Node* a, const Node* b) {
  std::vector<Node*> inner;
  for (Node* n = a->next(); n != b; n = n->next()) {
    if (n->kind() == c10::prim::Return) return false;  // b is not after a in this block
    inner.clear();
    inner.push_back(n);
    for (Block* sub : n->blocks()) collect_nodes(sub, &inner);
    for (const Node* m : inner) {
      const std::string name = m->kind().toUnqualString();
      const bool in_place = m->kind().is_aten() && name.size() > 1 && name.back() == '_' && name[name.size() - 2] != '_';
      if (in_place || m->hasSideEffects()) return false;
    }
  }
  return true;
}

// The residual operand of `a` when a adds conv's output and another tensor with alpha 1 (add_:
// conv's output updated in place), else nullptr.
Value* residual_operand(const Node* a, const Value* conv) {
  const std::string k = a->kind().toQualString();
  if ((k != "aten::add" && k != "aten::add_") || a->inputs().size() != 3) return nullptr;
  const std::optional<c10::IValue> alpha = torch::jit::toIValue(a->input(2));
  if (!alpha || !(alpha->isInt() || alpha->isDouble()) || alpha->toScalar().toDouble() != 1.0) return nullptr;
  Value* r = nullptr;
  if (a->input(0) == conv && a->input(1) != conv) {
    r = a->input(1);
  } else if (k == "aten::add" && a->input(1) == conv && a->input(0) != conv) {
    r = a->input(0);
  }
  return r != nullptr && r->type()->cast<c10::TensorType>() != nullptr ? r : nullptr;
}

}  // namespace

std::vector<ChainedCall> chain_conv_codes(Graph& g, const torch::jit::Module& module) {
  struct Chain {
    Node *first, *act, *next;
    double clamp;
  };
  std::vector<Node*> nodes;
  collect_nodes(g.block(), &nodes);
  // Found first, rewritten after: the rewrite destroys nodes the list still holds.
  std::vector<Chain> chains;
  for (Node* n : nodes) {
    if (n->kind() != conv2d_symbol() || n->output()->uses().size() != 1) continue;
    Node* act = n->output()->uses()[0].user;
    const std::optional<double> clamp = relu_clamp(act);
    if (!clamp || act->input(0) != n->output() || act->output()->uses().size() != 1 ||
        act->owningBlock() != n->owningBlock() || !no_writes_between(n, act))
      continue;
    Node* next = act->output()->uses()[0].user;
    const Node* next_get = next->kind() == conv2d_symbol() ? next->input(1)->node() : nullptr;
    if (next_get == nullptr || next_get->kind() != c10::prim::GetAttr || next->input(0) != act->output() ||
        next->owningBlock() != n->owningBlock())
      continue;
    chains.push_back({n, act, next, *clamp});
  }
  for (const Chain& c : chains) {
    Node *n = c.first, *act = c.act, *next = c.next;
    const Node* next_get = next->input(1)->node();
    const std::optional<double> clamp = c.clamp;
    torch::jit::WithInsertPoint guard(act);
    // The second layer is read here again: its own read sits just before it, after this point.
    Value* second = g.insertGetAttr(next_get->input(0), next_get->s(c10::attr::name));
    Node* fused = g.create(chained_symbol(), {n->input(0), n->input(1), second, g.insertConstant(*clamp), n->input(2)}, 1);
    g.insertNode(fused);
    fused->output()->setType(c10::TensorType::get());
    next->replaceInput(0, fused->output());
    act->destroy();
    n->destroy();
  }
  std::vector<ChainedCall> out;
  nodes.clear();
  collect_nodes(g.block(), &nodes);
  for (const Node* n : nodes) {
    if (n->kind() != chained_symbol()) continue;
    const std::optional<c10::IValue> clamp = torch::jit::toIValue(n->input(3));
    const Node* next = n->output()->uses().empty() ? nullptr : n->output()->uses()[0].user;
    ChainedCall c{layer_path_of(n, module), next ? layer_path_of(next, module) : "?",
                  clamp && clamp->toDouble() > 0 ? "aten::hardtanh(0, 6)" : "aten::relu"};
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<ResidualCall> fuse_residual_adds(Graph& g, const torch::jit::Module& module) {
  struct Residual {
    Node *conv, *add, *relu;
    Value* r;
  };
  std::vector<Node*> nodes;
  collect_nodes(g.block(), &nodes);
  std::vector<Residual> found;  // found first, rewritten after (the rewrite destroys nodes)
  std::set<const Node*> claimed;  // conv + conv (a block's output and its shortcut): the first conv takes the add
  for (Node* n : nodes) {
    if (n->kind() != conv2d_symbol() || n->output()->uses().size() != 1) continue;
    Node* add = n->output()->uses()[0].user;
    Value* r = add->owningBlock() == n->owningBlock() ? residual_operand(add, n->output()) : nullptr;
    if (r == nullptr || !no_writes_between(n, add) || !claimed.insert(add).second) continue;
    Node* relu = add->output()->uses().size() == 1 ? add->output()->uses()[0].user : nullptr;
    if (relu != nullptr && !(is_relu(relu) && relu->input(0) == add->output() && relu->owningBlock() == n->owningBlock()))
      relu = nullptr;
    found.push_back({n, add, relu, r});
  }
  for (size_t i = 0; i < found.size(); ++i) {
    const Residual& f = found[i];
    torch::jit::WithInsertPoint guard(f.add);
    const bool in_place = f.add->kind().toUnqualString() == std::string("add_");
    Node* fused = g.create(residual_symbol(),
                           {f.conv->input(0), f.conv->input(1), f.r, g.insertConstant(f.relu != nullptr),
                            g.insertConstant(in_place), f.conv->input(2)},
                           1);
    g.insertNode(fused);
    fused->output()->setType(c10::TensorType::get());
    Node* last = f.relu != nullptr ? f.relu : f.add;
    last->output()->replaceAllUsesWith(fused->output());
    // A later residual that was this output (the next block's identity) is the fused output now.
    for (size_t j = i + 1; j < found.size(); ++j)
      if (found[j].r == last->output()) found[j].r = fused->output();
    if (f.relu != nullptr) f.relu->destroy();
    f.add->destroy();
    f.conv->destroy();
  }
  std::vector<ResidualCall> out;
  nodes.clear();
  collect_nodes(g.block(), &nodes);
  for (const Node* n : nodes) {
    if (n->kind() != residual_symbol()) continue;
    const std::optional<c10::IValue> relu = torch::jit::toIValue(n->input(3));
    out.push_back({layer_path_of(n, module), relu && relu->isBool() && relu->toBool()});
  }
  return out;
}

int64_t route_max_pools(Graph& g) {
  static const c10::Symbol aten_pool = c10::Symbol::fromQualString("aten::max_pool2d");
  static const c10::Symbol qforge_pool = c10::Symbol::fromQualString("qforge::max_pool2d");
  std::vector<Node*> nodes;
  collect_nodes(g.block(), &nodes);
  int64_t count = 0;
  for (Node* n : nodes) {
    if (n->kind() == qforge_pool) ++count;
    if (n->kind() != aten_pool || n->inputs().size() != 6) continue;
    torch::jit::WithInsertPoint guard(n);
    Node* q = g.create(qforge_pool, n->inputs(), 1);
    g.insertNode(q);
    q->output()->setType(n->output()->type());
    n->output()->replaceAllUsesWith(q->output());
    n->destroy();
    ++count;
  }
  return count;
}

}  // namespace qforge::jit
