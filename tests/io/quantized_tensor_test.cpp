// QuantizedTensor: packing matches the kernels' layout, values and dequantization round-trip for
// every integer qtype and granularity.
#include "framework/api/quantized_tensor.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "framework/core/error.h"
#include "tests/io/io_fixtures.h"
#include "tests/io/io_test_util.h"

namespace qforge::io {
namespace {

struct Case {
  QType qtype;
  Granularity granularity;
  int64_t axis;
  int64_t group_size;
  std::vector<int64_t> shape;
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const QType& qt : {qint8, quint8, qint4, quint4, qint2}) {
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{1, 8}, {3, 5, 8}, {7, 16}, {17, 32}}) {
      cases.push_back({qt, Granularity::kPerTensor, 0, 0, shape});
      cases.push_back({qt, Granularity::kPerChannel, 0, 0, shape});
      cases.push_back({qt, Granularity::kPerChannel, static_cast<int64_t>(shape.size()) - 1, 0, shape});
      cases.push_back({qt, Granularity::kPerGroup, 0, 4, shape});
      cases.push_back({qt, Granularity::kPerGroup, 0, 8, shape});
    }
  }
  return cases;
}

std::string describe(const Case& c) {
  return detail::str_cat(c.qtype.name, " ", to_string(c.granularity), " axis ", c.axis, " group ",
                         c.group_size, " shape ", at::IntArrayRef(c.shape));
}

TEST(QuantizedTensor, ValuesRoundTripForEveryQtypeAndGranularity) {
  for (const Case& c : all_cases()) {
    const at::Tensor v = testing::int_pattern(c.shape, c.qtype.quant_min, c.qtype.quant_max);
    const QParams qp = testing::fixture_qparams(c.qtype, c.granularity, c.axis, c.group_size, c.shape);
    const QuantizedTensor q = pack_quantized(v, qp);
    EXPECT_TRUE(at::equal(q.int_values().to(at::kInt), v)) << describe(c);
    // float = (q - zero_point) * scale, computed independently with explicit broadcasting.
    at::Tensor s = qp.scale, z = qp.zero_point;
    if (c.granularity == Granularity::kPerChannel) {
      std::vector<int64_t> view(c.shape.size(), 1);
      view[c.axis] = c.shape[c.axis];
      s = s.reshape(view);
      z = z.reshape(view);
    } else if (c.granularity == Granularity::kPerGroup) {
      s = s.repeat_interleave(c.group_size, -1);
      z = z.repeat_interleave(c.group_size, -1);
    }
    const at::Tensor expected = (v - z).to(at::kFloat) * s;
    EXPECT_TRUE(at::equal(q.dequantize(), expected)) << describe(c);
  }
}

TEST(QuantizedTensor, SubBytePackingIsLowBitsFirstRowMajor) {
  QParams qp = testing::fixture_qparams(qint4, Granularity::kPerTensor, 0, 0, {3});
  QuantizedTensor q = pack_quantized(at::tensor({1, -2, 7}, at::kInt), qp);
  ASSERT_EQ(q.data.numel(), 2);
  EXPECT_EQ(q.data[0].item<uint8_t>(), 0xE1);  // low nibble 1, high nibble -2 = 0xE
  EXPECT_EQ(q.data[1].item<uint8_t>(), 0x07);  // odd count: unused high nibble is 0
  qp = testing::fixture_qparams(qint2, Granularity::kPerTensor, 0, 0, {5});
  q = pack_quantized(at::tensor({1, -1, 0, -2, 1}, at::kInt), qp);
  ASSERT_EQ(q.data.numel(), 2);
  EXPECT_EQ(q.data[0].item<uint8_t>(), 0x01 | (0x3 << 2) | (0x0 << 4) | (0x2 << 6));
  EXPECT_EQ(q.data[1].item<uint8_t>(), 0x01);
  EXPECT_STREQ(q.packing(), kPackingLowBitsFirst);
}

TEST(QuantizedTensor, QuantizeRoundsHalfToEvenAndClamps) {
  QSpec spec;
  spec.qtype = qint8;
  const QParams qp = make_qparams(spec, at::scalar_tensor(0.5f), at::scalar_tensor(0, at::kInt));
  const QuantizedTensor q = quantize_tensor(at::tensor({0.25f, 0.75f, -0.25f, 1000.0f, -1000.0f}), qp);
  EXPECT_TRUE(at::equal(q.int_values(), at::tensor({0, 2, 0, 127, -128}, at::kChar)));
}

TEST(QuantizedTensor, RejectsOutOfRangeValuesAndFloat8) {
  const QParams qp = testing::fixture_qparams(qint4, Granularity::kPerTensor, 0, 0, {2});
  EXPECT_THROW(pack_quantized(at::tensor({8, 0}, at::kInt), qp), Error);
  QSpec spec;
  spec.qtype = qfloat8_e4m3fn;
  const QParams fp8 = make_qparams(spec, at::scalar_tensor(1.0f), at::scalar_tensor(0, at::kInt));
  EXPECT_THROW(pack_quantized(at::tensor({1, 0}, at::kInt), fp8), Error);
}

TEST(QuantizedTensor, ValidateNamesTheProblem) {
  QuantizedTensor q = testing::fixture_quantized(qint4, Granularity::kPerGroup, 0, 8, {4, 16});
  q.scale = q.scale.reshape({-1});
  try {
    q.validate("ckpt 'w'");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt 'w': scale must be float32 of shape [4, 2]"),
              std::string::npos)
        << e.what();
  }
}

TEST(QuantizedTensor, ValidateRefusesBadScalesZeroPointsAndOverflowingShapes) {
  auto expect_error = [](const QuantizedTensor& q, const std::string& needle) {
    try {
      q.validate("ckpt 'w'");
      FAIL() << "expected an error containing " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ckpt 'w': " + needle), std::string::npos) << e.what();
    }
  };
  const QuantizedTensor good = testing::fixture_quantized(qint8, Granularity::kPerChannel, 0, 0, {4, 16});
  good.validate("ckpt 'w'");
  for (float bad : {NAN, 0.0f, -0.5f, INFINITY}) {
    QuantizedTensor q = good;
    q.scale = good.scale.clone();
    q.scale[1] = bad;
    expect_error(q, "make_qparams: scale must be finite and > 0");
  }
  QuantizedTensor z = good;
  z.zero_point = good.zero_point.clone();
  z.zero_point[2] = 300;
  expect_error(z, "make_qparams: zero_point outside [-128, 127]");
  // 2^32 x 2^32 elements wrap to 0 in int64 arithmetic: the packed length would then "match".
  QuantizedTensor big = testing::fixture_quantized(qint4, Granularity::kPerTensor, 0, 0, {2});
  big.shape = {int64_t{1} << 32, int64_t{1} << 32};
  expect_error(big, "shape [4294967296, 4294967296] has more than 2^48 elements");
}

}  // namespace
}  // namespace qforge::io
