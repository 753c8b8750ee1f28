// Offline Hadamard rotation of a Llama-family model (QuaRot, Ashkboos et al. 2024, arXiv 2404.00456:
// computational invariance through RMSNorm). The residual stream x becomes x·Q with Q = H·diag(s)
// (H the orthonormal Hadamard matrix of hidden_size, kernels/cpu/hadamard.h; s = ±1, seeded), so
// outliers spread over every channel while the float model computes the same logits:
//
//   each RMSNorm's weight w folds into the Linears it feeds, then is set to ones:
//     q/k/v_proj, gate/up_proj, lm_head:  W <- (W·diag(w))·Q          (RMS is invariant under Q)
//   embed_tokens:                         E <- E·Q
//   o_proj, down_proj (write the stream): W <- Qᵀ·W, b <- Qᵀ·b
//   down_proj's input (online):           W <- W·H_Iᵀ offline, a <- a·H_Iᵀ at run time (the Llama
//                                         MLP's hook, LlamaConfig::down_proj_hadamard)
//   queries and keys (online, per head):  q <- q·H_Dᵀ, k <- k·H_Dᵀ after RoPE (scores unchanged; the
//                                         KV cache holds rotated keys; LlamaConfig::qk_hadamard)
//   values (offline, per head):           v_proj's rows of head h <- H_D·W_h (b_h <- b_h·H_Dᵀ), o_proj's
//                                         columns of head h <- W_h·H_Dᵀ: the cache holds v·H_Dᵀ
//
// A tied head is untied first (the embedding and the head take different sides of Q), with a note.
// Runs on a float model, before quantize(). Models that cannot be rotated are refused untouched.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "framework/models/llama.h"
#include "framework/ptq/ptq.h"

namespace qforge::ptq {

// What a rotation does to the inputs of each Linear, over every element x of the input:
//   kurtosis     = E[(x − μ)⁴] / E[(x − μ)²]²   (3 for a Gaussian; outlier channels push it up)
//   max_over_rms = max|x| / sqrt(E[x²])          (the range an absmax grid spends on one value)
struct ActivationStats {
  std::string path;
  int64_t count = 0;  // elements seen
  double kurtosis = 0, max_over_rms = 0, max_abs = 0, rms = 0;
};

struct RotateOptions {
  uint64_t seed = 0;              // the signs s of Q = H·diag(s)
  bool online_down_proj = true;  // QuaRot's online Hadamard on down_proj's input
  bool online_qk = true;         // QuaRot's KV-cache rotation: queries / keys online, values offline
};

struct RotateReport {
  std::string kind = "hadamard";
  uint64_t seed = 0;
  int64_t hidden_size = 0, intermediate_size = 0;
  int64_t residual_base = 1, down_proj_base = 1;  // the Paley order m of each H (1: Sylvester's alone)
  bool online_down_proj = false;
  bool online_qk = false;
  int64_t head_dim = 0, head_base = 1;  // the Hadamard of queries, keys and values (online_qk)
  std::vector<std::string> notes;  // e.g. the untied head
  at::Tensor signs;                // [hidden_size] ±1 (float), the recorded s
  // rotate_measured() only: each Linear's input before and after, the float output's relative
  // change on batch 0 (rounding only: ~1e-6), the time taken.
  std::vector<ActivationStats> before, after;
  double output_change = 0;
  double seconds = 0;
};

// Q = H·diag(s) of order n in double, s drawn from `seed` (signs: where to put s, or null).
at::Tensor random_hadamard(int64_t n, uint64_t seed, at::Tensor* signs = nullptr);

// Rotates `model` in place. Throws qforge::Error, leaving the model untouched, for a model other
// than LlamaForCausalLM (naming its LayerNorm where it has one: mean subtraction does not commute
// with a rotation), a quantized or frozen layer, a rotated model, sizes with no Hadamard matrix.
RotateReport rotate(torch::nn::Module& model, const RotateOptions& options = {});
RotateReport rotate_llama(models::LlamaForCausalLMImpl& model, const RotateOptions& options = {});

// Throws qforge::Error unless hidden_size (intermediate_size with the online down_proj Hadamard,
// head_dim with the query / key one) has a Hadamard size: what rotate() checks first, for a run to
// check before it trains.
void check_rotation_sizes(const models::LlamaConfig& config, const RotateOptions& options = {});

// Gives a freshly built model the structure rotate() leaves (the head untied, the online
// Hadamards on as `options` says), so a rotated model's checkpoint loads into it (qgen on a
// ptq.rotate run).
void prepare_rotated_structure(models::LlamaForCausalLMImpl& model, const RotateOptions& options = {});

// Per Linear, in named_modules() order, measured through the layers' input taps while `run`
// computes batches 0 .. batches-1 (autograd off, the model as it is: float or fake-quant).
std::vector<ActivationStats> activation_stats(torch::nn::Module& model, int64_t batches, const RunBatch& run);

// rotate() between two activation_stats() passes over batches 0 .. batches-1 (the recipe key
// `ptq.rotate: hadamard` runs this on the float model before quantize()).
RotateReport rotate_measured(torch::nn::Module& model, int64_t batches, const RunBatch& run,
                             const RotateOptions& options = {});

}  // namespace qforge::ptq
