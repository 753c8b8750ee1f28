// qbench_gpu_models: whole models on one CUDA GPU, qforge's frozen layers against the same float
// model in fp16 under LibTorch, in the same run; medians of CUDA-event timings, eager and as a
// CUDA-graph replay (framework/cuda/cuda_graph.h). Rows (impl qforge / libtorch_fp16):
//   llama8b_L<n>_decode  n layers of Llama-3-8B's shape (hidden 4096, FFN 14336, 32 / 8 heads;
//                        random weights) decoding one token after a 128-token prefill; qforge with
//                        every Linear frozen w4 (int4 weight-only, groups of 128), w8 (int8
//                        weight-only, per-row scales) or w8a8 (int8 weights, dynamic per-token
//                        int8 activations). The graph replays one decode
//                        step captured at a fixed position (every replay rewrites that position).
//   linear_<N>x<K>_m<M>  one frozen Linear (w8, w4) of Llama-3-8B's shapes at M = 1, 4, 8, 16 (the
//                        GEMVs) and 17 (each format's larger-M path), per call, weights not in L2.
//   bert_base_s128_b<B>  BERT-base (framework/models/bert), sequence 128, batch 1 / 8 / 128; qforge
//                        with every Linear frozen w8a8 dynamic.
// Only the Linears are quantized: norms, attention products and embeddings run float32 in the
// qforge rows, fp16 in the LibTorch rows. Built only against a CUDA-enabled LibTorch
// (QFORGE_TORCH_CUDA); scripts/gpu-check runs it with --quick (one Llama layer, BERT batch 1 and 8).
// --fused-int8 switches the frozen int8 Linears to linear_s8_fused_cuda where its rules allow.
// A row that fails prints its error; the others still run.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "apps/qbench_models.h"
#include "framework/api/kernel_plan.h"
#include "framework/api/quantize.h"
#include "framework/cuda/cuda_graph.h"
#include "framework/cuda/nonfinite_check.h"
#include "framework/models/bert.h"
#include "framework/models/kv_cache.h"
#include "framework/models/llama.h"
#include "framework/nn/linear.h"

namespace qforge {
namespace {

constexpr int64_t kContext = 128;  // prompt positions before the timed decode steps
constexpr int64_t kBertSeq = 128;

struct Options {
  bool quick = false;
  int samples = 21;
};

// Median ms of `samples` CUDA-event timings of fn on the current stream, after three warm-ups.
double median_ms(const std::function<void()>& fn, int samples) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < samples; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record();
    fn();
    stop.record();
    stop.synchronize();
    ms.push_back(start.elapsed_time(stop));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Quantizes and freezes every qforge Linear under `root` (nothing else) with `scheme`.
void freeze_linears(torch::nn::Module& root, const Scheme& scheme) {
  for (const auto& m : root.modules(/*include_self=*/true)) {
    if (auto* lin = m->as<nn::LinearImpl>()) {
      quantize(*lin, scheme);
      freeze(*lin);
    }
  }
}

Scheme scheme_named(const std::string& name) {
  if (name == "w4") return Scheme(qint4);  // weight-only, groups of 128
  if (name == "w8") return Scheme(qint8);  // weight-only, one scale per output row
  Scheme s(qint8);
  s.activations = ActivationMode::kDynamicPerToken;
  return s;
}

void print_row(const std::string& model, const std::string& impl, const std::string& mode, double ms,
               double tokens, double fp16_ms) {
  std::printf("%-22s %-18s %-6s %10.3f %12.0f", model.c_str(), impl.c_str(), mode.c_str(), ms, tokens * 1000.0 / ms);
  if (fp16_ms > 0) std::printf(" %8.2fx", fp16_ms / ms);
  std::printf("\n");
  std::fflush(stdout);
}

// Times a step eagerly and as a graph replay; returns {eager ms, graph ms} (0 where it failed).
std::pair<double, double> time_step(const std::string& label, const std::function<at::Tensor()>& step,
                                    const Options& o) {
  double eager = 0, graph = 0;
  try {
    eager = median_ms([&] { step(); }, o.samples);
  } catch (const std::exception& e) {
    std::printf("%-22s eager FAILED: %s\n", label.c_str(), e.what());
  }
  try {
    CudaGraphStep g;
    g.capture([&] { return std::vector<at::Tensor>{step()}; });
    graph = median_ms([&] { g.replay(); }, o.samples);
  } catch (const std::exception& e) {
    std::printf("%-22s graph FAILED: %s\n", label.c_str(), e.what());
  }
  cuda_check_nonfinite();  // random inputs are finite; a record here is a bug
  return {eager, graph};
}

// A decode step of the layers of `model` at position kContext: a [1, 1, hidden] input through every
// layer with the cache that a 128-token prefill filled.
struct LlamaDecode {
  models::LlamaModel model{nullptr};
  models::KvCache cache;
  at::Tensor x;
  models::RopeTables rope;
  at::Tensor step() {
    at::Tensor h = x;
    for (const auto& l : *model->layers) h = l->as<models::LlamaDecoderLayerImpl>()->forward(h, rope, &cache);
    return h;
  }
};

void llama_rows(const Options& o) {
  const int64_t layers = o.quick ? 1 : 2;
  const models::LlamaConfig c = bench::llama_8b_layers(layers);
  const std::string model = "llama8b_L" + std::to_string(layers) + "_decode";
  const at::Device cuda(at::kCUDA, 0);
  double fp16[2] = {0, 0};
  for (const std::string impl : {"libtorch_fp16", "qforge_w4", "qforge_w8", "qforge_w8a8"}) {
    try {
      const at::NoGradGuard no_grad;
      torch::manual_seed(0);
      LlamaDecode d;
      d.model = models::LlamaModel(c);
      d.model->eval();
      const bool half = impl == "libtorch_fp16";
      if (!half) freeze_linears(*d.model, scheme_named(impl.substr(7)));
      const at::ScalarType dtype = half ? at::kHalf : at::kFloat;
      d.model->to(cuda);
      if (half) d.model->to(at::kHalf);
      d.cache.reserve(kContext + 256);
      d.cache.resize(static_cast<size_t>(layers));
      const auto opts = at::TensorOptions().dtype(dtype).device(cuda);
      const models::RopeTables prefill = d.model->rope(0, kContext, cuda);
      d.rope = d.model->rope(kContext, 1, cuda);
      d.rope = {d.rope.cos.to(dtype), d.rope.sin.to(dtype)};
      d.x = at::randn({1, kContext, c.hidden_size}, opts);
      {
        at::Tensor h = d.x;
        const models::RopeTables p{prefill.cos.to(dtype), prefill.sin.to(dtype)};
        for (const auto& l : *d.model->layers) h = l->as<models::LlamaDecoderLayerImpl>()->forward(h, p, &d.cache);
      }
      d.x = at::randn({1, 1, c.hidden_size}, opts);
      const auto [eager, graph] = time_step(model + " " + impl, [&] { return d.step(); }, o);
      if (half) fp16[0] = eager, fp16[1] = graph;
      if (eager > 0) print_row(model, impl, "eager", eager, 1, half ? 0 : fp16[0]);
      if (graph > 0) print_row(model, impl, "graph", graph, 1, half ? 0 : fp16[1]);
    } catch (const std::exception& e) {
      std::printf("%-22s %-18s FAILED: %s\n", model.c_str(), impl.c_str(), e.what());
    }
  }
}

// One frozen Linear of Llama-3-8B's shapes (out x in: 4096 x 4096, 14336 x 4096) at decode-sized
// M, weights rotating through 256 MiB of copies (not in L2 between calls): the GEMVs serve
// M <= 16, so M = 17 times each format's path for larger calls (w8, w4: the weight dequantized
// to float per call, then at::linear) on almost the same work as M = 16.
void linear_rows(const Options& o) {
  const at::Device cuda(at::kCUDA, 0);
  constexpr int64_t kRotateBytes = int64_t{256} << 20;
  std::vector<int64_t> ms = {1, 4, 8, 16, 17};
  if (o.quick) ms = {1, 16, 17};
  for (const auto& [N, K] : {std::pair<int64_t, int64_t>{4096, 4096}, {14336, 4096}}) {
    std::map<int64_t, std::pair<double, double>> fp16;  // M -> LibTorch fp16 {eager, graph} ms
    for (const std::string impl : {"libtorch_fp16", "qforge_w8", "qforge_w4"}) {
      try {
        const at::NoGradGuard no_grad;
        torch::manual_seed(0);
        const bool half = impl == "libtorch_fp16";
        const int64_t bytes = half ? N * K * 2 : impl == "qforge_w8" ? N * K : N * K / 2;  // the weight's
        const int64_t copies = std::clamp<int64_t>(kRotateBytes / std::max<int64_t>(bytes, 1), 1, 64);
        std::vector<nn::Linear> layers;
        for (int64_t i = 0; i < copies; ++i) {
          nn::Linear l(K, N);
          if (!half) {
            quantize(*l, scheme_named(impl.substr(7)));
            freeze(*l);
          }
          l->to(cuda);
          if (half) l->to(at::kHalf);
          layers.push_back(l);
        }
        for (const int64_t M : ms) {
          const std::string model = "linear_" + std::to_string(N) + "x" + std::to_string(K) + "_m" + std::to_string(M);
          const at::Tensor x = at::randn({M, K}, at::TensorOptions(half ? at::kHalf : at::kFloat).device(cuda));
          const auto times = time_step(model + " " + impl, [&] {
            at::Tensor y;
            for (auto& l : layers) y = l->forward(x);
            return y;
          }, o);
          const double per = static_cast<double>(copies);
          const std::pair<double, double> t{times.first / per, times.second / per};
          if (half) fp16[M] = t;
          const auto base = half ? std::pair<double, double>{0, 0} : fp16[M];
          if (t.first > 0) print_row(model, impl, "eager", t.first, static_cast<double>(M), base.first);
          if (t.second > 0) print_row(model, impl, "graph", t.second, static_cast<double>(M), base.second);
        }
      } catch (const std::exception& e) {
        std::printf("%-22s %-18s FAILED: %s\n", "linear", impl.c_str(), e.what());
      }
    }
  }
}

void bert_rows(const Options& o) {
  const at::Device cuda(at::kCUDA, 0);
  std::vector<int64_t> batches = {1, 8, 128};
  if (o.quick) batches = {1, 8};
  std::map<int64_t, std::pair<double, double>> fp16;  // batch -> LibTorch fp16 {eager, graph} ms
  for (const std::string impl : {"libtorch_fp16", "qforge_w8a8"}) {
    try {
      const at::NoGradGuard no_grad;
      torch::manual_seed(0);
      models::BertModel m{models::BertConfig{}};
      m->eval();
      const bool half = impl == "libtorch_fp16";
      if (!half) freeze_linears(*m, scheme_named("w8a8"));
      m->to(cuda);
      if (half) m->to(at::kHalf);
      for (const int64_t B : batches) {
        const std::string model = "bert_base_s128_b" + std::to_string(B);
        const at::Tensor ids = at::randint(0, m->config.vocab_size, {B, kBertSeq}, at::TensorOptions(at::kLong).device(cuda));
        const auto times = time_step(model + " " + impl, [&] { return m->forward(ids).last_hidden_state; }, o);
        if (half) fp16[B] = times;
        const auto base = half ? std::pair<double, double>{0, 0} : fp16[B];
        const double tokens = static_cast<double>(B * kBertSeq);
        if (times.first > 0) print_row(model, impl, "eager", times.first, tokens, base.first);
        if (times.second > 0) print_row(model, impl, "graph", times.second, tokens, base.second);
      }
    } catch (const std::exception& e) {
      std::printf("%-22s %-18s FAILED: %s\n", "bert_base_s128", impl.c_str(), e.what());
    }
  }
}

}  // namespace
}  // namespace qforge

int main(int argc, char** argv) {
  qforge::Options o;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      o.quick = true;
      o.samples = 11;
    } else if (std::strcmp(argv[i], "--fused-int8") == 0) {
      qforge::set_cuda_linear_s8_fused(true);  // the one-launch int8 Linear where its rules allow
    } else {
      std::fprintf(stderr, "usage: qbench_gpu_models [--quick] [--fused-int8]\n");
      return 2;
    }
  }
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "qbench_gpu_models: no CUDA device visible to LibTorch\n");
    return 1;
  }
  std::printf("# %-20s %-18s %-6s %10s %12s %9s\n", "model", "impl", "mode", "ms", "tokens/s", "x fp16");
  qforge::linear_rows(o);
  qforge::llama_rows(o);
  qforge::bert_rows(o);
  return 0;
}
