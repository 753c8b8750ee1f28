// qbench cases for frozen Linear layers: qforge's int8 (dynamic per-token activations) and int4
// (groups of 128) kernels against fp32 at::linear (OpenBLAS) and LibTorch's
// quantized::linear_dynamic on its oneDNN engine, at decode and prefill shapes.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/quantized/PackedParams.h>

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "apps/qbench_models.h"
#include "apps/qbench_registry.h"
#include "framework/nn/linear.h"
#include "framework/api/quantize.h"
#include "kernels/cpu/packed_linear.h"

namespace qforge::bench {
namespace {

struct Shape {
  int64_t M, K, N;
};
const Shape kShapes[] = {{1, 4096, 4096}, {16, 4096, 4096}, {128, 768, 3072}, {512, 1024, 1024}};

std::string shape_name(const Shape& s) {
  return std::to_string(s.M) + "x" + std::to_string(s.K) + "x" + std::to_string(s.N);
}

// A frozen Linear holding w (and b, when defined) under the default scheme of `qtype` (qint4:
// groups of 128; qkmeans4: per channel) with activations `act`.
std::shared_ptr<nn::LinearImpl> frozen_linear(const at::Tensor& w, const at::Tensor& b, const QType& qtype,
                                              ActivationMode act = ActivationMode::kDynamicPerToken) {
  auto lin = std::make_shared<nn::LinearImpl>(torch::nn::LinearOptions(w.size(1), w.size(0)).bias(b.defined()));
  {
    at::NoGradGuard g;
    lin->weight.copy_(w);
    if (b.defined()) lin->bias.copy_(b);
  }
  Scheme s(qtype);
  s.activations = act;
  quantize(*lin, s);
  freeze(*lin);
  malloc_trim(0);  // freed float copies and packing buffers go back to the OS between layers
  return lin;
}

using PrepackFn = c10::intrusive_ptr<LinearPackedParamsBase>(at::Tensor, c10::optional<at::Tensor>);
using DynamicFn = at::Tensor(at::Tensor, const c10::intrusive_ptr<LinearPackedParamsBase>&, bool);

// LibTorch's int8 dynamic linear (the op behind torch.ao.nn.quantized.dynamic.Linear).
std::function<void()> libtorch_int8_dynamic(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  at::globalContext().setQEngine(at::QEngine::ONEDNN);
  static auto prepack =
      c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_prepack", "").typed<PrepackFn>();
  static auto dynamic =
      c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_dynamic", "").typed<DynamicFn>();
  const at::Tensor amax = w.abs().amax(1);
  const at::Tensor qw = at::quantize_per_channel(w, (amax / 127.0).clamp_min(1e-8).to(at::kDouble),
                                                 at::zeros({w.size(0)}, at::kLong), 0, at::kQInt8);
  auto packed = prepack.call(qw, b);
  return [x, packed] { dynamic.call(x, packed, /*reduce_range=*/false); };
}

std::vector<Case> cases(bool int4, bool vs_libtorch_int8) {
  std::vector<Case> out;
  for (const Shape& s : kShapes) {
    const at::Tensor x = at::randn({s.M, s.K});
    const at::Tensor w = at::randn({s.N, s.K}) * 0.02;
    const at::Tensor b = at::randn({s.N}) * 0.1;
    auto lin = frozen_linear(w, b, int4 ? qint4 : qint8);
    Case c{shape_name(s), 0.0, {}};
    if (vs_libtorch_int8) {
      c.impls.push_back({"libtorch", libtorch_int8_dynamic(x, w, b)});
    } else {
      c.impls.push_back({"libtorch", [x, w, b] { at::linear(x, w, b); }});
    }
    c.impls.push_back({"qforge", [x, lin] { lin->forward(x); }});
    out.push_back(std::move(c));
  }
  return out;
}

// ---- The decode regime: GEMVs over a stack of distinct weight matrices far larger than the
// last-level cache, one GEMV per matrix in turn, as a model of many layers decodes a token. ----

constexpr int64_t kColdK = 4096, kColdN = 4096;

// Matrices in the stack: enough for the int8 weights to cover 4x the last-level cache (at least
// 24), fewer when the fp32 twin stack would take more than a quarter of physical memory.
int64_t cold_layers() {
  const int64_t int8_matrix = kColdK * kColdN, fp32_matrix = 4 * kColdK * kColdN;
  const int64_t want = std::max<int64_t>(24, (4 * llc_bytes() + int8_matrix - 1) / int8_matrix);
  const int64_t fit = std::max<int64_t>(1, physical_memory_bytes() / 4 / fp32_matrix);
  return std::min(want, fit);
}

std::vector<Case> cold_cases(bool int4) {
  const int64_t layers = cold_layers();
  at::manual_seed(0);
  const at::Tensor x = at::randn({1, kColdK});
  std::vector<at::Tensor> w32;
  std::vector<std::shared_ptr<nn::LinearImpl>> frozen;
  int64_t qbytes = 0;
  for (int64_t l = 0; l < layers; ++l) {
    w32.push_back(at::randn({kColdN, kColdK}) * 0.02);
    frozen.push_back(frozen_linear(w32.back(), at::zeros({kColdN}), int4 ? qint4 : qint8));
    qbytes += frozen.back()->storage_bytes();
  }
  // The limit: a memcpy moving the qforge weights' bytes (half read, half written) through DRAM,
  // over the same threads as the kernels.
  const std::function<void()> limit = cold_memcpy(qbytes, 1);
  const std::string shape = std::to_string(layers) + "x" + std::to_string(kColdN) + "x" + std::to_string(kColdK) + " (" +
                            std::to_string(qbytes >> 20) + " MiB, " +
                            std::to_string(static_cast<double>(qbytes) / static_cast<double>(llc_bytes())).substr(0, 4) +
                            "x LLC)";
  Case c{shape, static_cast<double>(qbytes), {}};
  c.impls.push_back({"libtorch", [x, w32] {
                       for (const at::Tensor& w : w32) at::linear(x, w);
                     }});
  c.impls.push_back({"qforge", [x, frozen] {
                       for (const auto& lin : frozen) lin->forward(x);
                     }});
  c.impls.push_back({"limit", limit});
  return {c};
}

const Register kColdW8(28, "gemv_cold_w8", [] { return cold_cases(false); });
const Register kColdW4(29, "gemv_cold_w4", [] { return cold_cases(true); });

const Register kInt8VsFp32(30, "linear_w8a8dyn_vs_fp32", [] { return cases(false, false); });
const Register kInt8VsTorchInt8(31, "linear_w8a8dyn_vs_torch_int8", [] { return cases(false, true); });
const Register kInt4VsFp32(32, "linear_w4a8dyn_g128_vs_fp32", [] { return cases(true, false); });

// ---- k-means (codebook) weights: the look-up-table GEMV against fp32 and qforge's int4 GEMV.
// M = 1: qkmeans4 per channel (16 float16 levels per row, float activations) beside qint4 groups
// of 128 weight-only (qforge-int4, gemv_f32s4f32, the same float activations) and with dynamic
// int8 activations (qforge-int4a8, the VNNI kernel of gemv_cold_w4, hot case only); hot (one
// matrix, cache-resident after the first call) and cold (the gemv_cold stack, capped to what three
// copies of it leave room for in memory). ----

std::shared_ptr<nn::LinearImpl> frozen_weight_only(const at::Tensor& w, const QType& qtype) {
  return frozen_linear(w, at::Tensor(), qtype, ActivationMode::kNone);
}

std::vector<Case> kmeans_cases() {
  std::vector<Case> out;
  at::manual_seed(0);
  const at::Tensor x = at::randn({1, kColdK});
  {
    const at::Tensor w = at::randn({kColdN, kColdK}) * 0.02;
    auto km = frozen_weight_only(w, qkmeans4);
    auto i4 = frozen_weight_only(w, qint4);
    auto i4a8 = frozen_linear(w, at::Tensor(), qint4);
    Case c{"hot 1x4096x4096", 0.0, {}};
    c.impls.push_back({"libtorch", [x, w] { at::linear(x, w); }});
    c.impls.push_back({"qforge-int4", [x, i4] { i4->forward(x); }});
    c.impls.push_back({"qforge-int4a8", [x, i4a8] { i4a8->forward(x); }});
    c.impls.push_back({"qforge", [x, km] { km->forward(x); }});
    out.push_back(std::move(c));
  }
  // The gemv_cold stack, capped to what three copies (fp32, int4, k-means) leave room for.
  const int64_t layers = std::min<int64_t>(cold_layers(), physical_memory_bytes() / 8 / (4 * kColdK * kColdN));
  std::vector<at::Tensor> w32;
  std::vector<std::shared_ptr<nn::LinearImpl>> km, i4;
  int64_t qbytes = 0;
  for (int64_t l = 0; l < layers; ++l) {
    w32.push_back(at::randn({kColdN, kColdK}) * 0.02);
    km.push_back(frozen_weight_only(w32.back(), qkmeans4));
    i4.push_back(frozen_weight_only(w32.back(), qint4));
    qbytes += km.back()->storage_bytes();
  }
  const std::function<void()> limit = cold_memcpy(qbytes, 1);
  Case c{"cold " + std::to_string(layers) + "x4096x4096 (" + std::to_string(qbytes >> 20) + " MiB k-means, " +
             std::to_string(static_cast<double>(qbytes) / static_cast<double>(llc_bytes())).substr(0, 4) + "x LLC)",
         static_cast<double>(qbytes), {}};
  c.impls.push_back({"libtorch", [x, w32] {
                       for (const at::Tensor& w : w32) at::linear(x, w);
                     }});
  c.impls.push_back({"qforge-int4", [x, i4] {
                       for (const auto& lin : i4) lin->forward(x);
                     }});
  c.impls.push_back({"qforge", [x, km] {
                       for (const auto& lin : km) lin->forward(x);
                     }});
  c.impls.push_back({"limit", limit});
  out.push_back(std::move(c));
  return out;
}

// ---- Weight-only int8 (per channel) and int4 (groups of 128) at M = 64, above kWeightOnlyMaxM:
// the kernels' dequantize + GEMM entry (run_weight_only) beside the same weight dequantized with
// ATen ops (those of dequantize_int, from the int8 codes) + at::linear, the frozen Linear's path
// at this M. ----
std::vector<Case> weight_only_gemm_cases() {
  constexpr int64_t kM = 64, kGroup = 128;
  at::manual_seed(0);
  const at::Tensor x = at::randn({kM, kColdK});
  const at::Tensor b = at::randn({kColdN}) * 0.1;
  std::vector<Case> out;
  {
    const at::Tensor q = at::randint(-127, 128, {kColdN, kColdK}).to(at::kChar);
    const at::Tensor s = at::rand({kColdN}) * 0.01 + 0.001;
    auto packed = std::make_shared<kernels::PackedLinearS8>(q, s, b);
    Case c{"int8 64x4096x4096", 0.0, {}};
    const at::Tensor z = at::zeros({kColdN, 1});
    c.impls.push_back({"libtorch", [x, q, s, z, b] { at::linear(x, (q.to(at::kFloat) - z) * s.unsqueeze(1), b); }});
    c.impls.push_back({"qforge", [x, packed] { packed->run_weight_only(x); }});
    out.push_back(std::move(c));
  }
  {
    const int64_t G = kColdK / kGroup;
    const at::Tensor q = at::randint(-8, 8, {kColdN, kColdK}).to(at::kChar);
    // fp16-exact scales, as PackedLinearS4 stores them.
    const at::Tensor s = (at::rand({kColdN, G}) * 0.01 + 0.001).to(at::kHalf).to(at::kFloat);
    const at::Tensor z = at::randint(-8, 8, {kColdN, G}).to(at::kInt);
    auto packed = std::make_shared<kernels::PackedLinearS4>(q, s, z, kGroup, b);
    Case c{"int4 g128 64x4096x4096", 0.0, {}};
    c.impls.push_back({"libtorch", [x, q, s, z, b, G] {
                         const at::Tensor g = q.to(at::kFloat).reshape({kColdN, G, kGroup});
                         at::linear(x, ((g - z.unsqueeze(2)) * s.unsqueeze(2)).reshape({kColdN, kColdK}), b);
                       }});
    c.impls.push_back({"qforge", [x, packed] { packed->run_weight_only(x); }});
    out.push_back(std::move(c));
  }
  return out;
}

const Register kWeightOnlyGemm(34, "linear_weight_only_m64", [] { return weight_only_gemm_cases(); });

const Register kKMeans4(33, "gemv_kmeans4", [] { return kmeans_cases(); });

}  // namespace
}  // namespace qforge::bench
