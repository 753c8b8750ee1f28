// qbench cases against llama.cpp on the same GGUF weights (issue 38):
//   model_llama_decode_q8, _q4   a Llama of 2 layers with Llama-3.2-1B's layer shapes (hidden 2048,
//                                FFN 8192, 32 query / 8 key-value heads, head_dim 64), a 256-byte
//                                vocabulary, random weights (seed 0); a 16-token prompt in the
//                                cache, then 32 tokens decoded greedily one at a time; a second
//                                case evaluates a 512-token prompt from an empty cache (prefill).
//   model_llama8b_decode_q8, _q4 the decode case on 2 layers of Llama-3-8B's shape (hidden 4096,
//                                FFN 14336, 32 / 8 heads, head_dim 128), qforge on load_gguf of
//                                the file at q8 too (stderr names the kernels its Linears run)
//   model_gpt2_decode_q8, _q4    the decode case on GPT-2 small shapes (vocabulary 50257, head
//                                untied, embeddings int8 per row), qforge on load_gguf of the file
// The frozen model (qint8 per channel for q8, qint4 in groups of 32 for q4) is written once as GGUF
// (export_gguf, codes kept: Q8_0 / Q4_0, fp16 scales); llama.cpp loads that file, and qforge runs
// load_gguf of the same file (Q8_0: int8 groups of 32 on PackedLinearS8G's kernels; Q4_0: int4
// groups of 32). impl "qforge": float activations (DecodeActivations::kExact); impl
// "qforge-q8": block-32 int8 decode activations (kQ8Block32, llama.cpp's activation side, the
// default of a loaded file); impl "llamacpp": the file run by llama.cpp (node-llama-cpp 3.21.1's
// prebuilt CPU library, the one ctest gguf_llamacpp installs into the build tree, or
// $QFORGE_NODE_LLAMA_CPP/node_modules), in a
// node child process that qbench drives through a pipe ("run" -> 32 tokens -> "done"), with
// qbench's thread count. The pipe round trip (tens of µs) is inside llama.cpp's time. Without
// node or node-llama-cpp the llamacpp impl is left out with the reason on stderr. Impl "limit":
// memcpy moving the bytes the 32 tokens read (the frozen Linear weights, 32 times, and the cached
// keys and values their attentions read; half read, half written) with qbench's threads; GB/s of
// every impl counts those bytes (the linears_only case: the Linear weights alone).
#include <ATen/ATen.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "apps/qbench_models.h"
#include "apps/qbench_node_peer.h"
#include "apps/qbench_registry.h"
#include "framework/api/kernel_plan.h"
#include "framework/api/quantize.h"
#include "framework/core/error.h"
#include "framework/models/activation.h"
#include "framework/models/gguf_export.h"
#include "framework/models/gguf_load.h"
#include "framework/models/kv_cache.h"
#include "framework/models/llama.h"
#include "framework/models/sampling.h"
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
// appends, embedding, dispatch). GPT-2's Linears each read their own row.
template <class Model>
Case linears_only(const std::string& shape, const std::shared_ptr<Model>& m) {
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
  int64_t per_token = 0;
  for (const auto& call : calls) per_token += call.first->storage_bytes();
  return Case{shape, static_cast<double>(per_token * kLlamaDecode),
              {{"qforge", with_decode(m->ptr(), DecodeActivations::kExact, run)},
               {"qforge-q8", with_decode(m->ptr(), DecodeActivations::kQ8Block32, run)}}};
}

// The frozen model of the row, written once as GGUF at `path` (Q8_0 / Q4_0, codes kept); qforge then
// runs load_gguf(path), the very file llama.cpp loads (its Linears decode with q8_block32
// activations by default, as llama.cpp does): Q8_0 as int8 with an fp16 scale per block of 32
// (PackedLinearS8G), Q4_0 as int4 groups of 32.
std::shared_ptr<models::LlamaForCausalLM> frozen_llama(int bits, const std::string& path,
                                                       const models::LlamaConfig& config = llama_1b_layers()) {
  {
    torch::manual_seed(0);
    auto m = std::make_shared<models::LlamaForCausalLM>(config);
    (*m)->init_weights();
    (*m)->eval();
    quantize(*m, decode_scheme(bits));
    freeze(*m);
    models::export_gguf(*m, path);
  }  // the model the file came from is gone before the file loads (8B-shaped layers: 0.5 GB)
  return std::make_shared<models::LlamaForCausalLM>(models::load_gguf(path).llama);
}

// The llama.cpp peer on `path`: each run decodes `decode` tokens after `prompt` (decode 0: evaluates
// the whole prompt again from an empty cache), with qbench's thread count and a KV cache of type
// `kv_cache` (f16, llama.cpp's default; q8_0 / q4_0 as -ctk / -ctv, with flash attention).
std::function<void()> llamacpp_run(const std::string& modules, const std::string& path, const at::Tensor& prompt,
                                   int64_t decode, const std::string& kv_cache = "f16") {
  std::string ids;
  for (int64_t i = 0; i < prompt.size(1); ++i) ids += (ids.empty() ? "" : ",") + std::to_string(prompt[0][i].item<int64_t>());
  auto peer = std::make_shared<NodePeer>(
      QFORGE_QBENCH_LLAMACPP_JS,
      std::vector<std::string>{modules, path, std::to_string(at::get_num_threads()), ids, std::to_string(decode), kv_cache},
      "llama.cpp (node-llama-cpp) on " + path);
  return [peer] { peer->run(); };
}

// node-llama-cpp's node_modules folder, or "" after saying on stderr why `row` leaves llamacpp out.
std::string llamacpp_modules(const std::string& row) {
  std::string why;
  const std::string modules =
      node_modules_with("QFORGE_NODE_LLAMA_CPP", QFORGE_NODE_LLAMA_CPP_DIR, "node-llama-cpp", "run ctest -R gguf_llamacpp", &why);
  if (modules.empty()) std::fprintf(stderr, "qbench: %s: llamacpp impl left out: %s\n", row.c_str(), why.c_str());
  return modules;
}

// The kernels describe() shows for `model`'s Linears under `mode`, counted ("12 x linear_q8b32_s4"),
// with the fallback reason where one applies: a row says which kernel its impls ran.
std::string linear_kernels(torch::nn::Module& model, DecodeActivations mode) {
  nn::set_decode_activations(model, mode);
  std::map<std::string, int> count;
  for (const auto& mod : model.modules(/*include_self=*/false))
    if (const auto* lin = dynamic_cast<const nn::LinearImpl*>(mod.get())) {
      const KernelPlan plan = lin->plan();
      ++count[plan_kernel_text(plan) + (plan.fallback.empty() ? "" : " (" + plan.fallback + ")")];
    }
  nn::set_decode_activations(model, DecodeActivations::kExact);
  std::string out;
  for (const auto& [kernel, n] : count) out += (out.empty() ? "" : ", ") + std::to_string(n) + " x " + kernel;
  return out;
}

void report_kernels(const std::string& row, torch::nn::Module& model) {
  std::fprintf(stderr, "qbench: %s: Linear kernels: qforge: %s; qforge-q8: %s\n", row.c_str(),
               linear_kernels(model, DecodeActivations::kExact).c_str(),
               linear_kernels(model, DecodeActivations::kQ8Block32).c_str());
}

// A GGUF file in the temporary directory named after the row, removed with this object (llama.cpp
// has read it by then; its pages stay mapped).
struct TempGguf {
  std::string path;
  explicit TempGguf(const std::string& tag)
      : path((std::filesystem::temp_directory_path() / ("qbench-" + tag + "-" + std::to_string(getpid()) + ".gguf"))
                 .string()) {}
  ~TempGguf() {
    std::error_code ignored;  // a destructor must not throw
    std::filesystem::remove(path, ignored);
  }
  TempGguf(const TempGguf&) = delete;
  TempGguf& operator=(const TempGguf&) = delete;
};

// The decode case of a frozen model (Llama or GPT-2): `prompt` in a cache, then 32 tokens decoded
// greedily one at a time; impls qforge (exact activations), qforge-q8 (block-32 int8 activations)
// and limit. Bytes: every frozen Linear's packed weights once per token, plus the cached keys and
// values each token's attention reads (token t of 32 attends over prompt + t + 1 positions: the
// float cache's bytes per position from the prefilled cache; 3 % of GPT-2 small's Q4 bytes, 0.4 %
// of the 1B-shaped rows'; the embedding rows add under 0.1 %), which the limit impl moves at
// memcpy speed from DRAM (cold_memcpy: a pass per token of the average token's bytes, none finding
// the last one's bytes in cache).
template <class Model>
Case decode_case(const std::string& shape, const std::shared_ptr<Model>& m, const at::Tensor& prompt) {
  auto cache = std::make_shared<models::KvCache>();
  cache->reserve(kLlamaPrompt + kLlamaDecode);  // no store grows in a run
  at::Tensor first;
  {
    at::NoGradGuard g;
    nn::set_decode_activations(**m, DecodeActivations::kExact);
    first = (*m)->forward(prompt, cache.get()).select(1, kLlamaPrompt - 1).argmax(-1, true);
  }
  int64_t per_token = 0;
  for (const auto& mod : (*m)->modules(/*include_self=*/false))
    if (const auto* lin = dynamic_cast<const nn::LinearImpl*>(mod.get())) per_token += lin->storage_bytes();
  const int64_t per_position = cache->bytes() / cache->length();
  int64_t cache_reads = 0;  // positions the 32 tokens' attentions read, all layers' bytes each
  for (int64_t t = 0; t < kLlamaDecode; ++t) cache_reads += (kLlamaPrompt + t + 1) * per_position;
  const int64_t bytes = per_token * kLlamaDecode + cache_reads;
  Case c{shape, static_cast<double>(bytes), {}};
  // Greedy as qgen chooses (models::Sampler at temperature 0: the logits read in place).
  const std::function<void()> qforge_run = [m, cache, first] {
    at::NoGradGuard g;
    cache->truncate(kLlamaPrompt);  // drops the previous run's tokens in place (no copy in the timed run)
    models::SamplingOptions greedy;
    greedy.temperature = 0;
    models::Sampler sampler(greedy);
    at::Tensor next = first;
    for (int64_t t = 0; t < kLlamaDecode; ++t)
      next = at::full({1, 1}, sampler.next((*m)->forward(next, cache.get()), {}), at::kLong);
  };
  c.impls.push_back({"qforge", with_decode(m->ptr(), DecodeActivations::kExact, qforge_run)});
  c.impls.push_back({"qforge-q8", with_decode(m->ptr(), DecodeActivations::kQ8Block32, qforge_run)});
  c.impls.push_back({"limit", cold_memcpy(bytes / kLlamaDecode, kLlamaDecode)});
  return c;
}

std::vector<Case> llama_decode_cases(int bits) {
  const TempGguf file("llama-q" + std::to_string(bits));
  const std::string& path = file.path;
  const std::shared_ptr<models::LlamaForCausalLM> m = frozen_llama(bits, path);
  torch::manual_seed(1);
  const at::Tensor prompt = at::randint(0, 256, {1, kLlamaPrompt}, at::kLong);
  Case c = decode_case("L2_H2048_prompt16_decode32_tokens", m, prompt);
  Case linears = linears_only("L2_H2048_linears_only_decode32_tokens", m);
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
  const std::string modules = llamacpp_modules("model_llama_decode_q" + std::to_string(bits));
  if (modules.empty()) return {c, linears, prefill};
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

// ---- model_llama8b_decode_q8 / _q4: the decode case on kLlama8bLayers layers of Llama-3-8B's
// shape (bench::llama_8b_layers: hidden 4096, FFN 14336, 32 / 8 heads, head_dim 128; a 256-token
// vocabulary), random weights (seed 0), frozen (int8 per channel / int4 in groups of 32), exported
// once; both qforge (load_gguf) and llama.cpp run that file, Q8 included: a loaded Q8_0 matrix
// runs whatever kernel its plan picks, which stderr names (report_kernels). ----
constexpr int64_t kLlama8bLayers = 2;

std::vector<Case> llama8b_decode_cases(int bits) {
  const std::string row = "model_llama8b_decode_q" + std::to_string(bits);
  const TempGguf file("llama8b-q" + std::to_string(bits));
  const std::shared_ptr<models::LlamaForCausalLM> m =
      frozen_llama(bits, file.path, llama_8b_layers(kLlama8bLayers));
  report_kernels(row, **m);
  torch::manual_seed(1);
  const at::Tensor prompt = at::randint(0, 256, {1, kLlamaPrompt}, at::kLong);
  Case c = decode_case("L" + std::to_string(kLlama8bLayers) + "_H4096_F14336_prompt16_decode32_tokens", m, prompt);
  const std::string modules = llamacpp_modules(row);
  if (!modules.empty()) c.impls.push_back({"llamacpp", llamacpp_run(modules, file.path, prompt, kLlamaDecode)});
  return {c};
}

// ---- model_gpt2_decode_q8 / _q4: GPT-2 small shapes (12 layers, 768, vocabulary 50257, random
// weights seed 0) prepared as model_gpt2_decode_w8 / _w4 (head untied, embeddings int8 per row) but
// on grids GGUF holds with the codes kept: Linears int8 per channel (Q8_0: each block of 32 takes
// its row's scale) or int4 in groups of 32 (Q4_0's own blocks; groups of 128 would be written the
// same way, but 32 is the finer grid llama.cpp's users get). Exported once; qforge runs load_gguf
// of the file, llama.cpp the same file. ----

// One string per id for a vocabulary without a tokenizer file: the 256 byte tokens, then distinct
// two-byte strings (llama.cpp wants a token list; the rows feed ids, never text).
std::vector<std::string> byte_pair_tokens(int64_t vocab) {
  std::vector<std::string> tokens;
  for (int64_t i = 0; i < vocab; ++i) {
    const int64_t j = i - 256;
    tokens.push_back(i < 256 ? models::gpt2_byte_token(static_cast<uint8_t>(i))
                             : models::gpt2_byte_token(static_cast<uint8_t>(j / 256)) +
                                   models::gpt2_byte_token(static_cast<uint8_t>(j % 256)));
  }
  return tokens;
}

std::vector<Case> gpt2_gguf_decode_cases(int bits) {
  const std::string row = "model_gpt2_decode_q" + std::to_string(bits);
  const TempGguf file("gpt2-q" + std::to_string(bits));
  const models::Gpt2Config cfg = gpt2_small();
  {
    torch::manual_seed(0);
    models::Gpt2LMHeadModel written(cfg);
    written->eval();
    freeze_for_decode(written, decode_scheme(bits));
    models::GgufExportOptions options;
    options.tokens = byte_pair_tokens(cfg.vocab_size);
    models::export_gguf(written, file.path, options);
  }
  auto m = std::make_shared<models::Gpt2LMHeadModel>(models::load_gguf(file.path).gpt2);
  report_kernels(row, **m);
  torch::manual_seed(1);
  const at::Tensor prompt = at::randint(0, cfg.vocab_size, {1, kLlamaPrompt}, at::kLong);
  Case c = decode_case("L12_H768_prompt16_decode32_tokens", m, prompt);
  Case linears = linears_only("L12_H768_linears_only_decode32_tokens", m);
  const std::string modules = llamacpp_modules(row);
  if (!modules.empty()) c.impls.push_back({"llamacpp", llamacpp_run(modules, file.path, prompt, kLlamaDecode)});
  return {c, linears};
}

// The prefill GEMMs alone, at the Linear shapes of the 512-token prompt (q/o 2048 x 2048, gate/up
// 8192 x 2048, down 2048 x 8192; N x K), float input rows, random codes packed as the q4 (int4
// groups of 32, Q4_0's grid) and q8 (int8 per channel) rows freeze them, and as q8g (int8 with an
// fp16 scale per group of 32: a loaded Q8_0 file's PackedLinearS8G): impl "qforge" run_decode
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
  for (const std::string& form : {std::string("q4"), std::string("q4_0"), std::string("q8"), std::string("q8g")}) {
    for (const Shape sh : {Shape{2048, 2048}, Shape{8192, 2048}, Shape{2048, 8192}}) {
      const at::Tensor x = at::randn({kLlamaPrefill, sh.k}), w = at::randn({sh.n, sh.k}) * 0.02;
      const at::Tensor group_scales = (at::rand({sh.n, sh.k / kGroup}) * 0.01 + 0.001).to(at::kHalf).to(at::kFloat);
      std::function<void()> exact, q8;
      const auto impls = [&](auto packed) {  // shared_ptr of a packed weight
        exact = [x, packed] { packed->run_weight_only(x); };
        q8 = [x, packed] { packed->run_decode(x); };
      };
      if (form == "q4" || form == "q4_0") {  // q4_0: the one-stream form a GGUF Q4_0 file loads as
        const at::Tensor q = at::randint(-8, 8, {sh.n, sh.k}).to(at::kChar);
        impls(std::make_shared<kernels::PackedLinearS4>(
            q, group_scales, at::Tensor(), kGroup, at::Tensor(), qint4,
            form == "q4_0" ? kernels::S4Layout::kN16B32 : kernels::S4Layout::kN16K8));
      } else if (form == "q8g") {
        const at::Tensor q = at::randint(-127, 128, {sh.n, sh.k}).to(at::kChar);
        impls(std::make_shared<kernels::PackedLinearS8G>(q, group_scales, at::Tensor(), kGroup));
      } else {
        const at::Tensor q = at::randint(-127, 128, {sh.n, sh.k}).to(at::kChar);
        impls(std::make_shared<kernels::PackedLinearS8>(q, at::rand({sh.n}) * 0.01 + 0.001));
      }
      out.push_back(Case{form + " " + std::to_string(kLlamaPrefill) + "x" + std::to_string(sh.n) +
                             "x" + std::to_string(sh.k),
                         0,
                         {{"libtorch", [x, w] { at::linear(x, w); }}, {"qforge-exact", exact}, {"qforge", q8}}});
    }
  }
  return out;
}

// ---- model_llama_decode_kv_cache: decoding at a long context with a quantized KV cache (issue
// 35). model_llama_decode_q4's model (2 layers of Llama-3.2-1B's shapes, 8 key-value heads of 64,
// int4 weights in groups of 32, written as Q4_0 GGUF and loaded back; block-32 int8 decode
// activations), a 4096-token prompt in the cache, then 32 tokens decoded greedily one at a time.
// Impls: qforge (float32 cache), qforge-kv8 / qforge-kv4 (int8 / int4 symmetric per token and
// head, attention on the codes), qforge-kv8-dequant / qforge-kv4-dequant (the same caches with
// attend_on_codes off: every step dequantizes every cached position first, as qforge did before
// the codes kernel), and llama.cpp on the same file with its f16 cache (llamacpp) and q8_0 / q4_0
// caches (llamacpp-q8_0, llamacpp-q4_0; flash attention on, which llama.cpp needs for a quantized
// V cache). qforge's quantized caches hold the float prefill's keys and values quantized (the
// decode's cost does not depend on their values), not a prefill through the quantized cache. ----
constexpr int64_t kKvContext = 4096, kKvPrefillChunk = 512;

std::vector<Case> llama_kv_cache_cases() {
  const TempGguf file("llama-kv");
  const std::shared_ptr<models::LlamaForCausalLM> m = frozen_llama(4, file.path);
  torch::manual_seed(1);
  const at::Tensor prompt = at::randint(0, 256, {1, kKvContext}, at::kLong);
  models::KvCache prefilled;
  prefilled.reserve(kKvContext + kLlamaDecode);
  at::Tensor first;
  {
    at::NoGradGuard g;
    nn::set_decode_activations(**m, DecodeActivations::kQ8Block32);
    at::Tensor logits;
    for (int64_t t = 0; t < kKvContext; t += kKvPrefillChunk)
      logits = (*m)->forward(prompt.narrow(1, t, kKvPrefillChunk), &prefilled);
    first = logits.select(1, kKvPrefillChunk - 1).argmax(-1, true);
  }
  Case c{"L2_H2048_KV8x64_context4096_decode32_tokens", 0, {}};
  std::string sizes;
  auto add = [&](const std::string& name, const KvCacheScheme& s, bool on_codes) {
    auto cache = std::make_shared<models::KvCache>();
    if (s.quantized()) {
      at::NoGradGuard g;
      cache->reserve(kKvContext + kLlamaDecode);
      cache->set_scheme(s);
      for (size_t l = 0; l < prefilled.keys.size(); ++l) cache->append_codes(l, prefilled.keys[l], prefilled.values[l]);
    } else {
      *cache = prefilled;  // a deep copy
    }
    cache->attend_on_codes = on_codes;
    if (on_codes) sizes += (sizes.empty() ? "" : ", ") + s.to_string() + " " + std::to_string(cache->bytes()) + " bytes";
    c.impls.push_back({name, with_decode(m->ptr(), DecodeActivations::kQ8Block32, [m, cache, s, first] {
                         at::NoGradGuard g;
                         (*m)->set_kv_cache_scheme(s);
                         cache->truncate(kKvContext);
                         at::Tensor next = first;
                         for (int64_t t = 0; t < kLlamaDecode; ++t)
                           next = (*m)->forward(next, cache.get()).select(1, 0).argmax(-1, true);
                       })});
  };
  KvCacheScheme kv8, kv4;
  kv8.qtype = qint8, kv4.qtype = qint4;
  add("qforge", KvCacheScheme{}, true);
  add("qforge-kv8", kv8, true);
  add("qforge-kv8-dequant", kv8, false);
  add("qforge-kv4", kv4, true);
  add("qforge-kv4-dequant", kv4, false);
  std::fprintf(stderr, "qbench: model_llama_decode_kv_cache: caches at %lld positions: %s\n",
               static_cast<long long>(kKvContext), sizes.c_str());
  const std::string modules = llamacpp_modules("model_llama_decode_kv_cache");
  if (!modules.empty())
    for (const std::string kv : {"f16", "q8_0", "q4_0"})
      c.impls.push_back({kv == "f16" ? "llamacpp" : "llamacpp-" + kv, llamacpp_run(modules, file.path, prompt, kLlamaDecode, kv)});
  return {c};
}

// The attention of the same decode alone (model_llama_decode_kv_cache's shapes: 8 key-value heads
// of 64, 4 query heads each, 4096 cached positions; 64 calls = 32 tokens x 2 layers): impl "qforge"
// attention_f32 on a float cache's views (what models::fused_decode_attention runs), "qforge-kv8" /
// "qforge-kv4" attention_kv_codes_f32 on int8 / int4 codes (symmetric, per token and head), and
// "qforge-kv8-append" / "qforge-kv4-append" the append of one token's keys and values to such a
// cache (kernels::quantize_kv_rows through KvCache::append_codes), a quantized cache's other
// per-token cost.
std::vector<Case> llama_kv_attention_cases() {
  constexpr int64_t kKv = 8, kRep = 4, kD = 64, kCalls = 2 * kLlamaDecode;
  torch::manual_seed(4);
  const at::Tensor q = at::randn({1, kKv, kRep, kD});
  const at::Tensor k = at::randn({1, kKv, kKvContext, kD}), v = at::randn({1, kKv, kKvContext, kD});
  const std::function<void()> f32 = [=] {
    for (int64_t i = 0; i < kCalls; ++i) models::fused_decode_attention(q, k, v, 1, 0, 0.125);
  };
  Case c{"KV8x64_rep4_context4096_64_calls", 0, {{"qforge", f32}}};
  for (const QType& qt : {qint8, qint4}) {
    KvCacheScheme s;
    s.qtype = qt;
    auto cache = std::make_shared<models::KvCache>();
    cache->reserve(kKvContext + kCalls);
    cache->set_scheme(s);
    cache->append_codes(0, k.narrow(2, 0, kKvContext - 1), v.narrow(2, 0, kKvContext - 1));
    const at::Tensor k1 = k.narrow(2, kKvContext - 1, 1), v1 = v.narrow(2, kKvContext - 1, 1);
    const std::string tag = qt.bits == 8 ? "kv8" : "kv4";
    c.impls.push_back({"qforge-" + tag, [=] {
                         for (int64_t i = 0; i < kCalls; ++i) {
                           cache->truncate(kKvContext - 1);
                           models::fused_decode_attention_on_codes(q, *cache, 0, k1, v1, 1, 0, 0.125);
                         }
                       }});
    c.impls.push_back({"qforge-" + tag + "-append", [=] {
                         cache->truncate(kKvContext - 1);
                         for (int64_t i = 0; i < kCalls; ++i) cache->append_codes(0, k1, v1);
                       }});
  }
  return {c};
}

const Register kLlamaQ8(78, "model_llama_decode_q8", [] { return llama_decode_cases(8); });
const Register kLlamaQ4(79, "model_llama_decode_q4", [] { return llama_decode_cases(4); });
const Register kLlamaTokenOps(80, "model_llama_token_ops", [] { return llama_token_ops_cases(); });
const Register kLlama8bQ8(81, "model_llama8b_decode_q8", [] { return llama8b_decode_cases(8); });
const Register kLlama8bQ4(82, "model_llama8b_decode_q4", [] { return llama8b_decode_cases(4); });
const Register kGpt2Q8(83, "model_gpt2_decode_q8", [] { return gpt2_gguf_decode_cases(8); });
const Register kGpt2Q4(84, "model_gpt2_decode_q4", [] { return gpt2_gguf_decode_cases(4); });
const Register kLlamaPrefillGemm(85, "model_llama_prefill_gemm", [] { return llama_prefill_gemm_cases(); });
const Register kLlamaKvCache(86, "model_llama_decode_kv_cache", [] { return llama_kv_cache_cases(); });
const Register kLlamaKvAttention(87, "model_llama_kv_attention", [] { return llama_kv_attention_cases(); });

}  // namespace
}  // namespace qforge::bench
