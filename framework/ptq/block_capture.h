// The transformer blocks of a Llama-family (Llama, Mistral, Qwen2) or GPT-2 model, each runnable on
// hidden states alone, and the hidden states entering the first block on each calibration batch:
// what block-wise reconstruction (AutoRound) needs to hold one block and its inputs at a time.
// Internal to framework/ptq.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/ptq/float_view.h"
#include "framework/ptq/ptq.h"

namespace qforge::nn {
class LinearImpl;
}

namespace qforge::ptq {

struct TransformerBlock {
  std::string path;  // "model.layers.3", "transformer.h.3"
  torch::nn::Module* module = nullptr;
  // The block on hidden states [B, T, H] (causal, positions from 0), quantizers as they are set.
  std::function<at::Tensor(const at::Tensor& x)> forward;
};

struct BlockModel {
  std::vector<TransformerBlock> blocks;  // forward order; empty when the model is neither family
  QuantizableLayer* token_embedding = nullptr;  // its input tap sees each batch's token ids
  // Hidden states entering block 0 for token ids [B, T] (embeddings as quantized, or float
  // under a FloatView).
  std::function<at::Tensor(const at::Tensor& ids)> embed;
  // Logits [B, T, vocab] from the last block's output (final norm, LM head): the task loss BRECQ's
  // Fisher weights differentiate.
  std::function<at::Tensor(const at::Tensor& hidden)> head;
};

// While alive, `layers` compute with `weights` (already rounded, or soft-rounded and differentiable)
// in place of their own, their weight quantizers bypassed: how the block-wise methods (AutoRound,
// BRECQ) run a block on the weights they train.
class ScopedBlockWeights {
 public:
  ScopedBlockWeights(const std::vector<nn::LinearImpl*>& layers, const std::vector<at::Tensor>& weights);
  ScopedBlockWeights(const ScopedBlockWeights&) = delete;
  ScopedBlockWeights& operator=(const ScopedBlockWeights&) = delete;

 private:
  FloatView bypass_;
  std::vector<std::unique_ptr<ScopedTensorSwap>> swaps_;
};

// The model's blocks; a model of another family gets an empty list.
BlockModel transformer_blocks(torch::nn::Module& model);
// The paths of those blocks (what plan_solve needs, without running anything).
std::vector<std::string> transformer_block_paths(const torch::nn::Module& model);
// The block `path` lies in (its index in `block_paths`), or -1.
int block_index(const std::vector<std::string>& block_paths, const std::string& path);

// The token ids of each calibration batch, taken at the token embedding's input; each forward stops
// there. Throws when a batch's forward never reaches the embedding.
std::vector<at::Tensor> capture_token_ids(const BlockModel& bm, int64_t batches, const RunBatch& run);

// solve()'s block-wise part (framework/ptq/block_reconstruction.cpp): the pending layers whose
// method is "autoround" or "brecq", block by block in forward order, leave `pending` for `report`.
void solve_block_reconstruction(torch::nn::Module& model, int64_t batches, const RunBatch& run, const SolveOptions& options,
                     std::map<QuantizableLayer*, LayerSolve>& pending, SolveReport& report);

}  // namespace qforge::ptq
