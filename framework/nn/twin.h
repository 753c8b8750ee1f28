// Where the qforge layers meet their LibTorch twins, and the two LibTorch generations they build
// against (Debian's 1.13; 2.x, e.g. the CUDA-enabled LibTorch scripts/gpu-check builds with).
#pragma once

#include <torch/nn/module.h>
#include <torch/version.h>

#include <variant>

// The base list of a layer with a LibTorch twin (qforge::nn::Linear over torch::nn::LinearImpl).
// LibTorch 1.x: torch::nn::Cloneable derives `virtual Module`, so a layer derives Module publicly
// and its twin privately: a torch::nn::LinearImpl& or torch::nn::Linear holder cannot bind to it,
// so the twin's non-virtual float forward can never run in its place.
// LibTorch 2.x: Cloneable derives Module non-virtually, so that layout would hold two Module
// objects; the twin is the public base there (the one Module). Binding a qforge layer to a
// torch::nn::Linear holder then compiles, and its forward is the twin's float one: hold qforge
// layers as qforge::nn::Linear (or through Module / Sequential, which call the layer's own forward).
#if TORCH_VERSION_MAJOR >= 2
#define QFORGE_TWIN_BASE(Twin) public Twin
#define QFORGE_TWIN_IS_PRIVATE 0
#else
#define QFORGE_TWIN_BASE(Twin) public virtual torch::nn::Module, private Twin
#define QFORGE_TWIN_IS_PRIVATE 1
#endif

namespace qforge::nn {

// The alternative T of a LibTorch options variant (padding, padding_mode), or null: those are
// c10::variant in LibTorch 1.x and std::variant in 2.x.
template <class T, class Variant>
const T* variant_if(const Variant* v) {
#if TORCH_VERSION_MAJOR >= 2
  return std::get_if<T>(v);
#else
  return c10::get_if<T>(v);
#endif
}

}  // namespace qforge::nn
