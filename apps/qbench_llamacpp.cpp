// qbench cases against llama.cpp on the same GGUF weights (issue 38):
//   model_llama_decode_q8, _q4   a Llama of 2 layers with Llama-3.2-1B's layer shapes (hidden 2048,
//                                FFN 8192, 32 query / 8 key-value heads, head_dim 64), a 256-byte
//                                vocabulary, random weights (seed 0); a 16-token prompt in the
//                                cache, then 32 tokens decoded greedily one at a time.
// impl "qforge": the model frozen weight-only, qint8 per channel (q8) or qint4 in groups of 32
// (q4), float activations; impl "qforge-q8": the same model with block-32 int8 decode activations
// (DecodeActivations::kQ8Block32, llama.cpp's activation side); impl "llamacpp": that frozen model exported with export_gguf (codes kept: Q8_0 / Q4_0,
// fp16 scales) and run by llama.cpp (node-llama-cpp 3.21.1's prebuilt CPU library, the one
// ctest gguf_llamacpp installs into the build tree, or $QFORGE_NODE_LLAMA_CPP/node_modules), in a
// node child process that qbench drives through a pipe ("run" -> 32 tokens -> "done"), with
// qbench's thread count. The pipe round trip (tens of µs) is inside llama.cpp's time. Without
// node or node-llama-cpp the llamacpp impl is left out with the reason on stderr. Impl "limit":
// memcpy moving the bytes the 32 tokens read (the frozen Linear weights, 32 times; half read, half
// written) with qbench's threads; GB/s of every impl counts those bytes.
#include <ATen/ATen.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "apps/qbench_models.h"
#include "apps/qbench_node_peer.h"
#include "apps/qbench_registry.h"
#include "framework/api/quantize.h"
#include "framework/core/error.h"
#include "framework/models/gguf_export.h"
#include "framework/models/llama.h"

namespace qforge::bench {
namespace {

constexpr int64_t kLlamaPrompt = 16, kLlamaDecode = 32;

models::LlamaConfig llama_1b_layers() {
  models::LlamaConfig c;
  c.vocab_size = 256, c.hidden_size = 2048, c.intermediate_size = 8192, c.num_hidden_layers = 2;
  c.num_attention_heads = 32, c.num_key_value_heads = 8, c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5, c.rope_theta = 500000.0, c.tie_word_embeddings = false;
  return c;
}

Scheme decode_scheme(int bits) {
  Scheme s(bits == 8 ? qint8 : qint4);
  if (bits == 4) s.weight_granularity = Granularity::kPerGroup, s.group_size = 32;
  return s;
}

// The Linear layers alone, as 32 decoded tokens call them (one row each, random inputs): with the
// whole-model case of the same run, the split of a token's time between the Linear kernels and
// everything else (norms, RoPE, attention over the cache, cache appends, embedding, dispatch).
Case linears_only(const std::shared_ptr<models::LlamaForCausalLM>& m) {
  std::vector<std::pair<nn::LinearImpl*, at::Tensor>> calls;
  for (const auto& mod : (*m)->modules(/*include_self=*/false)) {
    if (auto* lin = dynamic_cast<nn::LinearImpl*>(mod.get())) calls.emplace_back(lin, at::randn({1, lin->options.in_features()}));
  }
  const std::function<void()> run = [m, calls] {
    at::NoGradGuard g;
    for (int64_t t = 0; t < kLlamaDecode; ++t)
      for (const auto& [lin, x] : calls) lin->forward(x);
  };
  return Case{"L2_H2048_linears_only_decode32_tokens", 0, {{"qforge", run}, {"qforge-q8", with_q8_decode(m->ptr(), run)}}};
}

std::vector<Case> llama_decode_cases(int bits) {
  torch::manual_seed(0);
  auto m = std::make_shared<models::LlamaForCausalLM>(llama_1b_layers());
  (*m)->init_weights();
  (*m)->eval();
  quantize(*m, decode_scheme(bits));
  freeze(*m);
  const at::Tensor prompt = at::randint(0, 256, {1, kLlamaPrompt}, at::kLong);
  auto cache = std::make_shared<models::KvCache>();
  cache->reserve(kLlamaPrompt + kLlamaDecode);  // no store grows in a run
  at::Tensor first;
  {
    at::NoGradGuard g;
    first = (*m)->forward(prompt, cache.get()).select(1, kLlamaPrompt - 1).argmax(-1, true);
  }
  // Bytes the 32 tokens read: every frozen Linear's packed weights once per token (the embedding
  // row and the key/value cache add under 1 %). The limit impl moves them at memcpy speed.
  int64_t per_token = 0;
  for (const auto& mod : (*m)->modules(/*include_self=*/false))
    if (const auto* lin = dynamic_cast<const nn::LinearImpl*>(mod.get())) per_token += lin->storage_bytes();
  Case c{"L2_H2048_prompt16_decode32_tokens", static_cast<double>(per_token * kLlamaDecode), {}};
  const std::function<void()> qforge_run = [m, cache, first] {
    at::NoGradGuard g;
    cache->truncate(kLlamaPrompt);  // drops the previous run's tokens in place (no copy in the timed run)
    at::Tensor next = first;
    for (int64_t t = 0; t < kLlamaDecode; ++t) next = (*m)->forward(next, cache.get()).select(1, 0).argmax(-1, true);
  };
  c.impls.push_back({"qforge", qforge_run});
  c.impls.push_back({"qforge-q8", with_q8_decode(m->ptr(), qforge_run)});
  // Half read, half written, as the other limit rows (qbench_linear.cpp's cold GEMVs).
  auto src = std::make_shared<std::vector<char>>(static_cast<size_t>(per_token / 2), 1);
  auto dst = std::make_shared<std::vector<char>>(static_cast<size_t>(per_token / 2), 0);
  c.impls.push_back({"limit", [src, dst] {
                       for (int64_t t = 0; t < kLlamaDecode; ++t)
                         parallel_memcpy(dst->data(), src->data(), static_cast<int64_t>(src->size()));
                     }});
  Case linears = linears_only(m);
  linears.bytes = c.bytes;
  std::string why;
  const std::string modules =
      node_modules_with("QFORGE_NODE_LLAMA_CPP", QFORGE_NODE_LLAMA_CPP_DIR, "node-llama-cpp", "run ctest -R gguf_llamacpp", &why);
  if (modules.empty()) {
    std::fprintf(stderr, "qbench: model_llama_decode_q%d: llamacpp impl left out: %s\n", bits, why.c_str());
    return {c, linears};
  }
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("qbench-llama-q" + std::to_string(bits) + "-" + std::to_string(getpid()) + ".gguf"))
                               .string();
  const models::GgufExportReport report = models::export_gguf(*m, path);
  std::vector<int64_t> ids(prompt.data_ptr<int64_t>(), prompt.data_ptr<int64_t>() + kLlamaPrompt);
  std::string prompt_ids;
  for (int64_t t : ids) prompt_ids += (prompt_ids.empty() ? "" : ",") + std::to_string(t);
  auto peer = std::make_shared<NodePeer>(QFORGE_QBENCH_LLAMACPP_JS,
                                         std::vector<std::string>{modules, path, std::to_string(at::get_num_threads()), prompt_ids,
                                                                  std::to_string(kLlamaDecode)},
                                         "llama.cpp (node-llama-cpp) on " + path);
  std::filesystem::remove(path);  // llama.cpp has read it
  c.impls.push_back({"llamacpp", [peer] { peer->run(); }});
  return {c, linears};
}

const Register kLlamaQ8(78, "model_llama_decode_q8", [] { return llama_decode_cases(8); });
const Register kLlamaQ4(79, "model_llama_decode_q4", [] { return llama_decode_cases(4); });

}  // namespace
}  // namespace qforge::bench
