// Convolutions chained through int8 codes (conv_chain.h).
#include "framework/jit/conv_chain.h"

#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>

#include <optional>

#include "framework/jit/graph_passes.h"
#include "framework/jit/scripted_layer.h"

namespace qforge::jit {

namespace {

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
    if (!clamp || act->input(0) != n->output() || act->output()->uses().size() != 1) continue;
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

}  // namespace qforge::jit
