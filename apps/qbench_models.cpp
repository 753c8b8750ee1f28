// qbench cases for whole models, as users run them:
//   conv_s8_cnn                      one SmallCnn or MobileNetV2 convolution: fp32, qforge int8, oneDNN int8 (conv_cases)
//   model_cnn_b1, model_cnn_b128     the Fashion-MNIST CNN (SmallCnn), one image / 128 images
//   model_bert_b1, model_bert_b8     BERT-base shapes (12 layers, hidden 768, 12 heads, FFN 3072,
//                                    sequence 128, random weights), 1 / 8 sequences; impl
//                                    "qforge-head": the same W8A8 with per-head attention scales
//   qat_step_cnn, qat_step_bert      one training step (forward, cross-entropy, backward, SGD)
//   calibrate_bert_b8                one calibration batch of BERT-base W8A8 (8 sequences of 128):
//                                    "qforge" inside a Calibration (the weights' cache paused: each
//                                    weight fake-quantized afresh), "qforge-cached" the same model's
//                                    fake-quant forward with every weight's cache warm (what each
//                                    calibration batch after the first cost before the pause),
//                                    "libtorch" the float forward
//   model_gpt2_decode_w8, _w4        GPT-2 small decoding 32 tokens one at a time (KV cache),
//                                    frozen weight-only int8 / int4 (freeze_for_decode, apps/qbench_models.h);
//                                    impl "qforge-q8": the same layers on block-32 int8 decode activations
// impl "libtorch": the float model (qforge's float layers run LibTorch's own ops: at::linear,
// at::conv2d, at::matmul); impl "qforge": the same model frozen to int8 (W8A8: int8 per-channel
// weights, int8 static activations calibrated by min/max on random inputs; the CNN's BatchNorm
// folded first), or for qat_step the QAT step of the model quantized that way (fake-quant
// forward, straight-through backward). Linear and conv layers run integer kernels (conv through
// im2col + the s8 GEMM, ReLU fused), attention's Q.K^T and P.V the batched int8 product
// (bmm_s8s8f32); describe() lists what each layer runs. No LibTorch
// dynamic-int8 row: LibTorch's C++ API has no quantize_dynamic for a module tree.
// impl "onnxruntime": ONNX Runtime (onnxruntime-node 1.30, apps/qbench_ort.js, the package ctest
// onnx_consumers installs into the build tree, or $QFORGE_ONNXRUNTIME_NODE/node_modules) running
// qforge's QDQ export of the frozen model (export_onnx), graph optimisations at ORT's default
// level, qbench's thread count; "onnxruntime-fp32": ORT on the float model's export. BERT's
// attention mask input is all ones (qforge's forward without a mask). Without node or the package
// both are left out with the reason on stderr.
// Regime: BERT-base's weights (436 MB float, 110 MB int8) exceed the last-level cache, so every
// forward reads them from DRAM; the CNN's (1.7 MB float) stay in cache between calls.
#include <ATen/ATen.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "apps/qbench_models.h"
#include "apps/qbench_node_peer.h"
#include "apps/qbench_registry.h"
#include "framework/core/error.h"
#include "framework/models/cnn.h"
#include "framework/onnx/export.h"
#include "kernels/cpu/conv_s8.h"
#include "kernels/cpu/dequantize_s32_f32.h"
#include "kernels/cpu/gemm_s8s8s32_onednn.h"
#include "kernels/cpu/packed_linear.h"

namespace qforge::bench {
namespace {

Scheme w8a8() {
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  return s;
}

constexpr int64_t kSeq = 128;

// The SmallCnn of seed 0 quantized W8A8 (BatchNorm folded first), calibrated on random images.
std::shared_ptr<models::SmallCnn> calibrated_w8a8_cnn() {
  torch::manual_seed(0);
  auto q = std::make_shared<models::SmallCnn>();
  (*q)->eval();
  (*q)->fold_batch_norm();
  quantize(*q, w8a8());
  Calibration calib(*q);
  at::NoGradGuard g;
  for (int i = 0; i < 4; ++i) (*q)->forward(at::randn({32, 1, 28, 28}));
  return q;
}

// The BERT of seed 0 quantized W8A8, calibrated on two random sequences.
std::shared_ptr<models::BertForSequenceClassification> calibrated_w8a8_bert(
    const models::BertConfig& cfg, AttentionScales attention = AttentionScales::kPerTensor) {
  torch::manual_seed(0);
  auto q = std::make_shared<models::BertForSequenceClassification>(cfg);
  (*q)->eval();
  Scheme s = w8a8();
  s.attention_scales = attention;
  quantize(*q, s);
  Calibration calib(*q);
  at::NoGradGuard g;
  (*q)->forward(at::randint(1, cfg.vocab_size, {2, kSeq}, at::kLong));
  return q;
}

// ONNX Runtime on `model`'s export, fed `x` (and an all-ones attention mask for token inputs).
Impl onnxruntime_impl(const std::string& impl, const torch::nn::Module& model, const at::Tensor& x, const std::string& tag) {
  std::string why;
  const std::string modules = node_modules_with("QFORGE_ONNXRUNTIME_NODE", QFORGE_ONNXRUNTIME_NODE_DIR, "onnxruntime-node",
                                                "run ctest -R onnx_consumers", &why);
  if (modules.empty() || std::system("node --version >/dev/null 2>&1") != 0 || !onnx_export::available()) {
    if (why.empty()) why = onnx_export::available() ? "node is not on PATH" : "this build has no ONNX export (libonnx-dev)";
    std::fprintf(stderr, "qbench: %s left out: %s\n", impl.c_str(), why.c_str());
    return Impl{};
  }
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("qbench-ort-" + std::to_string(getpid()));
  // The export (436 MB for BERT-base in float) goes once the peer has read it, or on failure.
  struct RemoveOnExit {
    std::filesystem::path p;
    ~RemoveOnExit() {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  } remove{dir};
  try {
    std::filesystem::create_directories(dir);
    const std::string file = (dir / (tag + ".onnx")).string();
    const onnx_export::ExportInfo info = onnx_export::export_onnx(model, file);
    nlohmann::json inputs = nlohmann::json::array();
    for (const std::string& name : info.inputs) {
      const at::Tensor t = (name == "attention_mask" ? at::ones_like(x) : x).contiguous();
      const std::string bin = (dir / (tag + "." + name + ".bin")).string();
      std::ofstream(bin, std::ios::binary).write(static_cast<const char*>(t.data_ptr()), t.nbytes());
      inputs.push_back({{"name", name}, {"file", bin}, {"type", t.scalar_type() == at::kLong ? "int64" : "float32"},
                        {"shape", t.sizes().vec()}});
    }
    const std::string inputs_json = (dir / (tag + ".inputs.json")).string();
    std::ofstream(inputs_json) << inputs.dump();
    auto peer = std::make_shared<NodePeer>(QFORGE_QBENCH_ORT_JS,
                                           std::vector<std::string>{modules, file, std::to_string(at::get_num_threads()), inputs_json},
                                           "ONNX Runtime (onnxruntime-node) on " + file);
    return Impl{impl, [peer] { peer->run(); }};
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qbench: %s left out: %s\n", impl.c_str(), e.what());
    return Impl{};
  }
}

// Eval-mode forward of the float model (seed 0, as the quantized one) beside the frozen one, and
// ONNX Runtime on both models' exports.
template <class M>
std::vector<Case> frozen_vs_float(const std::string& shape, std::shared_ptr<M> fp, std::shared_ptr<M> q, at::Tensor x) {
  (*fp)->eval();
  freeze(*q);
  Case c{shape, 0, {}};
  c.impls.push_back({"libtorch", [fp, x] {
    at::NoGradGuard g;
    (*fp)->forward(x);
  }});
  c.impls.push_back({"qforge", [q, x] {
    at::NoGradGuard g;
    (*q)->forward(x);
  }});
  for (auto impl : {onnxruntime_impl("onnxruntime", **q, x, shape + "-qdq"), onnxruntime_impl("onnxruntime-fp32", **fp, x, shape + "-fp32")})
    if (impl.run) c.impls.push_back(impl);
  return {c};
}

std::vector<Case> cnn_cases(int64_t batch) {
  auto q = calibrated_w8a8_cnn();
  torch::manual_seed(0);
  auto fp = std::make_shared<models::SmallCnn>();  // before the input draws from the generator
  return frozen_vs_float("b" + std::to_string(batch) + "_1x28x28", fp, q, at::randn({batch, 1, 28, 28}));
}

std::vector<Case> bert_cases(int64_t batch) {
  const models::BertConfig cfg = bert_base(12);
  auto q = calibrated_w8a8_bert(cfg);
  // The same model with per-head static scales on its attention products (one scale array per slice).
  auto q_head = calibrated_w8a8_bert(cfg, AttentionScales::kPerHead);
  freeze(*q_head);
  torch::manual_seed(0);
  auto fp = std::make_shared<models::BertForSequenceClassification>(cfg);
  const at::Tensor x = at::randint(1, cfg.vocab_size, {batch, kSeq}, at::kLong);
  std::vector<Case> cases = frozen_vs_float("L12_H768_b" + std::to_string(batch) + "_s128", fp, q, x);
  cases[0].impls.insert(cases[0].impls.begin() + 2, {"qforge-head", [q_head, x] {
                          at::NoGradGuard g;
                          (*q_head)->forward(x);
                        }});
  return cases;
}

// One calibration batch with the weights' cache paused against the same forward with it warm.
std::vector<Case> calibrate_bert_cases() {
  const models::BertConfig cfg = bert_base(12);
  torch::manual_seed(0);
  auto fp = std::make_shared<models::BertForSequenceClassification>(cfg);
  (*fp)->eval();
  auto q = std::make_shared<models::BertForSequenceClassification>(cfg);
  (*q)->eval();
  quantize(*q, w8a8());
  const at::Tensor x = at::randint(1, cfg.vocab_size, {8, kSeq}, at::kLong);
  {
    Calibration calib(*q);  // scales for the cached fake-quant forward
    (*q)->forward(x);
  }
  return {Case{"L12_H768_b8_s128",
               0,
               {{"libtorch", [fp, x] {
                   at::NoGradGuard g;
                   (*fp)->forward(x);
                 }},
                {"qforge", [q, x] {
                   Calibration calib(*q);
                   (*q)->forward(x);
                 }},
                {"qforge-cached", [q, x] {
                   at::NoGradGuard g;
                   (*q)->forward(x);
                 }}}}};
}

// One convolution of the SmallCnn or MobileNetV2 at its real shape, three ways on the same data: LibTorch's
// fp32 at::conv2d (oneDNN / its own, NCHW float input), qforge's im2col convolution
// (im2col_nhwc_s8 + the int8 GEMM chain, kernels::conv2d_s8s8f32) and oneDNN's int8
// convolution (kernels::conv2d_s8s8f32_onednn: s8 x s8 -> s32 channels-last, then qforge's
// dequantize_s32_f32 epilogue, so both int8 rows compute the same float values; what a frozen
// int8 Conv2d runs on AVX-512 VNNI). Both int8 rows start from int8 channels-last codes
// (input quantization excluded) and write float NHWC. The oneDNN row is checked against qforge's
// bit for bit before timing.
std::vector<Case> conv_cases() {
  struct Shape {
    const char* name;
    int64_t batch, c, hw, n, kernel = 3, stride = 1;
  };
  std::vector<Case> out;
  // The SmallCnn's, then MobileNetV2's (Fashion-MNIST, batch 32) largest: its stem and two 1x1
  // convolutions over few input channels at 14 x 14; then ResNet-18's 3x3 layers on 224 x 224
  // inputs where they have fewer output pixels than kOneDnnConvMinRows.
  for (const Shape& sh : {Shape{"conv1_b128_1x28x28_to32", 128, 1, 28, 32}, Shape{"conv2_b1_32x14x14_to64", 1, 32, 14, 64},
                          Shape{"conv2_b128_32x14x14_to64", 128, 32, 14, 64},
                          Shape{"mbv2_stem_b32_1x28x28_to32_s2", 32, 1, 28, 32, 3, 2},
                          Shape{"mbv2_1x1_b32_16x14x14_to96", 32, 16, 14, 96, 1},
                          Shape{"mbv2_1x1_b32_32x14x14_to16", 32, 32, 14, 16, 1},
                          Shape{"r18_224_layer2_b1_128x28x28_to128", 1, 128, 28, 128},
                          Shape{"r18_224_layer3_b1_256x14x14_to256", 1, 256, 14, 256},
                          Shape{"r18_224_layer3_b8_256x14x14_to256", 8, 256, 14, 256},
                          Shape{"r18_224_layer4_b1_512x7x7_to512", 1, 512, 7, 512},
                          Shape{"r18_224_layer4_b8_512x7x7_to512", 8, 512, 7, 512}}) {
    kernels::ConvGeometry g;
    g.batch = sh.batch;
    g.in_channels = sh.c;
    g.in_h = g.in_w = sh.hw;
    g.out_channels = sh.n;
    g.kernel_h = g.kernel_w = sh.kernel;
    g.stride_h = g.stride_w = sh.stride;
    g.pad_h = g.pad_w = sh.kernel / 2;
    const int64_t M = g.gemm_m(), N = g.out_channels, K = g.gemm_k();
    torch::manual_seed(0);
    const at::Tensor x_float = at::randn({g.batch, g.in_channels, g.in_h, g.in_w});
    const at::Tensor w_float = at::randn({N, g.in_channels, sh.kernel, sh.kernel}) * 0.1;
    const at::Tensor x_nhwc = at::randint(-127, 128, {g.batch, g.in_h, g.in_w, g.in_channels}, at::kChar);
    const at::Tensor w_codes = at::randint(-127, 128, {N, g.in_channels, sh.kernel, sh.kernel}, at::kChar);
    const at::Tensor w_scale = at::rand({N}) * 0.01 + 0.001, a_scale = at::full({1}, 0.02f);
    kernels::PackOptions no_onednn;
    no_onednn.onednn = false;
    auto packed = std::make_shared<kernels::PackedLinearS8>(w_codes.permute({0, 2, 3, 1}).reshape({N, K}).contiguous(),
                                                            w_scale, at::Tensor(), no_onednn);
    std::string status;
    std::shared_ptr<const kernels::detail::OneDnnConvS8> dnn =
        kernels::detail::onednn_conv_s8(w_codes.data_ptr<int8_t>(), g, &status);
    const at::Tensor y_q = at::empty({M, N}), y_d = at::empty({M, N});
    const float sa = a_scale[0].item<float>();
    auto run_qforge = [packed, g, x_nhwc, y_q, sa] {
      kernels::conv2d_s8s8f32(x_nhwc.data_ptr<int8_t>(), sa, packed->view(), packed->w_scale().data_ptr<float>(),
                              nullptr, g, y_q.data_ptr<float>());
    };
    auto run_onednn = [dnn, g, x_nhwc, w_scale, y_d, sa, name = std::string(sh.name)] {
      kernels::RunInfo info;
      QF_REQUIRE(kernels::conv2d_s8s8f32_onednn(*dnn, x_nhwc.data_ptr<int8_t>(), sa, w_scale.data_ptr<float>(), nullptr,
                                                g, y_d.data_ptr<float>(), false, &info),
                 "qbench conv_s8_cnn ", name, ": oneDNN refused the convolution: ", info.fallback);
    };
    Case c{sh.name, 0, {}};
    c.impls.push_back({"libtorch", [x_float, w_float, g] {
      at::NoGradGuard ng;
      at::conv2d(x_float, w_float, {}, g.stride_h, g.pad_h);
    }});
    c.impls.push_back({"qforge", run_qforge});
    if (dnn != nullptr) {
      run_qforge();
      run_onednn();
      QF_REQUIRE(at::equal(y_q, y_d), "qbench conv_s8_cnn: oneDNN's int8 convolution disagrees with qforge's on ",
                 sh.name);
      c.impls.push_back({"onednn-int8", run_onednn});
    } else {
      std::fprintf(stderr, "conv_s8_cnn %s: no oneDNN row: %s\n", sh.name, status.c_str());
    }
    out.push_back(c);
  }
  return out;
}

// One SGD step of `model` on (x, y) through `forward`.
template <class M, class Fwd>
std::function<void()> train_step(std::shared_ptr<M> model, Fwd forward, at::Tensor target) {
  auto opt = std::make_shared<torch::optim::SGD>((*model)->parameters(), torch::optim::SGDOptions(1e-4));
  return [model, forward, target, opt] {
    opt->zero_grad();
    at::cross_entropy_loss(forward(), target).backward();
    opt->step();
  };
}

std::vector<Case> qat_cnn_cases() {
  constexpr int64_t kBatch = 64;
  auto q = calibrated_w8a8_cnn();
  torch::manual_seed(0);
  auto fp = std::make_shared<models::SmallCnn>();
  (*fp)->train();
  (*q)->train();
  const at::Tensor x = at::randn({kBatch, 1, 28, 28}), y = at::randint(0, 10, {kBatch}, at::kLong);
  Case c{"b64_1x28x28", 0, {}};
  c.impls.push_back({"libtorch", train_step(fp, [fp, x] { return (*fp)->forward(x); }, y)});
  c.impls.push_back({"qforge", train_step(q, [q, x] { return (*q)->forward(x); }, y)});
  return {c};
}

std::vector<Case> qat_bert_cases() {
  constexpr int64_t kBatch = 8, kLayers = 4;
  const models::BertConfig cfg = bert_base(kLayers);
  auto q = calibrated_w8a8_bert(cfg);
  torch::manual_seed(0);
  auto fp = std::make_shared<models::BertForSequenceClassification>(cfg);
  (*fp)->train();
  (*q)->train();
  const at::Tensor ids = at::randint(1, cfg.vocab_size, {kBatch, kSeq}, at::kLong);
  const at::Tensor y = at::randint(0, cfg.num_labels, {kBatch}, at::kLong);
  Case c{"L4_H768_b8_s128", 0, {}};
  c.impls.push_back({"libtorch", train_step(fp, [fp, ids] { return (*fp)->forward(ids); }, y)});
  c.impls.push_back({"qforge", train_step(q, [q, ids] { return (*q)->forward(ids); }, y)});
  return {c};
}

// ---- GPT-2 small decoding token by token: 12 layers, hidden 768, 12 heads, vocabulary 50257
// (random weights, seed 0). Each run feeds 32 tokens one at a time (greedy: each step's argmax is
// the next input) after a 16-token prompt already in the KV cache. "libtorch": the float model,
// its LM head tied to the token embedding (at::linear on the [50257, 768] table). "qforge": the
// same weights with the head untied (untie_lm_head(): same logits), frozen weight-only: every
// Linear of the blocks and the head int8 per channel (w8) or int4 in groups of 128 (w4) on the
// weight-only GEMV kernels; both embeddings int8 per row (row gather; an int4 table would be
// dequantized whole per call). LayerNorms stay float. Regime: DRAM (float 498 MB of weights). ----

constexpr int64_t kPrompt = 16, kDecode = 32;

// Greedy decoding of kDecode tokens after `prompt`, whose kPrompt positions `cache` holds.
std::function<void()> decode(std::shared_ptr<models::Gpt2LMHeadModel> m, std::shared_ptr<models::Gpt2KvCache> cache,
                             at::Tensor first) {
  return [m, cache, first] {
    at::NoGradGuard g;
    cache->truncate(kPrompt);  // drops the previous run's tokens in place (no copy in the timed run)
    at::Tensor next = first;
    for (int64_t t = 0; t < kDecode; ++t) next = (*m)->forward(next, cache.get()).select(1, 0).argmax(-1, true);
  };
}

std::vector<Case> gpt2_decode_cases(const QType& qtype) {
  const models::Gpt2Config cfg = gpt2_small();
  torch::manual_seed(0);
  auto fp = std::make_shared<models::Gpt2LMHeadModel>(cfg);
  (*fp)->eval();
  torch::manual_seed(1);
  auto q = std::make_shared<models::Gpt2LMHeadModel>(cfg);
  (*q)->eval();
  models::load_model_state(**q, models::model_state(**fp));
  freeze_for_decode(*q, qtype);
  const at::Tensor prompt = at::randint(0, cfg.vocab_size, {1, kPrompt}, at::kLong);
  auto fp_cache = std::make_shared<models::Gpt2KvCache>(), q_cache = std::make_shared<models::Gpt2KvCache>();
  fp_cache->reserve(kPrompt + kDecode), q_cache->reserve(kPrompt + kDecode);  // no store grows in a run
  at::Tensor fp_first, q_first;
  {
    at::NoGradGuard g;
    fp_first = (*fp)->forward(prompt, fp_cache.get()).select(1, kPrompt - 1).argmax(-1, true);
    q_first = (*q)->forward(prompt, q_cache.get()).select(1, kPrompt - 1).argmax(-1, true);
  }
  Case c{"L12_H768_prompt16_decode32_tokens", 0, {}};
  c.impls.push_back({"libtorch", decode(fp, fp_cache, fp_first)});
  c.impls.push_back({"qforge", decode(q, q_cache, q_first)});
  c.impls.push_back({"qforge-q8", with_decode(q->ptr(), DecodeActivations::kQ8Block32, decode(q, q_cache, q_first))});
  return {c};
}

const Register kConvCnn(69, "conv_s8_cnn", conv_cases);
const Register kCnnB1(70, "model_cnn_b1", [] { return cnn_cases(1); });
const Register kCnnB128(71, "model_cnn_b128", [] { return cnn_cases(128); });
const Register kBertB1(72, "model_bert_b1", [] { return bert_cases(1); });
const Register kBertB8(73, "model_bert_b8", [] { return bert_cases(8); });
const Register kCalibrateBert(74, "calibrate_bert_b8", calibrate_bert_cases);
const Register kQatCnn(74, "qat_step_cnn", qat_cnn_cases);
const Register kQatBert(75, "qat_step_bert", qat_bert_cases);
const Register kGpt2W8(76, "model_gpt2_decode_w8", [] { return gpt2_decode_cases(qint8); });
const Register kGpt2W4(77, "model_gpt2_decode_w4", [] { return gpt2_decode_cases(qint4); });

}  // namespace
}  // namespace qforge::bench
