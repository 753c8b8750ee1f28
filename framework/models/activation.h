// HF's hidden_act / activation_function names (transformers' ACT2FN) for the models' MLPs: BERT,
// GPT-2 and the Llama family read their activation here.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace qforge::models {

// act(x) for silu and swish (HF maps both to SiLU), gelu (erf), gelu_new and gelu_pytorch_tanh
// (the tanh approximation), relu; another name is an error naming it and the supported ones.
at::Tensor apply_activation(const std::string& act, const at::Tensor& x);

bool is_activation(const std::string& act);
std::string activation_names();  // "silu, swish, ...", for error messages

}  // namespace qforge::models
