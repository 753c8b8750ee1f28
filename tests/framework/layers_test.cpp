// qforge layers before quantize() are their LibTorch twins, bit for bit; after quantize() they
// fake-quantize; after freeze() they match fake-quant and hold packed weights only.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <functional>
#include <type_traits>
#include <vector>

#include "fake_quant/fake_quantize.h"
#include "framework/core/error.h"
#include "framework/nn/conv.h"
#include "framework/nn/embedding.h"
#include "framework/nn/layer_norm.h"
#include "framework/nn/linear.h"
#include "framework/nn/matmul.h"
#include "framework/nn/packed_weight.h"
#include "framework/api/quantize.h"
#include "kernels/cpu/kernel_choice.h"
#include "kernels/cpu/packed_layout.h"

using namespace qforge;

namespace {

// Relative error measured against the output's scale.
double rel_error(const at::Tensor& a, const at::Tensor& b) {
  const double denom = std::max(b.abs().max().item<double>(), 1e-12);
  return (a - b).abs().max().item<double>() / denom;
}

struct TwoLinear : torch::nn::Module {
  TwoLinear(int64_t in, int64_t hidden, int64_t out)
      : fc1(register_module("fc1", nn::Linear(in, hidden))), fc2(register_module("fc2", nn::Linear(hidden, out))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(at::relu(fc1(x))); }
  nn::Linear fc1, fc2;
};

// A Conv2d quantized W8A8 (min/max static activations), calibrated on calib_x and frozen.
nn::Conv2d frozen_w8a8_conv2d(const torch::nn::Conv2dOptions& options, const at::Tensor& calib_x) {
  nn::Conv2d c(options);
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  quantize(c, s);
  {
    Calibration calib(c);
    c(calib_x);
  }
  freeze(c);
  return c;
}

}  // namespace

TEST(Layers, FloatForwardAndParametersEqualLibTorchBitForBit) {
  at::manual_seed(1);
  nn::Linear q(17, 9);
  at::manual_seed(1);
  torch::nn::Linear t(17, 9);
  EXPECT_TRUE(at::equal(q->weight, t->weight));  // same initialisation
  EXPECT_TRUE(at::equal(q->bias, t->bias));
  const at::Tensor x = at::randn({4, 17});
  EXPECT_TRUE(at::equal(q(x), t(x)));
  EXPECT_EQ(q->named_parameters().keys(), t->named_parameters().keys());

  at::manual_seed(2);
  nn::Conv2d qc(torch::nn::Conv2dOptions(3, 8, 3).padding(1).stride(2));
  at::manual_seed(2);
  torch::nn::Conv2d tc(torch::nn::Conv2dOptions(3, 8, 3).padding(1).stride(2));
  const at::Tensor img = at::randn({2, 3, 9, 9});
  EXPECT_TRUE(at::equal(qc(img), tc(img)));

  at::manual_seed(3);
  nn::Conv1d q1(torch::nn::Conv1dOptions(4, 6, 5).padding_mode(torch::kReflect).padding(2));
  at::manual_seed(3);
  torch::nn::Conv1d t1(torch::nn::Conv1dOptions(4, 6, 5).padding_mode(torch::kReflect).padding(2));
  const at::Tensor seq = at::randn({2, 4, 11});
  EXPECT_TRUE(at::equal(q1(seq), t1(seq)));

  at::manual_seed(4);
  nn::Embedding qe(50, 8);
  at::manual_seed(4);
  torch::nn::Embedding te(50, 8);
  const at::Tensor idx = at::randint(0, 50, {3, 5});
  EXPECT_TRUE(at::equal(qe(idx), te(idx)));

  nn::LayerNorm qn(torch::nn::LayerNormOptions({8}));
  torch::nn::LayerNorm tn(torch::nn::LayerNormOptions({8}));
  const at::Tensor h = at::randn({3, 8});
  EXPECT_TRUE(at::equal(qn(h), tn(h)));
}

TEST(Layers, LoadsAPlainLibTorchStateDict) {
  torch::nn::Linear t(6, 3);
  nn::Linear q(6, 3);
  torch::NoGradGuard g;
  for (const auto& p : t->named_parameters()) q->named_parameters()[p.key()].copy_(p.value());
  const at::Tensor x = at::randn({2, 6});
  EXPECT_TRUE(at::equal(q(x), t(x)));
}

TEST(Quantize, Int8WeightsFakeQuantizeWithPerChannelScales) {
  at::manual_seed(5);
  auto model = std::make_shared<TwoLinear>(32, 64, 10);
  const at::Tensor x = at::randn({8, 32});
  const at::Tensor y_float = model->forward(x);
  const QuantizeReport rep = quantize(*model, qint8);
  ASSERT_EQ(rep.quantized.size(), 2u);
  const at::Tensor y_q = model->forward(x);
  EXPECT_FALSE(at::equal(y_q, y_float));
  EXPECT_LT(rel_error(y_q, y_float), 0.05);
  // The fake-quantized weight is exactly fake_quantize(w, per-channel min/max qparams).
  const QParams qp = model->fc1->weight_quantizer()->qparams(model->fc1->weight);
  EXPECT_EQ(qp.scale.sizes(), (std::vector<int64_t>{64}));
  const at::Tensor expected = at::linear(x, fake_quantize(model->fc1->weight, qp), model->fc1->bias);
  EXPECT_TRUE(at::equal(model->fc1(x), expected));
  // State lives in buffers with plain names.
  const auto buffers = model->named_buffers();
  EXPECT_TRUE(buffers.contains("fc1.input_quantizer.scale") || buffers.contains("fc1.weight_quantizer.scale"));
}

TEST(Quantize, RulesFirstMatchWinsKeepFloatAndUnmatchedPatternsWarn) {
  auto model = std::make_shared<TwoLinear>(16, 16, 4);
  Scheme s(qint8);
  s.rules.push_back(LayerRule{"fc2", /*keep_float=*/true});
  s.rules.push_back(LayerRule{"fc*", false, qint4});
  s.rules.push_back(LayerRule{"decoder.*", true});
  const QuantizeReport rep = quantize(*model, s);
  ASSERT_EQ(rep.quantized.size(), 1u);
  EXPECT_EQ(rep.quantized[0].path, "fc1");
  EXPECT_EQ(rep.quantized[0].scheme.weights->spec.qtype, qint4);
  EXPECT_FALSE(model->fc2->quantized());
  ASSERT_EQ(rep.warnings.size(), 1u);
  EXPECT_NE(rep.warnings[0].find("decoder.*"), std::string::npos);
  // Quantizing again replaces the scheme.
  quantize(*model, qint8);
  EXPECT_EQ(model->fc1->scheme().weights->spec.qtype, qint8);
  EXPECT_TRUE(model->fc2->quantized());
}

TEST(Calibration, StaticActivationsGetScalesOnExitAndFreezeNeedsThem) {
  at::manual_seed(6);
  auto model = std::make_shared<TwoLinear>(16, 32, 4);
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  quantize(*model, s);
  model->eval();
  try {
    freeze(*model);
    FAIL() << "freeze before calibration must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fc1.input"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fc2.input"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(model->fc1->frozen());  // nothing changed
  const at::Tensor x = at::randn({64, 16});
  {
    Calibration calib(*model);
    model->forward(x);
  }
  ASSERT_TRUE(model->fc1->input_quantizer()->calibrated());
  const QParams a = model->fc1->input_quantizer()->qparams();
  const float amax = x.abs().max().item<float>();
  EXPECT_FLOAT_EQ(a.scale.item<float>(), amax / 127.0f);  // symmetric narrow int8
  EXPECT_NO_THROW(freeze(*model));
}

// Frozen forward equals fake-quant forward for every qtype, granularity and activation mode.
TEST(Freeze, FrozenLinearMatchesFakeQuantForEveryScheme) {
  struct Case {
    QType w;
    Granularity g;
    int64_t group;
    ActivationMode act;
    bool exact;  // same float ops (dequantize + at::linear) vs integer accumulation
    bool symmetric = true;
  };
  const std::vector<Case> cases{
      {qint8, Granularity::kPerChannel, 0, ActivationMode::kDynamicPerToken, false},
      {qint8, Granularity::kPerTensor, 0, ActivationMode::kDynamicPerToken, false},
      {qint8, Granularity::kPerChannel, 0, ActivationMode::kStatic, false},
      {qint4, Granularity::kPerGroup, 32, ActivationMode::kDynamicPerToken, false},
      {qint4, Granularity::kPerChannel, 0, ActivationMode::kStatic, false},
      {qint4, Granularity::kPerGroup, 32, ActivationMode::kStatic, false},
      {qint8, Granularity::kPerChannel, 0, ActivationMode::kNone, false},
      {qint4, Granularity::kPerGroup, 32, ActivationMode::kNone, false},
      {qint8, Granularity::kPerGroup, 32, ActivationMode::kNone, false},         // PackedLinearS8G
      {qint8, Granularity::kPerGroup, 32, ActivationMode::kNone, false, false},  // with zero points
      {qint2, Granularity::kPerGroup, 32, ActivationMode::kNone, true},
      {qint3, Granularity::kPerGroup, 32, ActivationMode::kNone, false},
      {qint3, Granularity::kPerChannel, 0, ActivationMode::kStatic, false},
      {qfloat8_e4m3fn, Granularity::kPerChannel, 0, ActivationMode::kNone, true},
      {qfloat8_e4m3fn, Granularity::kPerGroup, 16, ActivationMode::kNone, true},
      {quint8, Granularity::kPerChannel, 0, ActivationMode::kNone, true},
      {qint4, Granularity::kPerTensor, 0, ActivationMode::kNone, false},
      {qint4, Granularity::kPerTensor, 0, ActivationMode::kDynamicPerToken, false},
  };
  for (const int64_t M : {1, 3, 16, 40}) {
    for (const Case& c : cases) {
      at::manual_seed(7);
      nn::Linear lin(64, 48);
      lin->eval();
      Scheme s(c.w);
      s.weight_granularity = c.g;
      s.group_size = c.group;
      s.weight_symmetric = c.w != quint8 && c.symmetric;
      s.activations = c.act;
      s.observer = "minmax";
      quantize(lin, s);
      const at::Tensor x = at::randn({M, 64});
      if (c.act == ActivationMode::kStatic) {
        Calibration calib(lin);
        lin(at::randn({32, 64}));
      }
      at::Tensor y_fq;
      {
        at::NoGradGuard g;
        y_fq = lin(x);
      }
      freeze(lin);
      const at::Tensor y = lin(x);
      const std::string what = std::string(c.w.name) + " " + to_string(c.g) + " " + to_string(c.act) + " M=" +
                               std::to_string(M) + " kernel " + lin->report().kernel;
      if (c.exact) {
        EXPECT_TRUE(at::equal(y, y_fq)) << what << ": " << rel_error(y, y_fq);
      } else {
        EXPECT_LE(rel_error(y, y_fq), 1e-5) << what;
      }
      EXPECT_TRUE(lin->frozen());
      EXPECT_FALSE(lin->named_parameters().contains("weight")) << what;
      EXPECT_FALSE(lin->weight.defined()) << what;
    }
  }
}

TEST(Freeze, ModelSizeShrinksAtLeastFourfoldForInt8AndSevenAndHalfForInt4) {
  struct Net : torch::nn::Module {
    Net() {
      for (int i = 0; i < 3; ++i) layers.push_back(register_module("l" + std::to_string(i), nn::Linear(512, 512)));
    }
    std::vector<nn::Linear> layers;
  };
  auto net8 = std::make_shared<Net>();
  const int64_t float_bytes = model_size(*net8).total_bytes;
  Scheme s8(qint8);
  s8.activations = ActivationMode::kDynamicPerToken;
  quantize(*net8, s8);
  freeze(*net8);
  const int64_t int8_bytes = model_size(*net8).total_bytes;
  EXPECT_GE(static_cast<double>(float_bytes) / int8_bytes, 3.9) << float_bytes << " / " << int8_bytes;

  auto net4 = std::make_shared<Net>();
  Scheme s4(qint4);  // groups of 128 by default
  s4.activations = ActivationMode::kDynamicPerToken;
  quantize(*net4, s4);
  freeze(*net4);
  const int64_t int4_bytes = model_size(*net4).total_bytes;
  EXPECT_GE(static_cast<double>(float_bytes) / int4_bytes, 7.5) << float_bytes << " / " << int4_bytes;
  EXPECT_NE(describe(*net4).find("qint4"), std::string::npos);
  // Per-token activations are labelled per token, not with the spec's unused per_tensor.
  const std::string d = describe(*net8);
  EXPECT_NE(d.find("dynamic qint8 per_token symmetric"), std::string::npos) << d;
  EXPECT_EQ(d.find("per_tensor"), std::string::npos) << d;
}

TEST(Quantize, PlainLibTorchLayersAreNamedNotSkippedSilently) {
  struct Net : torch::nn::Module {
    Net()
        : a(register_module("a", nn::Linear(8, 8))),
          b(register_module("b", torch::nn::Linear(8, 8))),
          c(register_module("c", nn::Linear(8, 4))) {}
    nn::Linear a;
    torch::nn::Linear b;
    nn::Linear c;
  };
  // Default: refused, naming it, nothing attached.
  Net strict_net;
  try {
    quantize(strict_net, qint8);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("b (torch::nn::Linear): a member of"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(strict_net.a->quantized());
  // allow_float_layers: a warning naming it, and describe() lists it float, in model order, with the reason.
  Net net;
  Scheme allow(qint8);
  allow.allow_float_layers = true;
  const QuantizeReport rep = quantize(net, allow);
  ASSERT_EQ(rep.warnings.size(), 1u);
  EXPECT_EQ(rep.warnings[0], "b: torch::nn::Linear is a LibTorch layer, not a qforge layer: it stays float "
                             "(use qforge::nn::Linear)");
  const std::vector<LayerReport> rows = layer_reports(net);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].name, "a");
  EXPECT_EQ(rows[1].name, "b");
  EXPECT_EQ(rows[1].type, "torch::nn::Linear");
  EXPECT_EQ(rows[1].weights, "float");
  EXPECT_EQ(rows[1].bytes, (8 * 8 + 8) * 4);
  EXPECT_EQ(rows[2].name, "c");
  EXPECT_NE(describe(net).find("use qforge::nn::Linear"), std::string::npos);
}

TEST(Api, TakesSharedPtrsHoldersAndReferencesAlike) {
  struct Net : torch::nn::Module {
    Net() : fc(register_module("fc", nn::Linear(16, 4))) {}
    at::Tensor forward(const at::Tensor& x) { return fc(x); }
    nn::Linear fc;
  };
  auto model = std::make_shared<Net>();  // the usual LibTorch style
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  EXPECT_EQ(quantize(model, s).quantized.size(), 1u);
  {
    Calibration calib(model);
    model->forward(at::randn({8, 16}));
  }
  freeze(model);
  EXPECT_NE(describe(model).find("fc"), std::string::npos);
  EXPECT_EQ(layer_reports(model).size(), 1u);
  EXPECT_EQ(model_size(model).total_bytes, model_size(*model).total_bytes);
  // A holder and a reference reach the same layer.
  EXPECT_EQ(describe(model->fc), describe(*model->fc));
}

TEST(Describe, AGroupSizeThatDoesNotDivideIsRecordedBesideTheLayer) {
  nn::Linear lin(64, 8);
  Scheme s(qint4);  // groups of 128: 64 input features take none
  const QuantizeReport rep = quantize(lin, s);
  ASSERT_EQ(rep.warnings.size(), 1u);
  const std::string d = describe(lin);
  EXPECT_NE(d.find("qint4 per_channel"), std::string::npos) << d;
  EXPECT_NE(d.find("scheme: dimension 64 is not a multiple of group_size 128; using per_channel"), std::string::npos) << d;
  EXPECT_EQ(layer_reports(lin)[0].fallback_reason.rfind("scheme: ", 0), 0u);
}

TEST(Freeze, FloatWeightMemoryIsReleased) {
  nn::Linear lin(256, 256);
  c10::weak_intrusive_ptr<c10::StorageImpl> weak(lin->weight.storage().getWeakStorageImpl());
  quantize(lin, qint8);
  lin->eval();
  {
    at::NoGradGuard g;
    lin(at::randn({2, 256}));  // fills the eval cache, which must not keep the weight alive
  }
  ASSERT_FALSE(weak.expired());
  freeze(lin);
  EXPECT_FALSE(lin->weight.defined());
  EXPECT_TRUE(weak.expired()) << "the float weight's storage is still referenced after freeze";
}

TEST(Freeze, EmbeddingConvLayerNormMatMulFreezeAndReportFallbacks) {
  at::manual_seed(8);
  nn::Embedding emb(100, 64);
  nn::Conv2d conv(torch::nn::Conv2dOptions(3, 4, 3));
  quantize(emb, qint8);
  quantize(conv, qint8);
  const at::Tensor idx = at::randint(0, 100, {4, 7});
  const at::Tensor img = at::randn({1, 3, 8, 8});
  at::Tensor e_fq, c_fq;
  {
    at::NoGradGuard g;
    emb->eval();
    conv->eval();
    e_fq = emb(idx);
    c_fq = conv(img);
  }
  freeze(emb);
  freeze(conv);
  EXPECT_TRUE(at::equal(emb(idx), e_fq));
  EXPECT_TRUE(at::equal(conv(img), c_fq));
  EXPECT_EQ(emb->report().kernel, "gather_s8+dequantize_rows");
  EXPECT_NE(conv->report().fallback_reason.find("no weight-only integer convolution kernel"), std::string::npos);

  nn::MatMul mm;
  Scheme s;
  s.weights = std::nullopt;
  s.activations = ActivationMode::kDynamicPerToken;
  quantize(mm, s);
  const at::Tensor q = at::randn({2, 5, 8}), k = at::randn({2, 8, 5});
  const at::Tensor scores = mm(q, k);
  EXPECT_LT(rel_error(scores, at::matmul(q, k)), 0.05);
  EXPECT_FALSE(at::equal(scores, at::matmul(q, k)));
}

TEST(Quantize, UnsupportedCombinationsAreClearErrors) {
  nn::Embedding emb(10, 8);
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.rules.push_back(LayerRule{"*", false});
  // Embedding inputs are indices: the scheme resolver leaves activations off for it.
  EXPECT_NO_THROW(quantize(emb, s));
  LayerScheme bad;
  bad.activations = ActivationMode::kStatic;
  try {
    emb->attach("emb", bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("indices"), std::string::npos) << e.what();
  }
  nn::Linear lin(10, 4);
  Scheme g(qint4);
  g.group_size = 3;  // 10 % 3 != 0: falls back to per-channel with a warning
  const QuantizeReport rep = quantize(lin, g);
  ASSERT_FALSE(rep.warnings.empty());
  EXPECT_EQ(lin->scheme().weights->spec.granularity, Granularity::kPerChannel);
}

TEST(Qat, StraightThroughTrainingReducesLossAndKeepsFloatLatentWeights) {
  at::manual_seed(9);
  nn::Linear lin(8, 1);
  const at::Tensor x = at::randn({256, 8});
  const at::Tensor w_true = at::randn({1, 8});
  const at::Tensor y = at::matmul(x, w_true.t());
  Scheme s(qint4);
  s.weight_granularity = Granularity::kPerChannel;
  s.weight_lsq = true;
  quantize(lin, s);
  QatController qat(*lin.ptr(), QatOptions{});
  qat.begin_epoch();
  std::vector<at::Tensor> params;
  for (const auto& p : lin->parameters()) params.push_back(p);
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    for (auto& p : lin->parameters()) p.mutable_grad() = at::Tensor();
    const at::Tensor loss = (lin(x) - y).pow(2).mean();
    loss.backward();
    {
      at::NoGradGuard g;
      for (auto& p : lin->parameters())
        if (p.grad().defined()) p.sub_(p.grad() * 0.05);
    }
    qat.step();
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  EXPECT_LT(last, first * 0.2) << first << " -> " << last;
  EXPECT_EQ(lin->weight.scalar_type(), at::kFloat);
  EXPECT_TRUE(lin->named_parameters().contains("weight_quantizer.scale"));  // LSQ step is learnable
}

// torch::optim::SGD updates weights through .data(), which leaves their version counter alone:
// the eval-mode fake-quant cache must still see the trained weight.
TEST(Qat, EvalAfterAnSgdStepSeesTheTrainedWeight) {
  at::manual_seed(10);
  nn::Linear lin(16, 4);
  quantize(lin, Scheme(qint8));
  lin->eval();
  const at::Tensor x = at::randn({3, 16});
  {
    at::NoGradGuard g;
    lin(x);  // fills the cache
  }
  lin->train();
  torch::optim::SGD opt(lin->parameters(), torch::optim::SGDOptions(0.5));
  lin(x).sum().backward();
  opt.step();
  lin->eval();
  at::NoGradGuard g;
  const QParams qp = lin->weight_quantizer()->qparams(lin->weight);
  EXPECT_TRUE(at::equal(lin(x), at::linear(x, fake_quantize(lin->weight, qp), lin->bias)));
}

// set_data (LibTorch's way to load new values into a parameter) keeps the TensorImpl and its
// version counter and swaps the storage: the eval-mode cache must see the new weight.
TEST(Qat, EvalCacheSeesAWeightReplacedBySetData) {
  at::manual_seed(11);
  nn::Linear lin(16, 4);
  quantize(lin, Scheme(qint8));
  lin->eval();
  at::NoGradGuard g;
  const at::Tensor x = at::randn({3, 16});
  const at::Tensor before = lin(x);  // fills the cache
  const auto* impl = lin->weight.unsafeGetTensorImpl();
  const auto version = lin->weight._version();
  lin->weight.set_data(at::randn({4, 16}));
  ASSERT_EQ(lin->weight.unsafeGetTensorImpl(), impl);
  ASSERT_EQ(lin->weight._version(), version);
  const QParams qp = lin->weight_quantizer()->qparams(lin->weight);
  const at::Tensor after = lin(x);
  EXPECT_FALSE(at::equal(after, before));
  EXPECT_TRUE(at::equal(after, at::linear(x, fake_quantize(lin->weight, qp), lin->bias)));
}

// Two set_data calls with the first weight's memory handed out again in between: a key on the
// data pointer sees the same TensorImpl, version and address and returns the stale output. The
// allocator's reuse is made certain here by placing the first and third weights on one buffer.
TEST(Qat, EvalCacheSeesANewWeightAtAFreedWeightsAddress) {
  at::manual_seed(12);
  std::vector<float> memory(4 * 16);  // outlives the layer that points into it
  nn::Linear lin(16, 4);
  quantize(lin, Scheme(qint8));
  lin->eval();
  at::NoGradGuard g;
  const at::Tensor x = at::randn({3, 16});
  at::Tensor first = at::from_blob(memory.data(), {4, 16});
  first.copy_(at::randn({4, 16}));
  lin->weight.set_data(first);
  first = at::Tensor();
  const at::Tensor before = lin(x);  // fills the cache
  lin->weight.set_data(at::randn({4, 16}));
  at::Tensor third = at::from_blob(memory.data(), {4, 16});
  third.copy_(at::randn({4, 16}));
  lin->weight.set_data(third);
  ASSERT_EQ(lin->weight.data_ptr(), static_cast<void*>(memory.data()));
  const QParams qp = lin->weight_quantizer()->qparams(lin->weight);
  const at::Tensor after = lin(x);
  EXPECT_FALSE(at::equal(after, before));
  EXPECT_TRUE(at::equal(after, at::linear(x, fake_quantize(lin->weight, qp), lin->bias)));
}

TEST(Freeze, FrozenConvRunsTheIntegerKernelAndMatchesFakeQuant) {
  // W8A8 and W4A8 (signed and unsigned int4), Conv2d with stride/padding/dilation and Conv1d:
  // frozen == fake-quant within the tolerance of the Linear test above, ReLU fused, no fallback.
  for (const QType& qt : {qint8, qint4, quint4}) {
    for (bool one_d : {false, true}) {
      at::manual_seed(21);
      std::shared_ptr<QuantizableLayer> layer;
      std::function<at::Tensor(const at::Tensor&)> run, run_relu;
      at::Tensor x, calib_x;
      if (one_d) {
        nn::Conv1d c(torch::nn::Conv1dOptions(6, 10, 5).padding(2).stride(2));
        layer = c.ptr();
        run = [p = c.ptr()](const at::Tensor& t) { return p->forward(t); };
        run_relu = [p = c.ptr()](const at::Tensor& t) { return p->forward_relu(t); };
        x = at::randn({3, 6, 33});
        calib_x = at::randn({8, 6, 33});
      } else {
        nn::Conv2d c(torch::nn::Conv2dOptions(5, 12, {3, 2}).padding({1, 2}).dilation({2, 1}));
        layer = c.ptr();
        run = [p = c.ptr()](const at::Tensor& t) { return p->forward(t); };
        run_relu = [p = c.ptr()](const at::Tensor& t) { return p->forward_relu(t); };
        x = at::randn({2, 5, 9, 7});
        calib_x = at::randn({8, 5, 9, 7});
      }
      Scheme s(qt);
      s.weight_granularity = Granularity::kPerChannel;  // conv weights are per channel
      s.weight_symmetric = qt != quint4;
      s.activations = ActivationMode::kStatic;
      s.observer = "minmax";
      torch::nn::Module& m = layer->module();
      m.eval();
      quantize(m, s);
      {
        Calibration calib(m);
        at::NoGradGuard g;
        run(calib_x);
      }
      at::Tensor y_fq;
      {
        at::NoGradGuard g;
        y_fq = run(x);
      }
      freeze(m);
      const std::string what = std::string(qt.name) + (one_d ? " Conv1d" : " Conv2d") + " kernel " +
                               layer->report().kernel + " fallback '" + layer->report().fallback_reason + "'";
      EXPECT_EQ(layer->report().kernel.rfind("im2col_s8+", 0), 0u) << what;
      // The convolution's kernel table says whether (and from how many output pixels) oneDNN runs.
      const int64_t K = layer->frozen_weight().numel() / layer->frozen_weight().shape[0];
      const kernels::ConvChoice table =
          kernels::choose_conv_kernel(qt != qint8, usable_isa(), qt == qint8 ? K : kernels::round_up(K, kernels::kS4BlockK));
      const bool onednn = table.large_rows > 0;
      EXPECT_EQ(layer->report().kernel.find("| " + table.large_kernel.kernel + " from " +
                                            std::to_string(table.large_rows) + " output pixels") != std::string::npos,
                onednn)
          << what;
      EXPECT_EQ(layer->report().kernel.rfind(table.kernel.kernel, 0), 0u) << what;
      if (onednn) {
        // A batch with at least large_rows output pixels runs oneDNN: the same values as im2col.
        const at::Tensor big = one_d ? at::randn({128, 6, 70}) : at::randn({16, 5, 20, 18});
        at::Tensor y_big_fq;
        {
          // The fake-quant forward of the same frozen weights: the frozen layer's float copy.
          at::NoGradGuard g;
          const at::Tensor w = layer->frozen_weight().dequantize();
          const at::Tensor xq = fake_quantize(big, layer->input_quantizer()->qparams());
          const at::Tensor b = layer->module().named_parameters()["bias"];
          y_big_fq = one_d ? at::conv1d(xq, w, b, 2, 2) : at::conv2d(xq, w, b, 1, {1, 2}, {2, 1});
        }
        const at::Tensor y_big = run(big);
        EXPECT_LE(rel_error(y_big, y_big_fq), 1e-5) << what << " (large input)";
      }
      EXPECT_TRUE(layer->report().fallback_reason.empty()) << what;
      const at::Tensor y = run(x);
      ASSERT_EQ(y.sizes(), y_fq.sizes()) << what;
      EXPECT_LE(rel_error(y, y_fq), 1e-5) << what;
      EXPECT_TRUE(at::equal(run_relu(x), at::relu(y))) << what;
      // Conv2d leaves channels-last memory (the GEMM's rows); Conv1d a contiguous tensor.
      EXPECT_TRUE(one_d ? y.is_contiguous() : y.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
      // Unbatched input and a channels-last input give the same values.
      EXPECT_TRUE(at::equal(run(x[0]), y[0])) << what;
      if (!one_d) {
        EXPECT_TRUE(at::equal(run(x.contiguous(at::MemoryFormat::ChannelsLast)), y)) << what;
      }
      // The frozen weight rebuilt from the packed copy re-installs into a fresh layer.
      const QuantizedTensor fw = layer->frozen_weight();
      EXPECT_TRUE(at::equal(fw.dequantize(), layer->frozen_weight().dequantize())) << what;
      EXPECT_EQ(fw.shape, (one_d ? std::vector<int64_t>{10, 6, 5} : std::vector<int64_t>{12, 5, 3, 2})) << what;
    }
  }
  // NaN input is a clear error, not garbage codes.
  nn::Conv2d c = frozen_w8a8_conv2d(torch::nn::Conv2dOptions(2, 3, 3), at::randn({2, 2, 5, 5}));
  at::Tensor bad = at::randn({1, 2, 5, 5});
  bad[0][1][2][3] = std::nan("");
  EXPECT_THROW(c(bad), Error);
}

TEST(Freeze, FrozenConvStateRebuildsAFreshLayer) {
  at::manual_seed(22);
  nn::Conv2d a = frozen_w8a8_conv2d(torch::nn::Conv2dOptions(4, 6, 3).padding(1), at::randn({4, 4, 8, 8}));
  const at::Tensor x = at::randn({2, 4, 8, 8});
  const at::Tensor y = a(x);
  nn::Conv2d b(torch::nn::Conv2dOptions(4, 6, 3).padding(1));
  b->attach("b", a->scheme());
  b->input_quantizer()->set_qparams(a->input_quantizer()->qparams());
  {
    at::NoGradGuard g;
    b->bias.copy_(a->frozen_bias());
  }
  b->install_frozen(a->frozen_weight());
  EXPECT_TRUE(at::equal(b(x), y));
  EXPECT_EQ(b->report().kernel, a->report().kernel);
}

TEST(Freeze, FrozenStateRebuildsAFreshLayerWithoutItsFloatWeight) {
  at::manual_seed(10);
  for (const QType& qt : {qint8, qint4, qint2}) {
    nn::Linear a(64, 32);
    Scheme s(qt);
    s.group_size = 32;
    s.activations = qt == qint2 ? ActivationMode::kNone : ActivationMode::kStatic;
    s.observer = "minmax";
    quantize(a, s);
    if (s.activations == ActivationMode::kStatic) {
      Calibration c(a);
      a(at::randn({16, 64}));
    }
    freeze(a);
    const at::Tensor x = at::randn({3, 64});
    const at::Tensor y = a(x);

    nn::Linear b(64, 32);  // fresh float layer, different random weights
    b->attach("b", a->scheme());
    if (s.activations == ActivationMode::kStatic) b->input_quantizer()->set_qparams(a->input_quantizer()->qparams());
    {
      at::NoGradGuard g;
      b->bias.copy_(a->frozen_bias());
    }
    b->install_frozen(a->frozen_weight());
    EXPECT_TRUE(at::equal(b(x), y)) << qt.name;
    EXPECT_EQ(b->report().kernel, a->report().kernel) << qt.name;
  }
}

// A frozen Linear's forward is its packed weight's: packed again from frozen_weight() by
// pack_linear, every format runs the layer's forward bit for bit, gives the frozen weight back
// bit for bit and is already where a move to the CPU would put it.
TEST(PackedWeight, EveryLinearFormatRunsTheLayersForwardAndGivesBackItsWeight) {
  struct Case {
    QType w;
    ActivationMode act;
    LinearPath path;
  };
  const std::vector<Case> cases{
      {qint8, ActivationMode::kDynamicPerToken, LinearPath::kS8Dynamic},
      {qint8, ActivationMode::kStatic, LinearPath::kS8Static},
      {qint8, ActivationMode::kNone, LinearPath::kS8WeightOnly},
      {qint4, ActivationMode::kDynamicPerToken, LinearPath::kS4Dynamic},
      {qint4, ActivationMode::kStatic, LinearPath::kS4Static},
      {qint4, ActivationMode::kNone, LinearPath::kS4WeightOnly},
      {qkmeans4, ActivationMode::kNone, LinearPath::kLutWeightOnly},
      {qfloat8_e4m3fn, ActivationMode::kNone, LinearPath::kDequant},
  };
  for (const Case& c : cases) {
    at::manual_seed(31);
    nn::Linear lin(64, 48);
    lin->eval();
    Scheme s(c.w);
    s.group_size = 32;
    s.activations = c.act;
    s.observer = "minmax";
    quantize(lin, s);
    if (c.act == ActivationMode::kStatic) {
      Calibration calib(lin);
      lin(at::randn({32, 64}));
    }
    freeze(lin);
    const std::string what = std::string(c.w.name) + " " + to_string(c.act);
    ASSERT_EQ(lin->plan().path, c.path) << what;
    const QuantizedTensor fw = lin->frozen_weight();
    const bool dequant = c.path == LinearPath::kDequant;
    const float act_scale =
        c.act == ActivationMode::kStatic ? lin->input_quantizer()->qparams().scale.item<float>() : 0.0f;
    const nn::PackedWeightPtr packed =
        nn::pack_linear(fw, c.path, dequant ? at::Tensor() : lin->frozen_bias(), act_scale, "lin");
    nn::FrozenInput in;
    in.quantizer = lin->input_quantizer();
    if (dequant) in.layer_bias = lin->frozen_bias();
    for (const int64_t M : {1, 40}) {
      const at::Tensor x = at::randn({M, 64});
      EXPECT_TRUE(at::equal(packed->forward(x, in), lin(x))) << what << " M=" << M;
    }
    const QuantizedTensor back = packed->weight();
    // Codebook grids have no scale or zero point, the others no codebook.
    const auto same = [](const at::Tensor& a, const at::Tensor& b) {
      return a.defined() == b.defined() && (!a.defined() || at::equal(a, b));
    };
    EXPECT_TRUE(same(back.data, fw.data)) << what;
    EXPECT_TRUE(same(back.scale, fw.scale)) << what;
    EXPECT_TRUE(same(back.zero_point, fw.zero_point)) << what;
    EXPECT_TRUE(same(back.codebook, fw.codebook)) << what;
    EXPECT_EQ(packed->bias().defined(), !dequant) << what;
    EXPECT_EQ(packed->path(), c.path) << what;
    EXPECT_TRUE(packed->device().is_cpu()) << what;
    EXPECT_EQ(packed->to(at::kCPU).get(), packed.get()) << what;
    EXPECT_GT(packed->bytes(), 0) << what;
  }
}

// The integer convolution formats: pack_conv of a frozen Conv2d's weight runs its forward_relu
// bit for bit, gives the frozen weight back bit for bit, stays on the CPU and refuses CUDA.
TEST(PackedWeight, IntegerConvolutionFormatsRunTheLayersForwardAndGiveBackTheirWeight) {
  for (const QType& qt : {qint8, qint4}) {
    at::manual_seed(23);
    nn::Conv2d c(torch::nn::Conv2dOptions(5, 12, 3).padding(1));
    c->eval();
    Scheme s(qt);
    s.weight_granularity = Granularity::kPerChannel;
    s.weight_symmetric = true;
    s.activations = ActivationMode::kStatic;
    s.observer = "minmax";
    quantize(c, s);
    {
      Calibration calib(c);
      c(at::randn({4, 5, 8, 8}));
    }
    freeze(c);
    const LinearPath path = c->plan().path;
    ASSERT_EQ(path, qt == qint8 ? LinearPath::kS8Static : LinearPath::kS4Static) << qt.name;
    const QuantizedTensor fw = c->frozen_weight();
    std::string onednn_missing;
    const nn::PackedWeightPtr packed =
        nn::pack_conv(fw, path, nn::conv_shape_of<2>(c->options), c->input_quantizer()->qparams().scale.item<float>(),
                      /*onednn=*/false, "c", &onednn_missing);
    nn::FrozenInput in;
    in.quantizer = c->input_quantizer();
    in.layer_bias = c->frozen_bias();
    in.relu = true;
    const at::Tensor x = at::randn({2, 5, 8, 8});
    EXPECT_TRUE(at::equal(packed->forward(x, in), c->forward_relu(x))) << qt.name;
    const QuantizedTensor back = packed->weight();
    EXPECT_TRUE(at::equal(back.data, fw.data)) << qt.name;
    EXPECT_TRUE(at::equal(back.scale, fw.scale)) << qt.name;
    EXPECT_FALSE(packed->bias().defined()) << qt.name;
    EXPECT_TRUE(onednn_missing.empty()) << qt.name;
    EXPECT_EQ(packed->to(at::kCPU).get(), packed.get()) << qt.name;
    EXPECT_THROW(packed->to(at::Device(at::kCUDA, 0)), Error) << qt.name;
  }
}

// The Embedding table formats: every lookup (int8 and int4 / int3 row gathers, dequantize per
// call; int8 lookups of up to 16 rows in one loop, asymmetric and fp16-scaled tables too) is
// at::embedding of the dequantized table, bit for bit; to(any device) is the same CPU table.
TEST(PackedWeight, EmbeddingTablesLookUpWhatTheDequantizedTableSaysForAnyDevice) {
  struct Case {
    QType qt;
    Granularity g;
    nn::EmbeddingLookup lookup;
    int64_t dim = 32;
    bool symmetric = true, half_scales = false;
  };
  for (const Case& k : {Case{qint8, Granularity::kPerChannel, nn::EmbeddingLookup::kGatherS8},
                        Case{qint8, Granularity::kPerChannel, nn::EmbeddingLookup::kGatherS8, 32, false},
                        Case{qint8, Granularity::kPerGroup, nn::EmbeddingLookup::kGatherS8, 32, false},
                        Case{qint8, Granularity::kPerGroup, nn::EmbeddingLookup::kGatherS8, 32, true, true},
                        Case{qint4, Granularity::kPerGroup, nn::EmbeddingLookup::kGatherNibbles},
                        Case{quint4, Granularity::kPerChannel, nn::EmbeddingLookup::kGatherNibbles},
                        Case{qint3, Granularity::kPerGroup, nn::EmbeddingLookup::kGatherNibbles},
                        Case{qint4, Granularity::kPerChannel, nn::EmbeddingLookup::kDequantize, 33},
                        Case{qint4, Granularity::kPerTensor, nn::EmbeddingLookup::kDequantize}}) {
    at::manual_seed(29);
    nn::Embedding emb(40, k.dim);
    Scheme s(k.qt);
    s.weight_granularity = k.g;
    s.group_size = 16;
    s.weight_symmetric = k.symmetric;
    quantize(emb, s);
    freeze(emb);
    QuantizedTensor fw = emb->frozen_weight();
    if (k.half_scales) fw.scale = fw.scale.to(at::kHalf);  // a GGUF Q8_0 table's fp16 block scales
    ASSERT_EQ(nn::embedding_lookup(fw.spec, k.dim), k.lookup) << k.qt.name;
    if (!k.symmetric) {
      ASSERT_TRUE(at::ne(fw.zero_point, 0).any().item<bool>()) << k.qt.name;
    }
    const nn::PackedWeightPtr packed = nn::pack_embedding(fw, "emb");
    for (const at::Tensor& idx : {at::randint(0, 40, {3, 5}), at::randint(0, 40, {1, 1}), at::randint(0, 40, {4, 5})}) {
      const at::Tensor want = at::embedding(fw.dequantize(), idx);
      EXPECT_TRUE(at::equal(packed->forward(idx, {}), want)) << k.qt.name << " " << idx.sizes();
      if (!k.half_scales) {
        EXPECT_TRUE(at::equal(emb(idx), want)) << k.qt.name;
      }
    }
    if (k.lookup == nn::EmbeddingLookup::kGatherS8) {  // an index outside the table, named
      EXPECT_THROW(packed->forward(at::tensor({int64_t{3}, int64_t{40}}), {}), Error) << k.qt.name;
      EXPECT_THROW(packed->forward(at::tensor({int64_t{-1}}), {}), Error) << k.qt.name;
    }
    EXPECT_EQ(packed->to(at::kCPU).get(), packed.get()) << k.qt.name;
    EXPECT_EQ(packed->to(at::Device(at::kCUDA, 0)).get(), packed.get()) << k.qt.name;
    EXPECT_TRUE(packed->device().is_cpu()) << k.qt.name;
  }
}

TEST(Quantizer, FourBitScalesRoundUpToTheNextFloat16) {
  const at::Tensor s = at::tensor({0.1f, 0.5f, 1e-3f, 3.0e4f, 1.1920929e-07f});
  const at::Tensor h = round_scale_up_to_half(s);
  EXPECT_TRUE(at::equal(h, h.to(at::kHalf).to(at::kFloat)));  // exactly representable
  EXPECT_TRUE(at::ge(h, s).all().item<bool>());               // never smaller
  EXPECT_EQ(h[1].item<float>(), 0.5f);                        // exact values stay
  // The next float16 below would be smaller than the scale.
  const at::Tensor below = (h.to(at::kHalf).view(at::kShort) - 1).view(at::kHalf).to(at::kFloat);
  EXPECT_TRUE(at::lt(below, s).all().item<bool>());
  EXPECT_THROW(round_scale_up_to_half(at::tensor({1e6f})), Error);
}

TEST(Qat, ObserversAndBatchNormFreezeAfterTheConfiguredSteps) {
  struct Net : torch::nn::Module {
    Net() : fc(register_module("fc", nn::Linear(4, 4))), bn(register_module("bn", torch::nn::BatchNorm1d(4))) {}
    at::Tensor forward(const at::Tensor& x) { return bn(fc(x)); }
    nn::Linear fc;
    torch::nn::BatchNorm1d bn;
  };
  auto net = std::make_shared<Net>();
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.observer = "moving_average_minmax";
  quantize(*net, s);
  {
    Calibration c(*net);
    net->forward(at::randn({8, 4}));
  }
  QatController qat(*net, QatOptions{/*freeze_observers_after=*/2, /*freeze_bn_after=*/3});
  qat.begin_epoch();
  std::vector<float> scales;
  for (int step = 0; step < 5; ++step) {
    net->forward(at::randn({8, 4}) * (step + 1));  // growing range moves the moving average
    qat.step();
    scales.push_back(net->fc->input_quantizer()->qparams().scale.item<float>());
  }
  EXPECT_NE(scales[0], scales[1]);  // observing
  EXPECT_EQ(scales[2], scales[3]);  // frozen after 2 steps
  EXPECT_EQ(scales[3], scales[4]);
  EXPECT_FALSE(net->bn->is_training());
  EXPECT_TRUE(net->fc->is_training());
}

TEST(ModelSize, EstimateMemoryCountsPackedBitsAndScales) {
  EXPECT_EQ(estimate_memory(1000, qint8, 0, 10), 1000 + 10 * 4);
  EXPECT_EQ(estimate_memory(1024, qint4, 128), 512 + 8 * 4);
  EXPECT_EQ(estimate_memory(1024, qint4, 128, 0, /*affine=*/true), 512 + 8 * 5);
  EXPECT_EQ(estimate_memory(10, qint2), 3 + 4);
  EXPECT_EQ(estimate_memory(7, qfloat8_e4m3fn), 7 + 4);
}

// The LibTorch twins' forward is not virtual: were a qforge layer convertible to a reference of its
// twin, a call through that reference would silently run in float. The twin is a private base
// where LibTorch allows it (1.x; framework/nn/twin.h says why 2.x cannot).
#if QFORGE_TWIN_IS_PRIVATE
static_assert(!std::is_convertible_v<nn::LinearImpl*, torch::nn::LinearImpl*>);
static_assert(!std::is_convertible_v<nn::Conv1dImpl*, torch::nn::Conv1dImpl*>);
static_assert(!std::is_convertible_v<nn::Conv2dImpl*, torch::nn::Conv2dImpl*>);
static_assert(!std::is_convertible_v<nn::EmbeddingImpl*, torch::nn::EmbeddingImpl*>);
static_assert(!std::is_convertible_v<nn::LayerNormImpl*, torch::nn::LayerNormImpl*>);
#endif
static_assert(std::is_convertible_v<nn::LinearImpl*, torch::nn::Module*>);

TEST(Layers, TwinBaseIsPrivateYetModuleWalksAndHoldersWork) {
  // Through Module (the only public LibTorch base) the walk still finds the layer and its
  // quantized forward runs.
  torch::nn::Sequential seq(nn::Linear(8, 4));
  quantize(*seq.ptr(), Scheme(qint8));
  const auto layers = quantizable_layers(*seq.ptr());
  ASSERT_EQ(layers.size(), 1u);
  EXPECT_EQ(layers[0].first, "0");
  const at::Tensor x = at::randn({2, 8});
  auto lin = seq->ptr<nn::LinearImpl>(0);
  const at::Tensor fq = lin->forward(x);
  const at::Tensor fl = at::linear(x, lin->weight, lin->bias);
  EXPECT_FALSE(at::equal(fq, fl));  // int8 fake-quant differs from float
  EXPECT_TRUE(at::equal(seq->forward(x), fq));
  // A clone would be the float twin without quantizers: refused, naming the layer.
  try {
    seq->clone();
    FAIL() << "clone of a qforge layer succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("0 (Linear): clone() is not supported"), std::string::npos) << e.what();
  }
}

TEST(Freeze, FrozenMatMulRunsTheIntegerKernelAndMatchesFakeQuant) {
  // Attention-shaped operands: a [B, H, M, K] x b [B, H, K, N], and a shared b [K, N] whose batch
  // dimensions broadcast. Static (per-tensor, min/max) and dynamic (a per row, b per column).
  for (ActivationMode mode : {ActivationMode::kStatic, ActivationMode::kDynamicPerToken}) {
    for (bool shared_b : {false, true}) {
      at::manual_seed(31);
      nn::MatMul mm;
      Scheme s;
      s.weights = std::nullopt;
      s.activations = mode;
      s.observer = "minmax";
      quantize(mm, s);
      const at::Tensor a = at::randn({2, 3, 7, 20});
      const at::Tensor b = shared_b ? at::randn({20, 9}) : at::randn({2, 3, 20, 9});
      if (mode == ActivationMode::kStatic) {
        Calibration calib(mm);
        at::NoGradGuard g;
        mm(a * 1.1, b * 1.1);
      }
      at::Tensor y_fq;
      {
        at::NoGradGuard g;
        y_fq = mm(a, b);
      }
      freeze(mm);
      const std::string what = std::string(to_string(mode)) + (shared_b ? " shared b" : "") + " kernel " +
                               mm->report().kernel + " fallback '" + mm->report().fallback_reason + "'";
      EXPECT_EQ(mm->report().kernel.rfind("bmm_s8s8f32+", 0), 0u) << what;
      EXPECT_TRUE(mm->report().fallback_reason.empty()) << what;
      const at::Tensor y = mm(a, b);
      ASSERT_EQ(y.sizes(), y_fq.sizes()) << what;
      EXPECT_LE(rel_error(y, y_fq), 1e-5) << what;

      // Bit for bit: the exact int32 product of the codes, then (acc * s_b) * s_a in float.
      at::Tensor qa, qb, sa, sb;
      const at::Tensor bb = b.expand({2, 3, 20, 9});
      if (mode == ActivationMode::kStatic) {
        const QParams pa = mm->input_quantizer()->qparams(), pb = mm->other_quantizer()->qparams();
        qa = quantize_to_int8(a, pa);
        qb = quantize_to_int8(bb, pb);
        sa = pa.scale.to(at::kFloat).reshape({});
        sb = pb.scale.to(at::kFloat).reshape({});
      } else {
        const at::Tensor amax_a = a.abs().amax(-1, true), amax_b = bb.abs().amax(-2, true);
        sa = at::where(amax_a > 0, amax_a / 127.0f, at::ones_like(amax_a));
        sb = at::where(amax_b > 0, amax_b / 127.0f, at::ones_like(amax_b));
        qa = at::clamp(at::round(a * at::reciprocal(sa)), -127, 127).to(at::kChar);
        qb = at::clamp(at::round(bb * at::reciprocal(sb)), -127, 127).to(at::kChar);
      }
      const at::Tensor acc = at::matmul(qa.to(at::kDouble), qb.to(at::kDouble)).to(at::kFloat);  // exact
      EXPECT_TRUE(at::equal(y, acc * sb * sa)) << what;
    }
  }
}

TEST(Freeze, MatMulDynamicScalesRunAlongTheContractedDimension) {
  // One key token a thousand times louder than the rest: per-column scales of K^T keep the other
  // tokens' scores accurate (per-row scales over the token axis would flatten them to 0).
  at::manual_seed(32);
  nn::MatMul mm;
  Scheme s;
  s.weights = std::nullopt;
  s.activations = ActivationMode::kDynamicPerToken;
  quantize(mm, s);
  const at::Tensor q = at::randn({1, 4, 16});
  at::Tensor k_t = at::randn({1, 16, 8});
  k_t.select(2, 0).mul_(1000);
  at::NoGradGuard g;
  const at::Tensor ref = at::matmul(q, k_t);
  const at::Tensor quiet = at::arange(1, 8);
  EXPECT_LT(rel_error(mm(q, k_t).index_select(2, quiet), ref.index_select(2, quiet)), 0.05);
  freeze(mm);
  EXPECT_LT(rel_error(mm(q, k_t).index_select(2, quiet), ref.index_select(2, quiet)), 0.05);
}

TEST(Freeze, MatMulWithAffineStaticOperandsReportsItsFallback) {
  nn::MatMul mm;
  Scheme s;
  s.weights = std::nullopt;
  s.activations = ActivationMode::kStatic;
  s.activation_symmetric = false;
  quantize(mm, s);
  const at::Tensor a = at::randn({2, 5, 8}), b = at::randn({2, 8, 3});
  {
    Calibration calib(mm);
    at::NoGradGuard g;
    mm(a, b);
  }
  at::Tensor y_fq;
  {
    at::NoGradGuard g;
    y_fq = mm(a, b);
  }
  freeze(mm);
  EXPECT_EQ(mm->report().kernel, "fake_quant+at::matmul");
  EXPECT_NE(mm->report().fallback_reason.find("affine static activations"), std::string::npos)
      << mm->report().fallback_reason;
  EXPECT_TRUE(at::equal(mm(a, b), y_fq));
}
