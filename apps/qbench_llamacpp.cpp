// qbench cases against llama.cpp on the same GGUF weights (issue 38):
//   model_llama_decode_q8, _q4   a Llama of 2 layers with Llama-3.2-1B's layer shapes (hidden 2048,
//                                FFN 8192, 32 query / 8 key-value heads, head_dim 64), a 256-byte
//                                vocabulary, random weights (seed 0); a 16-token prompt in the
//                                cache, then 32 tokens decoded greedily one at a time; a second
//                                case evaluates a 512-token prompt from an empty cache (prefill).
// The frozen model (qint8 per channel for q8, qint4 in groups of 32 for q4) is written once as GGUF
// (export_gguf, codes kept: Q8_0 / Q4_0, fp16 scales); llama.cpp loads that file, and for q4 qforge
// runs load_gguf of the same file (q8: the model the file was written from; a loaded Q8_0 matrix has
// no integer kernel yet). impl "qforge": float activations (DecodeActivations::kExact); impl
// "qforge-q8": block-32 int8 decode activations (kQ8Block32, llama.cpp's activation side, the
// default of a loaded file); impl "llamacpp": the file run by llama.cpp (node-llama-cpp 3.21.1's
// prebuilt CPU library, the one ctest gguf_llamacpp installs into the build tree, or
// $QFORGE_NODE_LLAMA_CPP/node_modules), in a
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
#include <limits>
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
#include "framework/models/gguf_load.h"
#include "framework/models/kv_cache.h"
#include "framework/models/llama.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/token_ops.h"

namespace qforge::bench {
namespace {

constexpr int64_t kLlamaPrompt = 16, kLlamaDecode = 32, kLlamaPrefill = 512;

models::LlamaConfig llama_1b_layers() {
  models::LlamaConfig c;
  c.vocab_size = 256, c.hidden_size = 2048, c.intermediate_size = 8192, c.num_hidden_layers = 2;
  c.num_attention_heads = 32, c.num_key_value_heads = 8, c.max_position_embeddings = 1024;
  c.rms_norm_eps = 1e-5, c.rope_theta = 500000.0, c.tie_word_embeddings = false;
  return c;
}

Scheme decode_scheme(int bits) {
  Scheme s(bits == 8 ? qint8 : qint4);
  if (bits == 4) s.weight_granularity = Granularity::kPerGroup, s.group_size = 32;
  return s;
}

// The Linear layers alone, as 32 decoded tokens call them (one row each, random inputs, k/v sharing
// q's and up gate's): with the whole-model case of the same run, the split of a token's time
// between the Linear kernels and everything else (norms, RoPE, attention over the cache, cache
// appends, embedding, dispatch).
Case linears_only(const std::shared_ptr<models::LlamaForCausalLM>& m) {
  std::vector<std::pair<nn::LinearImpl*, at::Tensor>> calls;
  for (const auto& item : (*m)->named_modules("", /*include_self=*/false)) {
    auto* lin = dynamic_cast<nn::LinearImpl*>(item.value().get());
    if (!lin) continue;
    // k/v read q's row and up reads gate's, as in the forward (their q8 rows are reused).
    const std::string& name = item.key();
    auto ends = [&name](const std::string& tail) {
      return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    const bool shared = ends("k_proj") || ends("v_proj") || ends("up_proj");
    calls.emplace_back(lin, shared ? calls.back().second : at::randn({int64_t{1}, lin->options.in_features()}));
  }
  const std::function<void()> run = [m, calls] {
    at::NoGradGuard g;
    for (int64_t t = 0; t < kLlamaDecode; ++t)
      for (const auto& [lin, x] : calls) lin->forward(x);
  };
  return Case{"L2_H2048_linears_only_decode32_tokens", 0,
              {{"qforge", with_decode(m->ptr(), DecodeActivations::kExact, run)},
               {"qforge-q8", with_decode(m->ptr(), DecodeActivations::kQ8Block32, run)}}};
}

// The frozen model of the row, written once as GGUF at `path` (Q8_0 / Q4_0, codes kept). Q4: qforge
// then runs load_gguf(path), the very file llama.cpp loads (its Linears decode with q8_block32
// activations by default, as llama.cpp does). Q8: qforge runs the per-channel int8 model the file
// was written from (the same codes; the file's fp16 copies of the scales), since a loaded Q8_0
// matrix (int8 with a scale per block of 32) has no integer kernel yet (docs/performance.md).
std::shared_ptr<models::LlamaForCausalLM> frozen_llama(int bits, const std::string& path) {
  torch::manual_seed(0);
  auto m = std::make_shared<models::LlamaForCausalLM>(llama_1b_layers());
  (*m)->init_weights();
  (*m)->eval();
  quantize(*m, decode_scheme(bits));
  freeze(*m);
  models::export_gguf(*m, path);
  if (bits == 8) return m;
  return std::make_shared<models::LlamaForCausalLM>(models::load_gguf(path).llama);
}

// The llama.cpp peer on `path`: each run decodes `decode` tokens after `prompt` (decode 0: evaluates
// the whole prompt again from an empty cache), with qbench's thread count.
std::function<void()> llamacpp_run(const std::string& modules, const std::string& path, const at::Tensor& prompt,
                                   int64_t decode) {
  std::string ids;
  for (int64_t i = 0; i < prompt.size(1); ++i) ids += (ids.empty() ? "" : ",") + std::to_string(prompt[0][i].item<int64_t>());
  auto peer = std::make_shared<NodePeer>(
      QFORGE_QBENCH_LLAMACPP_JS,
      std::vector<std::string>{modules, path, std::to_string(at::get_num_threads()), ids, std::to_string(decode)},
      "llama.cpp (node-llama-cpp) on " + path);
  return [peer] { peer->run(); };
}

std::vector<Case> llama_decode_cases(int bits) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("qbench-llama-q" + std::to_string(bits) + "-" + std::to_string(getpid()) + ".gguf"))
                               .string();
  // Removes the file whatever happens below (llama.cpp has read it by then).
  struct RemoveOnExit {
    std::string path;
    ~RemoveOnExit() {
      std::error_code ignored;  // a destructor must not throw
      std::filesystem::remove(path, ignored);
    }
  } remove_file{path};
  const std::shared_ptr<models::LlamaForCausalLM> m = frozen_llama(bits, path);
  torch::manual_seed(1);
  const at::Tensor prompt = at::randint(0, 256, {1, kLlamaPrompt}, at::kLong);
  auto cache = std::make_shared<models::KvCache>();
  cache->reserve(kLlamaPrompt + kLlamaDecode);  // no store grows in a run
  at::Tensor first;
  {
    at::NoGradGuard g;
    nn::set_decode_activations(**m, DecodeActivations::kExact);
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
  c.impls.push_back({"qforge", with_decode(m->ptr(), DecodeActivations::kExact, qforge_run)});
  c.impls.push_back({"qforge-q8", with_decode(m->ptr(), DecodeActivations::kQ8Block32, qforge_run)});
  // Half read, half written, as the other limit rows (qbench_linear.cpp's cold GEMVs).
  auto src = std::make_shared<std::vector<char>>(static_cast<size_t>(per_token / 2), 1);
  auto dst = std::make_shared<std::vector<char>>(static_cast<size_t>(per_token / 2), 0);
  c.impls.push_back({"limit", [src, dst] {
                       for (int64_t t = 0; t < kLlamaDecode; ++t)
                         parallel_memcpy(dst->data(), src->data(), static_cast<int64_t>(src->size()));
                     }});
  Case linears = linears_only(m);
  linears.bytes = c.bytes;
  // The 512-token prefill from an empty cache, decode mode q8_block32 set (calls of 512 rows run
  // the block-32 GEMM on AVX-512 VNNI, the exact weight-only path elsewhere).
  const at::Tensor long_prompt = at::randint(0, 256, {1, kLlamaPrefill}, at::kLong);
  Case prefill{"L2_H2048_prefill512_tokens", 0, {}};
  prefill.impls.push_back({"qforge", with_decode(m->ptr(), DecodeActivations::kQ8Block32, [m, long_prompt] {
                             at::NoGradGuard g;
                             models::KvCache fresh;
                             fresh.reserve(kLlamaPrefill);
                             (*m)->forward(long_prompt, &fresh);
                           })});
  std::string why;
  const std::string modules =
      node_modules_with("QFORGE_NODE_LLAMA_CPP", QFORGE_NODE_LLAMA_CPP_DIR, "node-llama-cpp", "run ctest -R gguf_llamacpp", &why);
  if (modules.empty()) {
    std::fprintf(stderr, "qbench: model_llama_decode_q%d: llamacpp impl left out: %s\n", bits, why.c_str());
    return {c, linears, prefill};
  }
  c.impls.push_back({"llamacpp", llamacpp_run(modules, path, prompt, kLlamaDecode)});
  prefill.impls.push_back({"llamacpp", llamacpp_run(modules, path, long_prompt, 0)});
  return {c, linears, prefill};
}

// The per-token small ops of the same layers, alone (32 tokens × 2 layers, a 48-key cache): impl
// "libtorch" the ATen ops Llama's forward ran before the fused kernels (RMSNorm, the residual add,
// RoPE on q and k, scale + causal mask + softmax), impl "qforge" the fused kernels as the forward
// calls them (kernels/cpu/token_ops.h, with their output allocations).
std::vector<Case> llama_token_ops_cases() {
  constexpr int64_t kH = 2048, kHeads = 32, kKv = 8, kD = 64, kS = kLlamaPrompt + kLlamaDecode;
  torch::manual_seed(2);
  const at::Tensor x = at::randn({1, 1, kH}), r = at::randn({1, 1, kH}), w = at::rand({kH}) + 0.5;
  const at::Tensor q = at::randn({1, 1, kHeads * kD}), k = at::randn({1, 1, kKv * kD});
  const at::Tensor cos = at::randn({1, kD}), sin = at::randn({1, kD}), scores = at::randn({1, kHeads, 1, kS});
  const double eps = 1e-5, scale = 0.125;
  auto rotate = [](const at::Tensor& t) {
    return at::cat({-t.narrow(-1, kD / 2, kD / 2), t.narrow(-1, 0, kD / 2)}, -1);
  };
  const std::function<void()> aten = [=] {
    for (int64_t i = 0; i < 2 * kLlamaDecode; ++i) {
      const at::Tensor n1 = w * (x * at::rsqrt(x.pow(2).mean(-1, true) + eps));
      const at::Tensor qh = q.view({1, 1, kHeads, kD}).transpose(1, 2), kh = k.view({1, 1, kKv, kD}).transpose(1, 2);
      const at::Tensor qr = qh * cos + rotate(qh) * sin, kr = kh * cos + rotate(kh) * sin;
      const at::Tensor ones = at::ones({1, kS}, at::kBool);
      const at::Tensor p = at::softmax(at::where(ones.tril(kS - 1), scores * scale,
                                                 at::full({}, std::numeric_limits<float>::lowest())), -1, at::kFloat);
      const at::Tensor h = x + r, n2 = w * (h * at::rsqrt(h.pow(2).mean(-1, true) + eps));
    }
  };
  const std::function<void()> fused = [=] {
    for (int64_t i = 0; i < 2 * kLlamaDecode; ++i) {
      at::Tensor n1 = at::empty_like(x), h = at::empty_like(x), n2 = at::empty_like(x);
      kernels::rms_norm_f32({x.data_ptr<float>(), nullptr, nullptr, w.data_ptr<float>(), n1.data_ptr<float>(), 1, kH, 1e-5f});
      at::Tensor qc = q.clone(), kc = k.clone(), p = scores.clone();  // the kernels write in place
      kernels::rope_f32({qc.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(), 1, kHeads, kD, 1});
      kernels::rope_f32({kc.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(), 1, kKv, kD, 1});
      kernels::causal_softmax_f32({p.data_ptr<float>(), kHeads, 1, kS, kS - 1, 0, 0.125f});
      kernels::rms_norm_f32({x.data_ptr<float>(), r.data_ptr<float>(), h.data_ptr<float>(), w.data_ptr<float>(),
                             n2.data_ptr<float>(), 1, kH, 1e-5f});
    }
  };
  return {Case{"L2_H2048_S48_token_ops_decode32_tokens", 0, {{"libtorch", aten}, {"qforge", fused}}}};
}

// The prefill GEMMs alone, at the Linear shapes of the 512-token prompt (q/o 2048 x 2048, gate/up
// 8192 x 2048, down 2048 x 8192; N x K), float input rows, random codes packed as the q4 (int4
// groups of 32, Q4_0's grid) and q8 (int8 per channel) rows freeze them: impl "qforge" run_decode
// (block-32 int8 activations, the large-M GEMM where the table has one), "qforge-exact" the
// weight-only path (weight dequantized per call, float GEMM), "libtorch" at::linear on a float
// weight of the same shape. GFLOP/s = 2 * 512 * N * K / time.
std::vector<Case> llama_prefill_gemm_cases() {
  struct Shape {
    int64_t n, k;
  };
  constexpr int64_t kGroup = 32;
  torch::manual_seed(3);
  std::vector<Case> out;
  for (int bits : {4, 8}) {
    for (const Shape sh : {Shape{2048, 2048}, Shape{8192, 2048}, Shape{2048, 8192}}) {
      const at::Tensor x = at::randn({kLlamaPrefill, sh.k}), w = at::randn({sh.n, sh.k}) * 0.02;
      std::function<void()> exact, q8;
      if (bits == 4) {
        const at::Tensor q = at::randint(-8, 8, {sh.n, sh.k}).to(at::kChar);
        const at::Tensor s = (at::rand({sh.n, sh.k / kGroup}) * 0.01 + 0.001).to(at::kHalf).to(at::kFloat);
        auto p = std::make_shared<kernels::PackedLinearS4>(q, s, at::Tensor(), kGroup);
        exact = [x, p] { p->run_weight_only(x); };
        q8 = [x, p] { p->run_decode(x); };
      } else {
        const at::Tensor q = at::randint(-127, 128, {sh.n, sh.k}).to(at::kChar);
        auto p = std::make_shared<kernels::PackedLinearS8>(q, at::rand({sh.n}) * 0.01 + 0.001);
        exact = [x, p] { p->run_weight_only(x); };
        q8 = [x, p] { p->run_decode(x); };
      }
      out.push_back(Case{"q" + std::to_string(bits) + " " + std::to_string(kLlamaPrefill) + "x" + std::to_string(sh.n) +
                             "x" + std::to_string(sh.k),
                         0,
                         {{"libtorch", [x, w] { at::linear(x, w); }}, {"qforge-exact", exact}, {"qforge", q8}}});
    }
  }
  return out;
}

const Register kLlamaQ8(78, "model_llama_decode_q8", [] { return llama_decode_cases(8); });
const Register kLlamaQ4(79, "model_llama_decode_q4", [] { return llama_decode_cases(4); });
const Register kLlamaTokenOps(80, "model_llama_token_ops", [] { return llama_token_ops_cases(); });
const Register kLlamaPrefillGemm(81, "model_llama_prefill_gemm", [] { return llama_prefill_gemm_cases(); });

}  // namespace
}  // namespace qforge::bench
