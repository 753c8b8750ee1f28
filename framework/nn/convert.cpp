// convert(): plain LibTorch layers inside Sequentials replaced by their qforge twins, conv-BN
// pairs folded. Planned first (convert_plan), then built, then installed: an error while building
// leaves the model as it was.
#include "framework/nn/convert.h"

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "framework/core/error.h"
#include "framework/nn/conv.h"
#include "framework/nn/conv_bn_fold.h"
#include "framework/nn/embedding.h"
#include "framework/nn/layer_norm.h"
#include "framework/nn/linear.h"

namespace qforge::nn {

namespace {

using torch::nn::Module;
using torch::nn::SequentialImpl;

std::string join(const std::string& path, const std::string& name) { return path.empty() ? name : path + "." + name; }
std::string shown(const std::string& path) { return path.empty() ? "(root)" : path; }

// One change to a Sequential: item `index` replaced by its twin, or (fold) conv `index` and the
// BatchNorm at index + 1 replaced by the folded conv and an Identity.
struct Step {
  SequentialImpl* seq = nullptr;
  size_t index = 0;
  bool fold = false;
  std::string type;  // the plain layer's twin name ("Linear"); empty for a qforge conv being folded
};

// Why a plain layer outside a Sequential cannot be swapped, by where it sits.
std::string why_kept(const Module& parent, const std::string& type, bool root) {
  const std::string twin = "qforge::nn::" + type;
  if (root) return "the model itself is a LibTorch layer: use " + twin;
  if (dynamic_cast<const torch::nn::ModuleListImpl*>(&parent) || dynamic_cast<const torch::nn::ModuleDictImpl*>(&parent))
    return "an item of a " + parent.name() + ", which the model's forward calls through its LibTorch type "
           "(as<torch::nn::" + type + ">()): hold it in a torch::nn::Sequential, or make it a " + twin;
  return "a member of " + parent.name() + ", which LibTorch calls statically: declare it as " + twin +
         ", or bring the model as TorchScript";
}

// Why a plain layer has no faithful twin ("" when it has one).
std::string why_no_twin(const Module& plain, const std::string& type) {
  if (type != "Embedding") return "";
  const auto& o = plain.as<torch::nn::EmbeddingImpl>()->options;
  if (o.max_norm())
    return "max_norm renormalises looked-up rows in place on every forward, which a quantized or frozen table "
           "cannot do: it stays float";
  if (o.sparse()) return "sparse gradients: the twin's fake-quantized table gives dense ones; it stays float";
  return "";
}

class Planner {
 public:
  Planner(const Module& model, const ConvertOptions& options) : options_(options) {
    for (const PlainLayer& p : plain_libtorch_layers(model)) plain_.emplace(p.module, p.type);
    if (auto it = plain_.find(&model); it != plain_.end()) {
      report_.kept.push_back({"", "torch::nn::" + it->second, why_kept(model, it->second, true)});
      return;
    }
    visit(const_cast<Module&>(model), "");
  }
  ConvertReport report_;
  std::vector<Step> steps_;

 private:
  void visit(Module& m, const std::string& path) {
    // A module reached by a second path (one block pushed twice into a ModuleList) is planned once.
    if (const auto [first, fresh] = visited_.emplace(&m, path); !fresh) {
      report_.aliases.push_back({path, m.name(), "the same module as " + shown(first->second)});
      return;
    }
    if (auto* seq = dynamic_cast<SequentialImpl*>(&m)) return visit_sequential(*seq, path);
    for (const auto& child : m.named_children()) {
      const std::string cpath = join(path, child.key());
      if (auto it = plain_.find(child.value().get()); it != plain_.end()) {
        report_.kept.push_back({cpath, "torch::nn::" + it->second, why_kept(m, it->second, false)});
      } else {
        visit(*child.value(), cpath);
      }
    }
  }

  void visit_sequential(SequentialImpl& seq, const std::string& path) {
    const auto children = seq.named_children();
    QF_REQUIRE(children.size() == seq.size(), "convert: the Sequential at '", shown(path), "' has ", seq.size(),
               " items but ", children.size(), " registered submodules");
    for (size_t i = 0; i < seq.size(); ++i) {
      const std::shared_ptr<Module> item = seq.ptr(i);
      const std::string cpath = join(path, children[i].key());
      auto it = plain_.find(item.get());
      if (it != plain_.end()) {
        if (const std::string why = why_no_twin(*item, it->second); !why.empty()) {
          report_.kept.push_back({cpath, "torch::nn::" + it->second, why});
          it = plain_.end();
        } else {
          plan_twin(seq, i, cpath, it->second);
        }
      } else if (!dynamic_cast<Conv2dImpl*>(item.get())) {
        visit(*item, cpath);
      }
      const bool conv = (it != plain_.end() && (it->second == "Conv2d" || it->second == "Conv1d")) ||
                        dynamic_cast<Conv2dImpl*>(item.get()) || dynamic_cast<Conv1dImpl*>(item.get());
      if (conv && i + 1 < seq.size() && plan_fold(seq, i, cpath, join(path, children[i + 1].key()))) ++i;
    }
  }

  // One twin per plain layer: a layer held at two places (Sequential(lin, act, lin)) stays one module.
  void plan_twin(SequentialImpl& seq, size_t i, const std::string& path, const std::string& type) {
    steps_.push_back({&seq, i, false, type});
    const auto [first, fresh] = twin_path_.emplace(seq.ptr(i).get(), path);
    report_.converted.push_back({path, "torch::nn::" + type,
                                 "qforge::nn::" + type + (fresh ? "" : " (one twin, shared with " + first->second + ")")});
  }

  // Folds (or lists as kept) a BatchNorm2d right after a Conv2d, or a BatchNorm1d after a Conv1d,
  // at `i`; true when one follows.
  bool plan_fold(SequentialImpl& seq, size_t i, const std::string& conv_path, const std::string& bn_path) {
    const torch::nn::Module* bn = batch_norm_after(seq, i);
    if (!bn) return false;
    const Module* c = seq.ptr(i).get();
    const bool one_d = dynamic_cast<const Conv1dImpl*>(c) || dynamic_cast<const torch::nn::Conv1dImpl*>(c);
    const auto* qconv = one_d ? static_cast<const ConvQuantState*>(dynamic_cast<const Conv1dImpl*>(c))
                              : static_cast<const ConvQuantState*>(dynamic_cast<const Conv2dImpl*>(c));
    const int64_t out_channels = one_d ? (dynamic_cast<const Conv1dImpl*>(c) ? c->as<Conv1dImpl>()->options.out_channels()
                                                                           : c->as<torch::nn::Conv1dImpl>()->options.out_channels())
                                       : (dynamic_cast<const Conv2dImpl*>(c) ? c->as<Conv2dImpl>()->options.out_channels()
                                                                           : c->as<torch::nn::Conv2dImpl>()->options.out_channels());
    const torch::nn::BatchNormOptions& bo = one_d ? bn->as<torch::nn::BatchNorm1dImpl>()->options
                                                  : bn->as<torch::nn::BatchNorm2dImpl>()->options;
    const std::string bn_type = one_d ? "torch::nn::BatchNorm1d" : "torch::nn::BatchNorm2d";
    std::string why;
    if (!options_.fold_batch_norm) why = "ConvertOptions::fold_batch_norm is off";
    else if (bn->is_training()) why = "in training mode (batch statistics): call model->eval() before convert() to fold it";
    else if (!bo.track_running_stats()) why = "it keeps no running statistics to fold";
    else if (bo.num_features() != out_channels) why = "its feature count differs from the conv's output channels";
    else if (qconv && qconv->quantized()) why = "the conv is already quantized (convert before quantize)";
    if (!why.empty()) {
      report_.kept.push_back({bn_path, bn_type, std::string("after ") + (one_d ? "Conv1d '" : "Conv2d '") + conv_path +
                                                    "', not folded: " + why});
      return true;
    }
    steps_.push_back({&seq, i, true, ""});
    report_.converted.push_back({bn_path, bn_type,
                                 "folded into " + conv_path + " (fold_conv_bn), replaced by torch::nn::Identity"});
    return true;
  }

  const ConvertOptions& options_;
  std::map<const Module*, std::string> plain_;
  std::map<const Module*, std::string> visited_;    // module -> the first path that reached it
  std::map<const Module*, std::string> twin_path_;  // plain layer -> the first path it was converted at
};

// Copies every parameter and buffer of `from` into the same-named tensor of `to` (a fresh twin).
void copy_state(const Module& from, Module& to) {
  if (const auto params = from.named_parameters(false); !params.is_empty())
    to.to(params[0].value().device(), params[0].value().scalar_type());
  at::NoGradGuard no_grad;
  for (bool buffers : {false, true}) {
    const auto src = buffers ? from.named_buffers(false) : from.named_parameters(false);
    const auto dst = buffers ? to.named_buffers(false) : to.named_parameters(false);
    for (const auto& item : src) {
      const at::Tensor* d = dst.find(item.key());
      QF_REQUIRE(d && d->sizes() == item.value().sizes(), "convert: ", to.name(), " has no tensor '", item.key(),
                 "' shaped like the LibTorch layer's ", item.value().sizes());
      at::Tensor target = *d;
      target.copy_(item.value());
      if (!buffers) target.set_requires_grad(item.value().requires_grad());
    }
  }
  to.train(from.is_training());
}

template <class Holder, class Options>
torch::nn::AnyModule twin(const Module& plain, Options options) {
  Holder t(std::move(options));
  copy_state(plain, *t);
  return torch::nn::AnyModule(t);
}

// The qforge twin of a plain layer of type `type` (a name plain_libtorch_layers gives).
torch::nn::AnyModule make_twin(const Module& plain, const std::string& type) {
  if (type == "Linear") return twin<Linear>(plain, plain.as<torch::nn::LinearImpl>()->options);
  if (type == "Conv1d") return twin<Conv1d>(plain, conv_options_of<1>(plain.as<torch::nn::Conv1dImpl>()->options));
  if (type == "Conv2d") return twin<Conv2d>(plain, conv_options_of<2>(plain.as<torch::nn::Conv2dImpl>()->options));
  if (type == "Embedding") {
    // from_pretrained's table rides in the options: the twin would hold (and re-flag) the same tensor.
    auto options = plain.as<torch::nn::EmbeddingImpl>()->options;
    return twin<Embedding>(plain, options._weight(at::Tensor()));
  }
  if (type == "LayerNorm") return twin<LayerNorm>(plain, plain.as<torch::nn::LayerNormImpl>()->options);
  throw Error("convert: no qforge twin for torch::nn::" + type);
}

}  // namespace

const torch::nn::Module* batch_norm_after(const SequentialImpl& seq, size_t i) {
  if (i + 1 >= seq.size()) return nullptr;
  const Module* c = seq.ptr(i).get();
  const Module* next = seq.ptr(i + 1).get();
  if (dynamic_cast<const Conv2dImpl*>(c) || dynamic_cast<const torch::nn::Conv2dImpl*>(c))
    return dynamic_cast<const torch::nn::BatchNorm2dImpl*>(next);
  if (dynamic_cast<const Conv1dImpl*>(c) || dynamic_cast<const torch::nn::Conv1dImpl*>(c))
    return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(next);
  return nullptr;
}

std::string ConvertReport::to_string() const {
  std::ostringstream os;
  for (const Entry& e : converted) os << "converted " << shown(e.path) << ": " << e.type << " -> " << e.note << "\n";
  for (const Entry& e : kept) os << "kept " << shown(e.path) << ": " << e.type << ": " << e.note << "\n";
  for (const Entry& e : aliases) os << "alias " << shown(e.path) << ": " << e.type << ": " << e.note << "\n";
  return os.str();
}

ConvertReport convert_plan(const Module& model, const ConvertOptions& options) {
  return Planner(model, options).report_;
}

ConvertReport convert(Module& model, const ConvertOptions& options) {
  Planner planner(model, options);
  // Build every replacement before installing any: an error leaves the model untouched.
  std::map<std::pair<SequentialImpl*, size_t>, torch::nn::AnyModule> slots;
  std::map<const Module*, torch::nn::AnyModule> twins;  // original -> its one twin
  {
    RngStateGuard rng;  // construction draws initial weights that are overwritten
    for (const Step& s : planner.steps_) {
      if (!s.fold) {
        const Module* original = s.seq->ptr(s.index).get();
        auto twin = twins.find(original);
        if (twin == twins.end()) twin = twins.emplace(original, make_twin(*original, s.type)).first;
        slots[{s.seq, s.index}] = twin->second;
        continue;
      }
      const auto built = slots.find({s.seq, s.index});
      const std::shared_ptr<Module> c = built != slots.end() ? built->second.ptr() : s.seq->ptr(s.index);
      if (auto c2 = std::dynamic_pointer_cast<Conv2dImpl>(c)) {
        const Conv2d conv(c2);
        Conv2d folded = fold_conv_bn(conv, torch::nn::BatchNorm2d(std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(
                                               s.seq->ptr(s.index + 1))));
        folded->train(conv->is_training());
        slots[{s.seq, s.index}] = torch::nn::AnyModule(folded);
      } else {
        const Conv1d conv(std::dynamic_pointer_cast<Conv1dImpl>(c));
        Conv1d folded = fold_conv_bn(conv, torch::nn::BatchNorm1d(std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(
                                               s.seq->ptr(s.index + 1))));
        folded->train(conv->is_training());
        slots[{s.seq, s.index}] = torch::nn::AnyModule(folded);
      }
      slots[{s.seq, s.index + 1}] = torch::nn::AnyModule(torch::nn::Identity());
    }
  }
  for (auto& [where, module] : slots) {
    auto& [seq, index] = where;
    const std::string name = seq->named_children()[index].key();
    *(seq->begin() + static_cast<std::ptrdiff_t>(index)) = module;
    seq->replace_module(name, module.ptr());
  }
  return planner.report_;
}

}  // namespace qforge::nn
