// HF's hidden_act / activation_function names (transformers' ACT2FN) for the models' MLPs: BERT,
// GPT-2 and the Llama family read their activation here, the value their masked attention scores
// take, the fused softmax of their decode-size attention calls, and the whole attention in one
// kernel at decode and prefill sizes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <string>

#include "framework/models/kv_cache.h"

namespace qforge::models {

// act(x) for silu and swish (HF maps both to SiLU), gelu (erf), gelu_new and gelu_pytorch_tanh
// (the tanh approximation), relu; another name is an error naming it and the supported ones.
at::Tensor apply_activation(const std::string& act, const at::Tensor& x);

bool is_activation(const std::string& act);
std::string activation_names();  // "silu, swish, ...", for error messages

// HF's attention mask value torch.finfo(scores.dtype).min, a 0-dim tensor with scores' options
// (float32's lowest overflows a half / bfloat16 twin).
at::Tensor masked_score(const at::Tensor& scores);

// The attention softmax of decode-size calls, fused (kernels::causal_softmax_f32, docs/kernels.md
// §2.5b): for float CPU scores [B, H, T, S] with T <= kernels::kWeightOnlyMaxM outside autograd,
// the probabilities of scores · scale where query i (position past + i) sees keys [lo, hi),
// hi = past + i + 1, lo = window > 0 ? max(0, hi - window) : 0, and 0 elsewhere; within a few ulp of
// the ATen ops (masked_score, softmax). Undefined where a call does not qualify: the caller's ATen
// ops run then. So a short prompt's forward and its token-by-token decode run one kernel.
at::Tensor fused_causal_softmax(const at::Tensor& scores, int64_t past, int64_t window, double scale);

// The whole attention of decode-size calls, fused (kernels::attention_f32): q [B, KV, rep · T, D]
// (the rep query heads sharing key/value head kv stacked, as Llama's grouped-query product reads
// them; GPT-2: KV = H, rep = 1), k / v [B, KV, S, D] (a cache's views: rows of D contiguous
// floats) -> the context [B, KV, rep · T, D] of softmax(q · kᵀ · scale over the keys each query
// sees) · v, query i of T at position S − T + i, within a few ulp of the two matmuls and the
// softmax. Under fused_causal_softmax's conditions (float CPU, T <= kWeightOnlyMaxM, outside
// autograd), else undefined and the caller's ops run; callers pass only unquantized products
// (a quantized nn::MatMul keeps its own forward).
at::Tensor fused_decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t T,
                                  int64_t window, double scale);

// fused_decode_attention with the context written as [B, T, KV · rep · D] (query head kv · rep + r
// of position t at [b, t, (kv · rep + r) · D, + D)): HF's context.transpose(1, 2).reshape(B, T, H · D),
// what the output projection reads, with no permute or copy. q may be a strided view (GPT-2's q inside
// its fused [B, T, 3 · H · D] projection). Undefined where fused_decode_attention's would be, or
// where rep > 1 and T > 1 (those rows are not evenly spaced in this layout).
at::Tensor fused_decode_attention_tokens(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t T,
                                         int64_t window, double scale);

// Decode-size attention on a quantized cache's codes (kernels::attention_kv_codes_f32,
// docs/kv_cache.md "Attention on the codes"): where the cache is quantized with attend_on_codes
// set and fused_decode_attention's conditions hold for q, k and v, appends k and v to layer
// `layer` as codes (cache.append_codes) and returns the context of q over every cached position,
// bit for bit fused_decode_attention's over the dequantized cache (no float copy of the cache is
// made). Else undefined, the cache untouched: the caller appends and attends as before.
at::Tensor fused_decode_attention_on_codes(const at::Tensor& q, KvCache& cache, size_t layer, const at::Tensor& k,
                                           const at::Tensor& v, int64_t T, int64_t window, double scale);

// The same for prefill-size calls (T > kWeightOnlyMaxM; kernels::attention_prefill_f32, which
// multiplies only the keys each query sees) where an ISA entry of it runs (AVX-512 today; its
// scalar reference at these sizes would be slower than the matmuls), else undefined.
at::Tensor fused_prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t T,
                                   int64_t window, double scale);

}  // namespace qforge::models
