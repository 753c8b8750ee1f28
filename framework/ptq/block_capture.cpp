// Transformer blocks of Llama-family and GPT-2 models, and the token ids of the calibration batches.
#include "framework/ptq/block_capture.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"
#include "framework/models/gpt2.h"
#include "framework/models/hf_lm_head.h"
#include "framework/models/llama.h"
#include "framework/nn/linear.h"
#include "framework/ptq/layer_access.h"

namespace qforge::ptq {

namespace {

BlockModel llama_blocks(models::LlamaForCausalLMImpl& m) {
  BlockModel bm;
  models::LlamaModelImpl* body = m.model.get();
  int64_t i = 0;
  for (const auto& l : *body->layers) {
    auto* layer = l->as<models::LlamaDecoderLayerImpl>();
    bm.blocks.push_back({"model.layers." + std::to_string(i++), layer, [body, layer](const at::Tensor& x) {
                           return layer->forward(x, body->rope(0, x.size(1), x.device()));
                         }});
  }
  bm.token_embedding = body->embed_tokens.get();
  bm.embed = [body](const at::Tensor& ids) { return body->embed_tokens->forward(ids); };
  bm.head = [&m, body](const at::Tensor& x) {
    return models::lm_head_logits(body->norm->forward(x), m.lm_head, *body->embed_tokens, "models/llama",
                                  "model.embed_tokens");
  };
  return bm;
}

BlockModel gpt2_blocks(models::Gpt2LMHeadModelImpl& m) {
  BlockModel bm;
  models::Gpt2ModelImpl* body = m.transformer.get();
  int64_t i = 0;
  for (const auto& b : *body->h) {
    auto* block = b->as<models::Gpt2BlockImpl>();
    bm.blocks.push_back({"transformer.h." + std::to_string(i++), block,
                         [block](const at::Tensor& x) { return block->forward(x); }});
  }
  bm.token_embedding = body->wte.get();
  bm.embed = [body](const at::Tensor& ids) {
    const at::Tensor pos = at::arange(ids.size(1), ids.options().dtype(at::kLong)).unsqueeze(0);
    return body->drop->forward(body->wte->forward(ids) + body->wpe->forward(pos));
  };
  bm.head = [&m, body](const at::Tensor& x) {
    return models::lm_head_logits(body->ln_f->forward_fused(x), m.lm_head, *body->wte, "models/gpt2", "transformer.wte");
  };
  return bm;
}

std::vector<Quantizer> weight_quantizers(const std::vector<nn::LinearImpl*>& layers) {
  std::vector<Quantizer> out;
  for (nn::LinearImpl* l : layers) out.push_back(l->weight_quantizer());
  return out;
}

}  // namespace

ScopedBlockWeights::ScopedBlockWeights(const std::vector<nn::LinearImpl*>& layers, const std::vector<at::Tensor>& weights)
    : bypass_(weight_quantizers(layers)) {
  QF_CHECK(layers.size() == weights.size());
  for (size_t i = 0; i < layers.size(); ++i)
    swaps_.push_back(std::make_unique<ScopedTensorSwap>(layers[i]->weight, weights[i].to(layers[i]->weight.scalar_type())));
}

BlockModel transformer_blocks(torch::nn::Module& model) {
  if (auto* llama = model.as<models::LlamaForCausalLMImpl>()) return llama_blocks(*llama);
  if (auto* gpt2 = model.as<models::Gpt2LMHeadModelImpl>()) return gpt2_blocks(*gpt2);
  return {};
}

std::vector<std::string> transformer_block_paths(const torch::nn::Module& model) {
  std::vector<std::string> out;
  int64_t n = 0;
  if (const auto* llama = model.as<models::LlamaForCausalLMImpl>()) n = llama->config.num_hidden_layers;
  if (const auto* gpt2 = model.as<models::Gpt2LMHeadModelImpl>()) n = gpt2->config.n_layer;
  const std::string prefix = model.as<models::Gpt2LMHeadModelImpl>() ? "transformer.h." : "model.layers.";
  for (int64_t i = 0; i < n; ++i) out.push_back(prefix + std::to_string(i));
  return out;
}

int block_index(const std::vector<std::string>& block_paths, const std::string& path) {
  for (size_t i = 0; i < block_paths.size(); ++i)
    if (path.rfind(block_paths[i] + ".", 0) == 0) return static_cast<int>(i);
  return -1;
}

std::vector<at::Tensor> capture_token_ids(const BlockModel& bm, int64_t batches, const RunBatch& run) {
  QF_REQUIRE(bm.token_embedding, "block capture: the model has no token embedding to take the batches' ids at");
  std::vector<at::Tensor> ids(static_cast<size_t>(batches));
  int64_t b = 0;
  const ScopedInputTaps taps({bm.token_embedding}, [&](QuantizableLayer&, const at::Tensor& x) {
    ids[static_cast<size_t>(b)] = x.detach().clone();
    throw StopForward{};
  });
  for (; b < batches; ++b) {
    try {
      run(b);
    } catch (const StopForward&) {
    }
    QF_REQUIRE(ids[static_cast<size_t>(b)].defined(), "block capture: calibration batch ", b,
               " never reached the token embedding");
  }
  return ids;
}

}  // namespace qforge::ptq
