// Per-head static scales of attention products (Scheme::attention_scales per_head): one scale per
// head along axis -3, calibrated by the per-channel twin of the observer, fake-quantized with the
// per-channel formula, frozen onto bmm_s8s8f32 bit for bit, kept by checkpoints and dumps, and
// refused where they cannot mean anything.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <unistd.h>

#include "framework/api/quantize.h"
#include "framework/io/calibration_io.h"
#include "framework/io/model_io.h"
#include "framework/models/bert.h"
#include "framework/nn/matmul.h"
#include "framework/report/report_json.h"
#include "tests/error_of.h"
#include "tests/onnx/onnx_fixtures.h"

using namespace qforge;
using qforge::testing::error_of;

// A named namespace: the test target is a unity build, whose other files have their own helpers.
namespace attention_scales_test {

namespace fs = std::filesystem;

double relative_error(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / b.norm().item<double>();
}

Scheme matmul_scheme(AttentionScales scales, const std::string& observer = "minmax") {
  Scheme s;
  s.weights = std::nullopt;
  s.activations = ActivationMode::kStatic;
  s.observer = observer;
  s.attention_scales = scales;
  return s;
}

// [B, H, T, D] whose heads span very different ranges: head h is scaled by 4^h.
at::Tensor heads_apart(int64_t B, int64_t H, int64_t T, int64_t D) {
  const at::Tensor gain = at::pow(4.0, at::arange(H, at::kFloat)).view({1, H, 1, 1});
  return at::randn({B, H, T, D}) * gain;
}

// The per-channel fake-quant formula written out: codes clamp(round(x · (1 / s_h)), -127, 127).
at::Tensor codes_per_head(const at::Tensor& x, const at::Tensor& scale) {
  const at::Tensor s = scale.view({1, -1, 1, 1});
  return at::clamp(at::round(x * at::reciprocal(s)), -127, 127);
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("qforge_attn_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace attention_scales_test

using namespace attention_scales_test;

TEST(AttentionScales, PerHeadCalibratesOneScalePerHeadAndFakeQuantizesWithIt) {
  at::manual_seed(3);
  const at::Tensor a = heads_apart(2, 4, 5, 8), b = heads_apart(2, 4, 8, 6);
  at::Tensor y_head, y_tensor;
  for (AttentionScales scales : {AttentionScales::kPerHead, AttentionScales::kPerTensor}) {
    nn::MatMul mm;
    quantize(mm, matmul_scheme(scales));
    {
      Calibration calib(mm);
      at::NoGradGuard g;
      mm(a, b);
    }
    at::NoGradGuard g;
    const at::Tensor y = mm(a, b);
    if (scales == AttentionScales::kPerTensor) {
      y_tensor = y;
      continue;
    }
    y_head = y;
    ASSERT_EQ(mm->input_quantizer()->observer()->kind(), "per_channel_minmax");
    const QParams pa = mm->input_quantizer()->qparams(), pb = mm->other_quantizer()->qparams();
    ASSERT_EQ(pa.scale.sizes(), at::IntArrayRef({4}));
    ASSERT_EQ(pb.scale.sizes(), at::IntArrayRef({4}));
    // PyTorch's symmetric formula on [-127, 127]: scale = max(-min, max) / 127 per head.
    const at::Tensor amax_a = a.abs().amax({0, 2, 3}), amax_b = b.abs().amax({0, 2, 3});
    EXPECT_TRUE(at::allclose(pa.scale, amax_a / 127.0f, 1e-6, 0)) << pa.scale << amax_a / 127.0f;
    EXPECT_TRUE(at::allclose(pb.scale, amax_b / 127.0f, 1e-6, 0)) << pb.scale << amax_b / 127.0f;
    EXPECT_TRUE(at::equal(pa.zero_point, at::zeros({4}, at::kInt)));
    const at::Tensor ref = at::matmul(codes_per_head(a, pa.scale) * pa.scale.view({1, -1, 1, 1}),
                                      codes_per_head(b, pb.scale) * pb.scale.view({1, -1, 1, 1}));
    EXPECT_TRUE(at::equal(y, ref));
    EXPECT_NE(describe(mm).find("per_channel(axis=-3)"), std::string::npos) << describe(mm);
  }
  // One step per head keeps the quiet heads' values: the widest head no longer sets everyone's step.
  const at::Tensor exact = at::matmul(a, b);
  const double e_head = relative_error(y_head.narrow(1, 0, 2), exact.narrow(1, 0, 2));
  const double e_tensor = relative_error(y_tensor.narrow(1, 0, 2), exact.narrow(1, 0, 2));
  EXPECT_LT(e_head * 10, e_tensor) << "quiet heads' error: per head " << e_head << ", per tensor " << e_tensor;
}

TEST(AttentionScales, PerHeadFreezesOntoTheIntegerKernelBitForBit) {
  for (const char* observer : {"minmax", "histogram"}) {
    at::manual_seed(5);
    nn::MatMul mm;
    quantize(mm, matmul_scheme(AttentionScales::kPerHead, observer));
    const at::Tensor a = heads_apart(2, 3, 7, 20), b = heads_apart(2, 3, 20, 9);
    {
      Calibration calib(mm);
      at::NoGradGuard g;
      mm(a * 1.1, b * 1.1);
    }
    // Evaluated beyond the calibrated range (values clamp to ±127) and with b's batch broadcast.
    const at::Tensor a2 = a * 2, b2 = b.narrow(0, 0, 1) * 2;
    at::NoGradGuard g;
    const at::Tensor y_fq = mm(a2, b2);
    freeze(mm);
    const std::string what = std::string(observer) + " kernel " + mm->report().kernel;
    EXPECT_EQ(mm->report().kernel.rfind("bmm_s8s8f32+", 0), 0u) << what;
    EXPECT_TRUE(mm->report().fallback_reason.empty()) << mm->report().fallback_reason;
    const at::Tensor y = mm(a2, b2);
    EXPECT_LE(relative_error(y, y_fq), 1e-5) << what;
    // The exact int32 product of the codes, then (acc · s_b[h]) · s_a[h] in float.
    const QParams pa = mm->input_quantizer()->qparams(), pb = mm->other_quantizer()->qparams();
    const at::Tensor ca = codes_per_head(a2, pa.scale), cb = codes_per_head(b2, pb.scale);
    EXPECT_GT((ca.abs() == 127).sum().item<int64_t>(), 0) << "no code reached the clamp";
    const at::Tensor acc = at::matmul(ca.to(at::kDouble), cb.to(at::kDouble)).to(at::kFloat);
    EXPECT_TRUE(at::equal(y, acc * pb.scale.view({1, -1, 1, 1}) * pa.scale.view({1, -1, 1, 1}))) << what;
    // Another head count than the calibrated one is refused, not read past the scales.
    const std::string e = error_of([&] { mm(at::randn({1, 4, 7, 20}), at::randn({1, 4, 20, 9})); });
    EXPECT_NE(e.find("operands with 4 heads; its per-head scales were calibrated for 3"), std::string::npos) << e;
  }
}

TEST(AttentionScales, PerHeadRefusesOperandsWithoutAHeadsAxisAndSchemesThatCannotMeanIt) {
  nn::MatMul mm;
  quantize(mm, matmul_scheme(AttentionScales::kPerHead));
  // A flattened [batch · heads, tokens, features] product would give each sequence its own scale.
  std::string e = error_of([&] {
    Calibration calib(mm);
    mm(at::randn({6, 5, 8}), at::randn({6, 8, 4}));
  });
  EXPECT_NE(e.find("per-head scales need [batch, heads, tokens, features] operands"), std::string::npos) << e;

  Scheme dynamic = matmul_scheme(AttentionScales::kPerHead);
  dynamic.activations = ActivationMode::kDynamicPerToken;
  nn::MatMul m2;
  e = error_of([&] { quantize(m2, dynamic); });
  EXPECT_NE(e.find("attention_scales per_head"), std::string::npos) << e;
  EXPECT_FALSE(m2->quantized());
  Scheme lsq = matmul_scheme(AttentionScales::kPerHead);
  lsq.activation_lsq = true;
  e = error_of([&] { quantize(m2, lsq); });
  EXPECT_NE(e.find("learned activation steps are per tensor"), std::string::npos) << e;
  EXPECT_FALSE(m2->quantized());

  // A rule overrides the scheme's choice for its layers, either way.
  for (AttentionScales scheme_scales : {AttentionScales::kPerTensor, AttentionScales::kPerHead}) {
    const AttentionScales rule_scales =
        scheme_scales == AttentionScales::kPerHead ? AttentionScales::kPerTensor : AttentionScales::kPerHead;
    Scheme s = matmul_scheme(scheme_scales);
    s.rules.push_back(LayerRule{"*"});
    s.rules.back().attention_scales = rule_scales;
    nn::MatMul m;
    quantize(m, s);
    EXPECT_EQ(m->per_head(), rule_scales == AttentionScales::kPerHead) << to_string(scheme_scales);
  }
}

// A BERT's attention products per head: through save_model / load_model into a fresh float model
// (calibrated and frozen) and through a calibration dump, the same outputs bit for bit.
TEST(AttentionScales, PerHeadBertSurvivesCheckpointsAndDumps) {
  const models::BertConfig c = onnx_testing::tiny_bert_config();  // 2 layers, 4 heads, hidden 32
  TempDir dir;
  auto make = [&] {  // the same float weights each time (load_model replaces them anyway)
    at::manual_seed(11);
    auto m = std::make_shared<models::BertForSequenceClassificationImpl>(c);
    m->eval();
    return m;
  };
  auto a = make();
  const at::Tensor ids = at::randint(c.vocab_size, {3, 10}, at::kLong), mask = at::ones({3, 10}, at::kLong);
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.attention_scales = AttentionScales::kPerHead;
  quantize(*a, s);
  {
    Calibration calib(*a);
    at::NoGradGuard g;
    for (int i = 0; i < 3; ++i) a->forward(at::randint(c.vocab_size, {4, 10}, at::kLong), mask.narrow(0, 0, 1).expand({4, 10}));
  }
  at::NoGradGuard g;
  const at::Tensor y_fq = a->forward(ids, mask);
  const std::string d = describe(*a);
  EXPECT_NE(d.find("qk_matmul"), std::string::npos) << d;
  EXPECT_NE(d.find("per_channel(axis=-3)"), std::string::npos) << d;
  // report.json's activation ranges: one entry per head of each per-head operand.
  const nlohmann::json ranges = report::activation_ranges_json(io::calibration_dump(*a));
  int heads_listed = 0;
  for (const auto& r : ranges)
    if (r.at("path").get<std::string>().find("qk_matmul") != std::string::npos && r.contains("channel")) {
      ++heads_listed;
      EXPECT_EQ(r.at("axis").get<int64_t>(), -3);
      EXPECT_NE(r.at("point").get<std::string>().find(" (head "), std::string::npos) << r.dump();
      EXPECT_TRUE(r.contains("histogram")) << r.dump();
      EXPECT_GT(r.at("max").get<double>(), r.at("min").get<double>()) << r.dump();
    }
  EXPECT_EQ(heads_listed, 2 * 2 * 4);  // 2 layers x 2 operands x 4 heads

  io::save_model(*a, dir.file("calibrated.h5"));
  auto b = make();
  io::load_model(*b, dir.file("calibrated.h5"));
  EXPECT_TRUE(at::equal(b->forward(ids, mask), y_fq));

  io::save_calibration(*a, dir.file("calib.h5"));
  auto cd = make();
  quantize(*cd, s);
  io::load_calibration(*cd, dir.file("calib.h5"));
  EXPECT_TRUE(at::equal(cd->forward(ids, mask), y_fq));

  freeze(*a);
  const at::Tensor y_frozen = a->forward(ids, mask);
  EXPECT_LE(relative_error(y_frozen, y_fq), 1e-4);
  io::save_model(*a, dir.file("frozen.h5"));
  auto f = make();
  io::load_model(*f, dir.file("frozen.h5"));
  EXPECT_TRUE(at::equal(f->forward(ids, mask), y_frozen));
  EXPECT_EQ(describe(*f), describe(*a));
}
