// The convenience overloads of the public API (quantize, Calibration, freeze, describe,
// save_model, ...) take a module in any of LibTorch's three usual forms: a `torch::nn::Module&`
// (the real signature), a module holder (`nn::Linear`, a TORCH_MODULE), or a
// `std::shared_ptr<M>` as `std::make_shared<Net>()` gives.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <type_traits>
#include <utility>

namespace qforge::detail {

// ModuleHolder: the held module.
template <class T>
auto module_of(const T& holder) -> decltype(*holder.ptr()) {
  return *holder.ptr();
}
// std::shared_ptr<M> of a module.
template <class M, class = std::enable_if_t<std::is_base_of_v<torch::nn::Module, M>>>
M& module_of(const std::shared_ptr<M>& p) {
  return *p;
}

}  // namespace qforge::detail

namespace qforge {

// Well-formed for holders and shared_ptrs of modules (the overloads' SFINAE condition).
template <class T>
using ModuleLike = decltype(detail::module_of(std::declval<const T&>()));

}  // namespace qforge
