// qbench cases for the RPQ layers (docs/rpq.md):
//   rpq_embedding_lookup: 32 token ids looked up in a 50257 x 768 table (GPT-2's), RPQEmbedding
//     with 12 codebooks (rows gathered from the codebooks) beside torch::nn::Embedding;
//   rpq_linear_gemv: one row through a 4096 x 4096 layer with 16 codebooks, the LUT path
//     (per-codebook bin sums times the codebook, no weight built) and the expand path (the weight
//     built, then at::linear), beside torch::nn::Linear in fp32.
// Both are the cache-resident regime: the same table / layer is reused call after call (an RPQ
// layer's codebooks are small: 3 MB and 4 MB here, against 154 MB and 64 MB dense).
#include <ATen/ATen.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <memory>

#include "apps/qbench_registry.h"
#include "framework/nn/rpq.h"

namespace qforge::bench {
namespace {

std::vector<Case> embedding_cases() {
  auto dense = std::make_shared<torch::nn::Embedding>(50257, 768);
  auto rpq = std::make_shared<nn::RPQEmbedding>(50257, 768, 12);
  auto ids = std::make_shared<at::Tensor>(at::randint(50257, {32}, at::kLong));
  Case c{"32_tokens_50257x768", 0.0, {}};
  c.impls.push_back({"libtorch", [dense, ids] {
    at::NoGradGuard g;
    (*dense)->forward(*ids);
  }});
  c.impls.push_back({"qforge", [rpq, ids] {
    at::NoGradGuard g;
    (*rpq)->forward(*ids);
  }});
  return {c};
}

std::vector<Case> linear_cases() {
  auto dense = std::make_shared<torch::nn::Linear>(4096, 4096);
  auto rpq = std::make_shared<nn::RPQLinear>(4096, 4096, 16);
  auto x = std::make_shared<at::Tensor>(at::randn({1, 4096}));
  Case c{"1x4096x4096_h16", 0.0, {}};
  c.impls.push_back({"libtorch", [dense, x] {
    at::NoGradGuard g;
    (*dense)->forward(*x);
  }});
  c.impls.push_back({"qforge", [rpq, x] {
    at::NoGradGuard g;
    (*rpq)->forward(*x);  // one row: the LUT path
  }});
  c.impls.push_back({"qforge-expand", [rpq, x] {
    at::NoGradGuard g;
    at::linear(*x, (*rpq)->weight(), (*rpq)->bias());
  }});
  return {c};
}

const Register kRpqEmbedding(70, "rpq_embedding_lookup", embedding_cases);
const Register kRpqLinear(71, "rpq_linear_gemv", linear_cases);

}  // namespace
}  // namespace qforge::bench
