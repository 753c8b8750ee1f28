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
#include "framework/jit/call_forms.h"
#include "framework/jit/conv_chain.h"
#include "framework/jit/graph_passes.h"

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
