#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "framework/core/error.h"
#include "framework/core/qparams.h"
#include "tests/golden/golden.h"

using namespace qforge;

namespace {
QSpec spec_of(const nlohmann::json& c) {
  QSpec s;
  s.qtype = qtype_from_name(c.at("qtype").get<std::string>());
  s.symmetric = c.at("symmetric").get<bool>();
  s.reduce_range = c.value("reduce_range", false);
  s.granularity = c.at("per_channel").get<bool>() ? Granularity::kPerChannel : Granularity::kPerTensor;
  return s;
}
}  // namespace

// Every case was computed by torch.ao.quantization observers' _calculate_qparams (PyTorch 1.13).
TEST(QParams, MatchesPyTorchCalculateQparamsExactly) {
  const auto g = golden::load_golden("qparams.json");
  ASSERT_FALSE(g.empty());
  int n = 0;
  for (const auto& c : g.at("cases")) {
    const QSpec spec = spec_of(c);
    const at::Tensor mn = golden::golden_tensor(c.at("min")), mx = golden::golden_tensor(c.at("max"));
    const QParams qp = calculate_qparams(mn, mx, spec);
    const at::Tensor es = golden::golden_tensor(c.at("scale")).reshape(qp.scale.sizes());
    const at::Tensor ez = golden::golden_tensor(c.at("zero_point")).reshape(qp.zero_point.sizes());
    EXPECT_TRUE(golden::bit_equal(qp.scale, es))
        << c.at("name") << ": scale " << golden::describe_mismatch(qp.scale, es);
    EXPECT_TRUE(at::equal(qp.zero_point.to(at::kLong), ez.to(at::kLong)))
        << c.at("name") << ": zero_point " << golden::describe_mismatch(qp.zero_point, ez);
    ++n;
  }
  EXPECT_GE(n, 20);
}

TEST(QParams, QuantRangesFollowNarrowAndReduceRange) {
  QSpec s;
  s.qtype = qint8;
  EXPECT_EQ(s.quant_min(), -128);
  s.narrow_range = true;
  EXPECT_EQ(s.quant_min(), -127);
  EXPECT_EQ(s.quant_max(), 127);
  s.narrow_range = false;
  s.reduce_range = true;
  EXPECT_EQ(s.quant_min(), -64);
  EXPECT_EQ(s.quant_max(), 63);
  s.qtype = quint8;
  EXPECT_EQ(s.quant_min(), 0);
  EXPECT_EQ(s.quant_max(), 127);
}

TEST(QParams, ConstantTensorGivesValidNonZeroScale) {
  QSpec s;
  const QParams qp = calculate_qparams(at::full({}, 3.0f), at::full({}, 3.0f), s);
  EXPECT_GT(qp.scale.item<float>(), 0.0f);
  const QParams z = calculate_qparams(at::zeros({}), at::zeros({}), s);
  EXPECT_EQ(z.scale.item<float>(), kScaleEps);
}

TEST(QParams, RejectsNonFiniteOrInvertedRange) {
  QSpec s;
  EXPECT_THROW(calculate_qparams(at::full({}, INFINITY), at::full({}, -INFINITY), s), Error);
  EXPECT_THROW(calculate_qparams(at::full({}, 1.0f), at::full({}, -1.0f), s), Error);
  EXPECT_THROW(calculate_qparams(at::zeros({3}), at::zeros({4}), s), Error);
}

TEST(QParams, PerGroupShapeDividesLastDimension) {
  QSpec s;
  s.granularity = Granularity::kPerGroup;
  s.group_size = 32;
  EXPECT_EQ(qparams_shape(s, {8, 128}), (std::vector<int64_t>{8, 4}));
  EXPECT_THROW(qparams_shape(s, {8, 100}), Error);
  s.group_size = 0;
  EXPECT_THROW(s.validate(), Error);
}

TEST(QParams, Float8ScaleMapsAmaxToLargestFinite) {
  QSpec s;
  s.qtype = qfloat8_e4m3fn;
  const QParams qp = calculate_qparams(at::full({}, -896.0f), at::full({}, 10.0f), s);
  EXPECT_FLOAT_EQ(qp.scale.item<float>(), 2.0f);
  EXPECT_EQ(qp.zero_point.item<int>(), 0);
}

TEST(QSpec, Mxfp4AndNvfp4TakeOnlyTheirBlockSize) {
  for (const QType* q : {&qmxfp4, &qnvfp4}) {
    QSpec s;
    s.qtype = *q;
    s.granularity = Granularity::kPerGroup;
    s.group_size = q->block_size;
    EXPECT_NO_THROW(s.validate()) << q->name;
    s.group_size = 64;
    try {
      s.validate();
      FAIL() << "group_size 64 accepted for " << q->name;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fixed by the format"), std::string::npos) << e.what();
    }
    s.granularity = Granularity::kPerChannel;
    s.group_size = 0;
    EXPECT_THROW(s.validate(), Error) << q->name;
  }
  // Block scales are a function of the values, never of a min/max.
  QSpec s;
  s.qtype = qmxfp4;
  s.granularity = Granularity::kPerGroup;
  s.group_size = 32;
  EXPECT_THROW(calculate_qparams(at::zeros({1}), at::ones({1}), s), Error);
}

// The per-tensor numbers a kernel's setup reads: from the CPU tensor as it is (0-dim, [1], an
// offset view), converted from other dtypes; a zero point that is not an integer is refused.
TEST(QParams, ScaleAndZeroPointValuesOfAPerTensorGrid) {
  QParams qp;
  qp.scale = at::tensor(0.25f);
  qp.zero_point = at::tensor(3, at::kInt);
  EXPECT_EQ(qp.scale_value(), 0.25f);
  EXPECT_EQ(qp.zero_point_value(), 3);
  qp.scale = at::tensor({7.0f, 0.5f}).narrow(0, 1, 1);  // [1], offset into its storage
  qp.zero_point = at::tensor({-4}, at::kLong);
  EXPECT_EQ(qp.scale_value(), 0.5f);
  EXPECT_EQ(qp.zero_point_value(), -4);
  qp.scale = at::tensor(0.125, at::kDouble);
  qp.zero_point = at::tensor(2.0f);
  EXPECT_EQ(qp.scale_value(), 0.125f);
  EXPECT_EQ(qp.zero_point_value(), 2);
  qp.zero_point = at::tensor(0.5f);
  EXPECT_THROW(qp.zero_point_value(), Error);
  qp.scale = at::ones({2});
  EXPECT_THROW(qp.scale_value(), Error);  // per channel: no single value
}
