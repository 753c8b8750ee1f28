// HF's hidden_act / activation_function names (transformers' ACT2FN) for the models' MLPs: BERT,
// GPT-2 and the Llama family read their activation here, and the value their masked attention scores take.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace qforge::models {

// act(x) for silu and swish (HF maps both to SiLU), gelu (erf), gelu_new and gelu_pytorch_tanh
// (the tanh approximation), relu; another name is an error naming it and the supported ones.
at::Tensor apply_activation(const std::string& act, const at::Tensor& x);

bool is_activation(const std::string& act);
std::string activation_names();  // "silu, swish, ...", for error messages

// HF's attention mask value torch.finfo(scores.dtype).min, a 0-dim tensor with scores' options
// (float32's lowest overflows a half / bfloat16 twin).
at::Tensor masked_score(const at::Tensor& scores);

}  // namespace qforge::models
