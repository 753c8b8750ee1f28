// qbench_memory: resident memory of a model float and frozen, measured (issue 18). Each case runs
// in its own forked process, so one case's pages and allocator state never count in another's:
//   model     RSS after building the model (frozen: after quantize, calibration and freeze, the
//             float weights released and freed pages returned with malloc_trim), minus the
//             process's RSS before building it
//   build     peak RSS while building (a frozen model holds its float weights until freeze)
//   inference peak RSS during one forward (BERT) or 32 decoded tokens (GPT-2, Llama), the peak
//             counter reset after the build (/proc/self/clear_refs), minus the RSS before building
// The Llama rows decode 16 + 32 tokens into a cache reserved for the 48 positions, then report the
// cache: its bytes computed from the shapes (2 x layers x kv_heads x head_dim x 48 x 4 bytes),
// capacity_bytes(), and the RSS that dropping it gives back (freed pages returned with malloc_trim).
//   llama_tiny      configs/models/llama_tiny.yaml's shape (4 layers, hidden 256, FFN 512, 8 / 2
//                   heads) and its 2048-token vocabulary
//   llama8b_L2      2 layers of Llama-3-8B's shape (hidden 4096, FFN 14336, 32 query / 8 key-value
//                   heads, head_dim 128), a 256-token vocabulary so the layers are the weights
//                   (float 0.87 GB a layer; the embedding and head 4 MB each)
// each float, frozen W8 (int8 per channel), frozen W4 g32 and W4 g128 (weight-only, no calibration),
// with model_size()'s tensor bytes beside the measured RSS.
// The frozen builds also report the peak and the resident memory at the end of each stage (built
// float, quantize, calibration, freeze), so the build peak can be attributed.
//   qbench_memory [--json] [--filter SUBSTRING]   (rows whose model name contains SUBSTRING)
// --kv-cache instead measures KV caches at 4096 positions (docs/kv_cache.md): a Llama of
// configs/models/llama_tiny.yaml's shape prefills 4096 tokens (chunks of 256) into a cache reserved
// for them, float or int8 / int4 codes; `released` is the RSS that dropping the cache then gives
// back (freed pages returned with malloc_trim), beside the cache's capacity_bytes().
//   qbench_memory --kv-cache [--json]
// A case whose child fails (an exception, or killed, e.g. out of memory) prints as `failed` and the
// program exits 1; an unknown argument exits 2 with the usage.
#include <ATen/ATen.h>
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "apps/process_memory.h"
#include "apps/qbench_models.h"
#include "framework/models/llama.h"

namespace {

using namespace qforge;

using apps::status_kib;

void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

constexpr int kMaxStages = 6;
constexpr const char* kUsage =
    "usage: qbench_memory [--json] [--filter SUBSTRING]\n       qbench_memory --kv-cache [--json]\n";

struct Measured {
  int64_t model_kib = 0, build_peak_kib = 0, inference_peak_kib = 0;
  int64_t cache_bytes = 0;   // the KV cases' capacity_bytes()
  int64_t released_kib = 0;  // the KV cases' RSS given back by dropping the cache
  int64_t tensor_bytes = 0;  // the Llama rows' model_size().total_bytes after the build
  int stages = 0;
  char stage_name[kMaxStages][16] = {};
  int64_t stage_peak_kib[kMaxStages] = {}, stage_rss_kib[kMaxStages] = {};
};

// The child's record of its build stages (each process has its own copy).
Measured* g_current = nullptr;
int64_t g_base_kib = 0;
int64_t g_cache_bytes = 0, g_released_kib = 0;  // set by a KV case's or a Llama decode's inference
int64_t g_tensor_bytes = 0;                      // set by a Llama decode's build

// Ends a build stage: the peak so far and the resident memory now, relative to the base.
void stage(const char* name) {
  if (g_current == nullptr || g_current->stages >= kMaxStages) return;
  Measured& m = *g_current;
  std::snprintf(m.stage_name[m.stages], sizeof m.stage_name[m.stages], "%s", name);
  m.stage_peak_kib[m.stages] = status_kib("VmHWM") - g_base_kib;
  m.stage_rss_kib[m.stages] = status_kib("VmRSS") - g_base_kib;
  ++m.stages;
}

// The measuring child's body: build(), then infer(), written to `fd`; exits non-zero on any failure.
[[noreturn]] void measure_child(int fd, const std::function<std::function<void()>()>& build) {
  try {
    at::set_num_threads(1);
    malloc_trim(0);
    const int64_t base = status_kib("VmRSS");
    reset_peak();
    Measured m;
    g_current = &m;
    g_base_kib = base;
    std::function<void()> infer = build();
    g_current = nullptr;
    m.build_peak_kib = status_kib("VmHWM") - base;
    malloc_trim(0);
    m.model_kib = status_kib("VmRSS") - base;
    reset_peak();
    infer();
    m.inference_peak_kib = status_kib("VmHWM") - base;
    m.cache_bytes = g_cache_bytes;
    m.released_kib = g_released_kib;
    m.tensor_bytes = g_tensor_bytes;
    if (write(fd, &m, sizeof m) != static_cast<ssize_t>(sizeof m)) _exit(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qbench_memory: %s\n", e.what());
    _exit(2);
  }
  _exit(0);
}

// Runs build() then infer() in a child process and reads back what it measured; nullopt when the
// child failed (an exception, a signal such as the OOM killer's) or could not be started.
std::optional<Measured> measure(const std::function<std::function<void()>()>& build) {
  int fd[2];
  if (pipe(fd) != 0) {
    std::perror("qbench_memory: pipe");
    return std::nullopt;
  }
  const pid_t pid = fork();
  if (pid == -1) {
    std::perror("qbench_memory: fork");
    close(fd[0]);
    close(fd[1]);
    return std::nullopt;
  }
  if (pid == 0) {
    close(fd[0]);
    measure_child(fd[1], build);
  }
  close(fd[1]);
  Measured m;
  const bool ok = read(fd[0], &m, sizeof m) == static_cast<ssize_t>(sizeof m);
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) std::fprintf(stderr, "qbench_memory: the case was killed by signal %d\n", WTERMSIG(status));
  if (!ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return m;
}

// BERT-base, one sequence of 128 tokens; frozen = W8A8 static (min/max on one random sequence).
std::function<void()> bert(bool frozen) {
  const models::BertConfig cfg = bench::bert_base();
  torch::manual_seed(0);
  auto m = std::make_shared<models::BertForSequenceClassification>(cfg);
  (*m)->eval();
  const at::Tensor ids = at::randint(1, cfg.vocab_size, {1, 128}, at::kLong);
  if (frozen) {
    stage("float");
    Scheme s(qint8);
    s.activations = ActivationMode::kStatic;
    s.observer = "minmax";
    quantize(*m, s);
    stage("quantize");
    {
      Calibration calib(*m);
      at::NoGradGuard g;
      (*m)->forward(ids);
    }
    stage("calibrate");
    freeze(*m);
    stage("freeze");
  }
  return [m, ids] {
    at::NoGradGuard g;
    (*m)->forward(ids);
  };
}

// GPT-2 small decoding 32 tokens after a 16-token prompt; frozen = weight-only int4 (groups of
// 128) with the LM head untied and quantized, embeddings int8 per row (qbench model_gpt2_decode_w4).
std::function<void()> gpt2(bool frozen) {
  const models::Gpt2Config cfg = bench::gpt2_small();
  torch::manual_seed(0);
  auto m = std::make_shared<models::Gpt2LMHeadModel>(cfg);
  (*m)->eval();
  if (frozen) {
    stage("float");
    bench::freeze_for_decode(*m, qint4);  // untie the head, quantize, freeze (no calibration)
    stage("freeze");
  }
  const at::Tensor prompt = at::randint(0, cfg.vocab_size, {1, 16}, at::kLong);
  return [m, prompt] {
    at::NoGradGuard g;
    models::Gpt2KvCache cache;
    at::Tensor next = (*m)->forward(prompt, &cache).select(1, 15).argmax(-1, true);
    for (int t = 0; t < 32; ++t) next = (*m)->forward(next, &cache).select(1, 0).argmax(-1, true);
  };
}

// configs/models/llama_tiny.yaml's shape: 4 layers, hidden 256, FFN 512, 8 query / 2 key-value heads.
models::LlamaConfig llama_tiny(int64_t vocab, int64_t positions) {
  models::LlamaConfig c;
  c.vocab_size = vocab, c.hidden_size = 256, c.intermediate_size = 512, c.num_hidden_layers = 4;
  c.num_attention_heads = 8, c.num_key_value_heads = 2, c.max_position_embeddings = positions;
  c.rms_norm_eps = 1e-5;
  return c;
}

constexpr int64_t kPrompt = 16, kDecode = 32;

// A Llama of config `c` decoding kDecode tokens after a kPrompt-token prompt; frozen = weight-only
// under `scheme` (quantize, freeze; no calibration). The inference ends with the cache's
// capacity_bytes() and the RSS that dropping the cache gives back.
std::function<void()> llama_decode(const models::LlamaConfig& c, const std::optional<Scheme>& scheme) {
  torch::manual_seed(0);
  auto m = std::make_shared<models::LlamaForCausalLM>(c);
  (*m)->eval();
  if (scheme) {
    stage("float");
    quantize(*m, *scheme);
    stage("quantize");
    freeze(*m);
    stage("freeze");
  }
  g_tensor_bytes = model_size(**m).total_bytes;
  const at::Tensor prompt = at::randint(0, c.vocab_size, {1, kPrompt}, at::kLong);
  return [m, prompt] {
    at::NoGradGuard g;
    models::KvCache cache;
    cache.reserve(kPrompt + kDecode);
    at::Tensor next = (*m)->forward(prompt, &cache).select(1, kPrompt - 1).argmax(-1, true);
    for (int64_t t = 0; t < kDecode; ++t) next = (*m)->forward(next, &cache).select(1, 0).argmax(-1, true);
    g_cache_bytes = cache.capacity_bytes();
    malloc_trim(0);
    const int64_t with_cache = status_kib("VmRSS");
    cache.clear();
    malloc_trim(0);
    g_released_kib = with_cache - status_kib("VmRSS");
  };
}

// Bytes of a float cache of `positions` positions, from the shapes alone.
int64_t float_cache_bytes(const models::LlamaConfig& c, int64_t positions) {
  return 2 * c.num_hidden_layers * c.kv_heads() * c.head_size() * positions * static_cast<int64_t>(sizeof(float));
}

// Weight-only schemes of the Llama rows: int8 per channel, int4 in groups of `group`.
Scheme weight_only(const QType& qtype, int64_t group = 0) {
  Scheme s(qtype);
  if (group > 0) s.weight_granularity = Granularity::kPerGroup, s.group_size = group;
  return s;
}

// configs/models/llama_tiny.yaml's shape with room for `positions`; the inference prefills that
// many tokens into a cache, then drops it and measures the RSS that gives back.
std::function<void()> llama_kv(const KvCacheScheme& scheme, int64_t positions) {
  const models::LlamaConfig c = llama_tiny(2048, positions);
  torch::manual_seed(0);
  auto m = std::make_shared<models::LlamaForCausalLM>(c);
  (*m)->eval();
  (*m)->set_kv_cache_scheme(scheme);
  const at::Tensor ids = at::randint(0, c.vocab_size, {1, positions}, at::kLong);
  auto cache = std::make_shared<models::KvCache>();
  return [m, ids, cache, positions] {
    at::NoGradGuard g;
    cache->reserve(positions);
    for (int64_t t = 0; t < positions; t += 256)
      (*m)->forward(ids.narrow(1, t, std::min<int64_t>(256, positions - t)), cache.get());
    g_cache_bytes = cache->capacity_bytes();
    malloc_trim(0);
    const int64_t with_cache = status_kib("VmRSS");
    cache->clear();
    malloc_trim(0);
    g_released_kib = with_cache - status_kib("VmRSS");
  };
}

int kv_cache_main(bool json) {
  constexpr int64_t kPositions = 4096;
  KvCacheScheme int8, int4, int4_asym;
  int8.qtype = qint8, int4.qtype = qint4, int4_asym.qtype = qint4, int4_asym.symmetric = false;
  const std::vector<std::pair<const char*, KvCacheScheme>> rows{
      {"float", KvCacheScheme{}}, {"int8", int8}, {"int4", int4}, {"int4_asym", int4_asym}};
  if (!json)
    std::printf("%-24s %-10s %14s %14s %16s\n", "model", "cache", "capacity bytes", "released MiB", "prefill peak MiB");
  bool failed = false;
  for (const auto& [name, scheme] : rows) {
    const std::optional<Measured> measured = measure([&scheme] { return llama_kv(scheme, kPositions); });
    if (!measured) {
      failed = true;
      std::printf(json ? "{\"bench\":\"memory\",\"model\":\"llama_tiny_prefill4096\",\"cache\":\"%s\",\"failed\":true}\n"
                       : "llama_tiny_prefill4096   %-10s failed\n",
                  name);
      continue;
    }
    const Measured& m = *measured;
    if (json)
      std::printf("{\"bench\":\"memory\",\"model\":\"llama_tiny_prefill4096\",\"cache\":\"%s\",\"cache_bytes\":%lld,"
                  "\"released_kib\":%lld,\"inference_peak_kib\":%lld}\n",
                  name, static_cast<long long>(m.cache_bytes), static_cast<long long>(m.released_kib),
                  static_cast<long long>(m.inference_peak_kib));
    else
      std::printf("%-24s %-10s %14lld %14.2f %16.1f\n", "llama_tiny_prefill4096", name,
                  static_cast<long long>(m.cache_bytes), m.released_kib / 1024.0, m.inference_peak_kib / 1024.0);
    std::fflush(stdout);
  }
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false, kv_cache = false;
  std::string filter;
  bool has_filter = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--kv-cache") == 0) {
      kv_cache = true;
    } else if (std::strcmp(argv[i], "--filter") == 0 && i + 1 < argc) {
      filter = argv[++i];
      has_filter = true;
    } else {
      std::fprintf(stderr, "qbench_memory: unknown or incomplete argument '%s'\n%s", argv[i], kUsage);
      return 2;
    }
  }
  if (kv_cache && has_filter) {
    std::fprintf(stderr, "qbench_memory: --filter does not apply to --kv-cache\n%s", kUsage);
    return 2;
  }
  if (kv_cache) return kv_cache_main(json);
  struct Row {
    const char* model;
    const char* state;
    std::function<std::function<void()>()> build;
    int64_t cache_shape_bytes = -1;  // Llama rows: the float cache's bytes from its shapes
  };
  std::vector<Row> rows{{"bert_base_b1_s128", "float", [] { return bert(false); }},
                        {"bert_base_b1_s128", "frozen_w8a8", [] { return bert(true); }},
                        {"gpt2_small_decode32", "float", [] { return gpt2(false); }},
                        {"gpt2_small_decode32", "frozen_w4", [] { return gpt2(true); }}};
  const std::vector<std::pair<const char*, std::optional<Scheme>>> states{
      {"float", std::nullopt},
      {"frozen_w8", weight_only(qint8)},
      {"frozen_w4_g32", weight_only(qint4, 32)},
      {"frozen_w4_g128", weight_only(qint4, 128)}};
  const std::pair<const char*, models::LlamaConfig> llamas[] = {{"llama_tiny_decode32", llama_tiny(2048, 128)},
                                                                {"llama8b_L2_decode32", bench::llama_8b_layers(2)}};
  for (const auto& [model, config] : llamas)
    for (const auto& [state, scheme] : states)
      rows.push_back({model, state, [c = config, sc = scheme] { return llama_decode(c, sc); },
                      float_cache_bytes(config, kPrompt + kDecode)});
  if (!json) std::printf("%-22s %-14s %12s %12s %14s\n", "model", "state", "model MiB", "build peak", "inference peak");
  bool failed = false;
  for (const Row& r : rows) {
    if (std::string(r.model).find(filter) == std::string::npos) continue;
    const std::optional<Measured> measured = measure(r.build);
    if (!measured) {
      failed = true;
      std::printf(json ? "{\"bench\":\"memory\",\"model\":\"%s\",\"state\":\"%s\",\"failed\":true}\n"
                       : "%-22s %-14s failed\n",
                  r.model, r.state);
      std::fflush(stdout);
      continue;
    }
    const Measured& m = *measured;
    if (json) {
      std::printf("{\"bench\":\"memory\",\"model\":\"%s\",\"state\":\"%s\",\"model_kib\":%lld,\"build_peak_kib\":%lld,"
                  "\"inference_peak_kib\":%lld",
                  r.model, r.state, static_cast<long long>(m.model_kib), static_cast<long long>(m.build_peak_kib),
                  static_cast<long long>(m.inference_peak_kib));
      if (r.cache_shape_bytes >= 0)
        std::printf(",\"tensor_bytes\":%lld,\"cache_shape_bytes\":%lld,\"cache_bytes\":%lld,\"cache_released_kib\":%lld",
                    static_cast<long long>(m.tensor_bytes), static_cast<long long>(r.cache_shape_bytes),
                    static_cast<long long>(m.cache_bytes), static_cast<long long>(m.released_kib));
      std::printf("}\n");
    } else {
      std::printf("%-22s %-14s %12.1f %12.1f %14.1f\n", r.model, r.state, m.model_kib / 1024.0,
                  m.build_peak_kib / 1024.0, m.inference_peak_kib / 1024.0);
      for (int i = 0; i < m.stages; ++i)
        std::printf("    after %-10s peak %8.1f MiB, resident %8.1f MiB\n", m.stage_name[i],
                    m.stage_peak_kib[i] / 1024.0, m.stage_rss_kib[i] / 1024.0);
      if (r.cache_shape_bytes >= 0) std::printf("    tensor bytes (model_size) %.1f MiB\n", m.tensor_bytes / 1048576.0);
      if (r.cache_shape_bytes >= 0)
        std::printf("    KV cache (%lld positions): %lld bytes from the shapes, capacity_bytes() %lld, released %.1f KiB\n",
                    static_cast<long long>(kPrompt + kDecode), static_cast<long long>(r.cache_shape_bytes), static_cast<long long>(m.cache_bytes),
                    static_cast<double>(m.released_kib));
    }
    std::fflush(stdout);
  }
  return failed ? 1 : 0;
}
