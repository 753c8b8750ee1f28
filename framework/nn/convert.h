// convert(): a model written with plain LibTorch layers made quantizable in place. LibTorch
// containers that call their items through the module registry are rewritten: inside a
// torch::nn::Sequential, every torch::nn::Linear, Conv1d, Conv2d, Embedding and LayerNorm is replaced
// by its qforge twin (same options, bit-identical copies of its parameters), and a BatchNorm2d right
// after a Conv2d is folded into it (fold_conv_bn) when the BatchNorm is in eval mode. ModuleList,
// ModuleDict and any other module are searched recursively for such Sequentials.
//
// What stays: a plain layer held as a struct member or directly as a ModuleList / ModuleDict item.
// Those are called through their static type (`fc->forward(x)`, `list[i]->as<torch::nn::Linear>()`),
// so a replacement in the registry would never run; convert() lists them with the reason, and
// quantize() refuses the model while they remain (Scheme::allow_float_layers keeps them float).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <vector>

#include "framework/api/module_like.h"

namespace qforge::nn {

struct ConvertOptions {
  // Fold a BatchNorm2d that follows a Conv2d in a Sequential (eval mode only: in training mode
  // the BatchNorm uses batch statistics, so it is kept and listed).
  bool fold_batch_norm = true;
};

struct ConvertReport {
  struct Entry {
    std::string path;  // module path in the model ("" for the root)
    std::string type;  // "torch::nn::Linear", "torch::nn::BatchNorm2d", ...
    std::string note;  // converted: what replaced it; kept: why it stays
  };
  std::vector<Entry> converted;  // replaced by a qforge twin, or folded into the preceding conv
  std::vector<Entry> kept;       // plain layers (and BatchNorms after a conv) left as they were
  std::vector<Entry> aliases;    // a module reached again by another path: planned once, at its first
  // One line per entry: "converted body.0: torch::nn::Linear -> qforge::nn::Linear".
  std::string to_string() const;
};

// The BatchNorm that item i of `seq` (a Conv2d or Conv1d, LibTorch's or qforge's) feeds: item i + 1
// when it is a BatchNorm2d (after a Conv2d) or a BatchNorm1d (after a Conv1d), else null; the
// conv-BN pairs convert folds and quantize() notes. Only a Sequential's order is its call order (a
// struct's members' is not).
const torch::nn::Module* batch_norm_after(const torch::nn::SequentialImpl& seq, size_t i);

// What convert(model, options) would do, changing nothing.
ConvertReport convert_plan(const torch::nn::Module& model, const ConvertOptions& options = {});
template <class Holder, class = ModuleLike<Holder>>
ConvertReport convert_plan(const Holder& model, const ConvertOptions& options = {}) {
  return convert_plan(qforge::detail::module_of(model), options);
}

// Rewrites the model's Sequentials in place (see the file comment) and reports every plain
// layer: converted or kept, with the reason. The twins hold copies of the plain layers' tensors
// (same values bit for bit, same device, dtype and requires_grad; not the same tensor objects:
// build the optimizer after convert). The float forward is unchanged bit for bit, except where a
// BatchNorm was folded (the folded conv computes conv then BatchNorm in one convolution, equal
// to rounding). The default random generator is left as it was.
ConvertReport convert(torch::nn::Module& model, const ConvertOptions& options = {});
template <class Holder, class = ModuleLike<Holder>>
ConvertReport convert(Holder& model, const ConvertOptions& options = {}) {
  return convert(qforge::detail::module_of(model), options);
}

}  // namespace qforge::nn
