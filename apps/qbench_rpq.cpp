// qbench cases for the RPQ layers (docs/rpq.md):
//   rpq_embedding_lookup: 32 token ids looked up in a 50257 x 768 table (GPT-2's), RPQEmbedding
//     with 12 codebooks (rows gathered from the codebooks) beside torch::nn::Embedding, in two
//     regimes named in the shape: "fresh_ids" takes new ids every call (decoding's regime: the
//     dense table's 154 MB cannot stay cached, its rows come from DRAM) and "same_ids_hot"
//     repeats one batch of ids (after the first call the 32 dense rows sit in cache);
//   rpq_linear_gemv: one row through a 4096 x 4096 layer with 16 codebooks, the LUT path
//     (per-codebook bin sums times the codebook, no weight built) and the expand path (the weight
//     built, then at::linear), beside torch::nn::Linear in fp32; the same layer every call (the
//     dense weight, 67 MB, streams from DRAM unless the last-level cache holds it; the RPQ
//     codebooks, 4 MB, stay cached).
#include <ATen/ATen.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <memory>

#include "apps/qbench_ids.h"
#include "apps/qbench_registry.h"
#include "framework/nn/rpq.h"

namespace qforge::bench {
namespace {

Case embedding_case(const std::string& shape, bool fresh) {
  auto dense = std::make_shared<torch::nn::Embedding>(kEmbeddingVocab, kEmbeddingDim);
  auto rpq = std::make_shared<nn::RPQEmbedding>(kEmbeddingVocab, kEmbeddingDim, 12);
  at::manual_seed(70);  // both impls see the same sequence of ids
  auto torch_ids = std::make_shared<IdBatches>(embedding_ids(fresh));
  at::manual_seed(70);
  auto qforge_ids = std::make_shared<IdBatches>(embedding_ids(fresh));
  Case c{shape, 0.0, {}};
  c.impls.push_back({"libtorch", [dense, torch_ids] {
    at::NoGradGuard g;
    (*dense)->forward(torch_ids->next());
  }});
  c.impls.push_back({"qforge", [rpq, qforge_ids] {
    at::NoGradGuard g;
    (*rpq)->forward(qforge_ids->next());
  }});
  return c;
}

std::vector<Case> embedding_cases() {
  return {embedding_case("32_fresh_ids_50257x768", true), embedding_case("32_same_ids_hot", false)};
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
