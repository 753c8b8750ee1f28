// fake_quantize against PyTorch golden vectors and the ATen ops in the same process.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "fake_quant/fake_quantize.h"
#include "framework/core/error.h"
#include "tests/golden/golden.h"

using namespace qforge;
using golden::golden_tensor;

namespace {

QParams per_tensor_qparams(const QType& qt, float scale, int zp) {
  QSpec s;
  s.qtype = qt;
  return make_qparams(s, at::full({}, scale), at::full({}, zp, at::kInt));
}

// y and dX (with autograd) for x under qp.
std::pair<at::Tensor, at::Tensor> forward_backward(const at::Tensor& x, const QParams& qp, const at::Tensor& dy) {
  at::Tensor xr = x.clone().set_requires_grad(true);
  at::Tensor y = fake_quantize(xr, qp);
  y.backward(dy);
  return {y.detach(), xr.grad()};
}

}  // namespace

TEST(FakeQuantize, PerTensorMatchesPyTorchGoldenBitExactly) {
  const auto g = golden::load_golden("fake_quant.json");
  ASSERT_FALSE(g.empty());
  for (const auto& c : g.at("per_tensor")) {
    const at::Tensor x = golden_tensor(c.at("x")), dy = golden_tensor(c.at("dy"));
    const at::Tensor y = qforge::fake_quantize_per_tensor_affine(
        x.clone().set_requires_grad(false), c.at("scale").get<double>(), c.at("zero_point").get<int64_t>(),
        c.at("quant_min").get<int64_t>(), c.at("quant_max").get<int64_t>());
    const at::Tensor ey = golden_tensor(c.at("y")), edx = golden_tensor(c.at("dx"));
    EXPECT_TRUE(golden::bit_equal(y, ey)) << c.at("name") << ": " << golden::describe_mismatch(y, ey);
    at::Tensor xr = x.clone().set_requires_grad(true);
    at::Tensor y2 = qforge::fake_quantize_per_tensor_affine(xr, c.at("scale").get<double>(), c.at("zero_point").get<int64_t>(),
                                                    c.at("quant_min").get<int64_t>(), c.at("quant_max").get<int64_t>());
    y2.backward(dy);
    EXPECT_TRUE(golden::bit_equal(xr.grad(), edx)) << c.at("name") << " dx: " << golden::describe_mismatch(xr.grad(), edx);
  }
}

TEST(FakeQuantize, PerChannelMatchesPyTorchGoldenBitExactly) {
  const auto g = golden::load_golden("fake_quant.json");
  ASSERT_FALSE(g.empty());
  for (const auto& c : g.at("per_channel")) {
    const at::Tensor x = golden_tensor(c.at("x")), dy = golden_tensor(c.at("dy"));
    at::Tensor xr = x.clone().set_requires_grad(true);
    at::Tensor y = qforge::fake_quantize_per_channel_affine(xr, golden_tensor(c.at("scale")), golden_tensor(c.at("zero_point")),
                                                    c.at("axis").get<int64_t>(), c.at("quant_min").get<int64_t>(),
                                                    c.at("quant_max").get<int64_t>());
    y.backward(dy);
    const at::Tensor ey = golden_tensor(c.at("y")), edx = golden_tensor(c.at("dx"));
    EXPECT_TRUE(golden::bit_equal(y.detach(), ey)) << c.at("name") << ": " << golden::describe_mismatch(y, ey);
    EXPECT_TRUE(golden::bit_equal(xr.grad(), edx)) << c.at("name") << " dx: " << golden::describe_mismatch(xr.grad(), edx);
  }
}

// Shapes that break kernels: 1-10, multiples of 16, powers of two +-1; every integer qtype.
TEST(FakeQuantize, PerTensorEqualsATenOpOverShapeSweep) {
  const std::vector<int64_t> sizes{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65,
                                   127, 128, 129, 255, 256, 257, 1023, 1024, 1025, 70001};
  at::manual_seed(3);
  for (const QType& qt : {qint8, quint8, qint4, quint4, qint2}) {
    for (int64_t n : sizes) {
      const at::Tensor x = at::randn({n}) * 3.0;
      const float scale = 0.037f;
      const int zp = qt.is_signed ? 0 : static_cast<int>(qt.quant_max / 3);
      const at::Tensor dy = at::randn({n});
      auto [y, dx] = forward_backward(x, per_tensor_qparams(qt, scale, zp), dy);
      at::Tensor xr = x.clone().set_requires_grad(true);
      at::Tensor ey = at::fake_quantize_per_tensor_affine(xr, scale, zp, qt.quant_min, qt.quant_max);
      ey.backward(dy);
      ASSERT_TRUE(golden::bit_equal(y, ey.detach())) << qt.name << " n=" << n << ": " << golden::describe_mismatch(y, ey);
      ASSERT_TRUE(golden::bit_equal(dx, xr.grad())) << qt.name << " n=" << n;
    }
  }
}

TEST(FakeQuantize, PerChannelEqualsATenOpForEveryAxis) {
  at::manual_seed(4);
  for (const auto& shape : std::vector<std::vector<int64_t>>{{7, 33}, {16, 3, 5}, {2, 3, 4, 17}, {5, 1}, {1, 64}}) {
    for (int64_t axis = 0; axis < static_cast<int64_t>(shape.size()); ++axis) {
      const at::Tensor x = at::randn(shape);
      const int64_t C = shape[axis];
      const at::Tensor scale = at::rand({C}) * 0.05 + 0.01;
      const at::Tensor zp = at::randint(-20, 20, {C}, at::kInt);
      QSpec s;
      s.granularity = Granularity::kPerChannel;
      s.axis = axis;
      const at::Tensor y = fake_quantize_forward(x, make_qparams(s, scale, zp));
      const at::Tensor ey = at::fake_quantize_per_channel_affine(x, scale, zp, axis, -128, 127);
      ASSERT_TRUE(golden::bit_equal(y, ey)) << "shape " << at::IntArrayRef(shape) << " axis " << axis;
    }
  }
}

TEST(FakeQuantize, PerGroupEqualsPerChannelOnGroupRows) {
  at::manual_seed(5);
  const at::Tensor w = at::randn({6, 64});
  QSpec s;
  s.qtype = qint4;
  s.symmetric = true;
  s.granularity = Granularity::kPerGroup;
  s.group_size = 16;
  const at::Tensor amax = w.reshape({6, 4, 16}).abs().amax(-1);
  const QParams qp = calculate_qparams(-amax, amax, s);
  EXPECT_EQ(qp.scale.sizes(), (std::vector<int64_t>{6, 4}));
  const at::Tensor y = fake_quantize_forward(w, qp);
  const at::Tensor ey = at::fake_quantize_per_channel_affine(w.reshape({24, 16}), qp.scale.flatten(),
                                                             qp.zero_point.flatten(), 0, -8, 7).reshape({6, 64});
  EXPECT_TRUE(golden::bit_equal(y, ey)) << golden::describe_mismatch(y, ey);
}

TEST(FakeQuantize, NarrowRangeNeverProducesQuantMin) {
  QSpec s;
  s.symmetric = true;
  s.narrow_range = true;
  const at::Tensor x = at::linspace(-10, 10, 1001);
  const QParams qp = calculate_qparams(x.min(), x.max(), s);
  const at::Tensor q = at::round(fake_quantize_forward(x * 2, qp) / qp.scale);
  EXPECT_EQ(q.min().item<float>(), -127.0f);
  EXPECT_EQ(q.max().item<float>(), 127.0f);
}

TEST(FakeQuantize, NanMapsToQuantMinWithZeroGradientAsInPyTorch) {
  const at::Tensor x = at::tensor({NAN, 1.0f, -1.0f});
  const QParams qp = per_tensor_qparams(qint8, 0.1f, 0);
  auto [y, mask] = fake_quantize_cachemask(x, qp);
  EXPECT_FLOAT_EQ(y[0].item<float>(), -12.8f);
  EXPECT_FALSE(mask[0].item<bool>());
  EXPECT_TRUE(mask[1].item<bool>());
}

TEST(FakeQuantize, EmptyTensorIsANoOp) {
  const at::Tensor y = fake_quantize(at::empty({0, 4}), per_tensor_qparams(qint8, 0.1f, 0));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{0, 4}));
}

TEST(FakeQuantize, BadInputThrowsClearErrors) {
  const QParams qp = per_tensor_qparams(qint8, 0.1f, 0);
  EXPECT_THROW(fake_quantize(at::ones({3}, at::kInt), qp), Error);
  QSpec s;
  s.granularity = Granularity::kPerChannel;
  s.axis = 1;
  const QParams pc = make_qparams(s, at::full({4}, 0.1f), at::zeros({4}, at::kInt));
  try {
    fake_quantize(at::ones({3, 5}), pc);
    FAIL() << "expected qforge::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[5]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_qparams(QSpec{}, at::full({}, -1.0f), at::zeros({}, at::kInt)), Error);
  EXPECT_THROW(qforge::fake_quantize_per_tensor_affine(at::ones({3}), 0.1, 300, -128, 127), Error);
}

TEST(FakeQuantize, HalfAndDoubleInputsKeepTheirDtype) {
  const QParams qp = per_tensor_qparams(qint8, 0.05f, 0);
  const at::Tensor x = at::randn({100}, at::kDouble);
  const at::Tensor y = fake_quantize(x, qp);
  EXPECT_EQ(y.scalar_type(), at::kDouble);
  EXPECT_TRUE(at::allclose(y.to(at::kFloat), fake_quantize(x.to(at::kFloat), qp)));
}
