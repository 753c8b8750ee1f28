// LSQ / LSQ+ against PyTorch's learnable fake-quant ops (golden vectors and in-process parity).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "fake_quant/lsq.h"
#include "framework/core/error.h"
#include "tests/golden/golden.h"

using namespace qforge;
using golden::golden_tensor;

namespace {
// dScale / dZeroPoint are sums: PyTorch sums float32 terms pairwise, qforge in double per chunk.
void expect_sum_close(const at::Tensor& a, const at::Tensor& e, const at::Tensor& terms_scale,
                      const std::string& what) {
  const double tol = 2e-5 * terms_scale.item<double>() + 1e-6;
  EXPECT_TRUE(at::allclose(a.to(at::kDouble), e.to(at::kDouble), 1e-4, tol))
      << what << ": " << golden::describe_mismatch(a, e);
}
}  // namespace

TEST(Lsq, LearnableOpsMatchPyTorchGolden) {
  const auto g = golden::load_golden("lsq.json");
  ASSERT_FALSE(g.empty());
  int n = 0;
  for (const auto& c : g.at("cases")) {
    const at::Tensor x = golden_tensor(c.at("x")), dy = golden_tensor(c.at("dy"));
    at::Tensor xr = x.clone().set_requires_grad(true);
    at::Tensor s = golden_tensor(c.at("scale")).set_requires_grad(true);
    at::Tensor z = golden_tensor(c.at("zero_point")).set_requires_grad(true);
    const int64_t qmin = c.at("quant_min"), qmax = c.at("quant_max");
    const double gf = c.at("grad_factor");
    at::Tensor y = c.at("per_channel").get<bool>()
                       ? fake_quantize_learnable_per_channel_affine(xr, s, z, c.at("axis"), qmin, qmax, gf)
                       : fake_quantize_learnable_per_tensor_affine(xr, s, z, qmin, qmax, gf);
    y.backward(dy);
    const std::string name = c.at("name");
    EXPECT_TRUE(golden::bit_equal(y.detach(), golden_tensor(c.at("y")))) << name;
    EXPECT_TRUE(golden::bit_equal(xr.grad(), golden_tensor(c.at("dx")))) << name;
    const at::Tensor mag = dy.abs().sum() * gf * (qmax - qmin);
    expect_sum_close(s.grad(), golden_tensor(c.at("dscale")), mag, name + " dscale");
    expect_sum_close(z.grad(), golden_tensor(c.at("dzero_point")), mag * s.abs().max(), name + " dzero_point");
    ++n;
  }
  EXPECT_GT(n, 30);
}

TEST(Lsq, PerTensorEqualsATenLearnableOpOnLargeInput) {
  at::manual_seed(31);
  const at::Tensor x = at::randn({1 << 16}) * 2.0, dy = at::randn({1 << 16});
  const double gf = lsq_grad_factor(x.numel(), 127);
  at::Tensor xa = x.clone().set_requires_grad(true), sa = at::full({1}, 0.02f).set_requires_grad(true),
             za = at::full({1}, 1.3f).set_requires_grad(true);
  at::Tensor xb = x.clone().set_requires_grad(true), sb = at::full({1}, 0.02f).set_requires_grad(true),
             zb = at::full({1}, 1.3f).set_requires_grad(true);
  fake_quantize_learnable_per_tensor_affine(xa, sa, za, -128, 127, gf).backward(dy);
  at::_fake_quantize_learnable_per_tensor_affine(xb, sb, zb, -128, 127, gf).backward(dy);
  EXPECT_TRUE(golden::bit_equal(xa.grad(), xb.grad()));
  EXPECT_NEAR(sa.grad().item<double>(), sb.grad().item<double>(), 1e-4 * std::abs(sb.grad().item<double>()) + 1e-6);
  EXPECT_NEAR(za.grad().item<double>(), zb.grad().item<double>(), 1e-4 * std::abs(zb.grad().item<double>()) + 1e-6);
}

TEST(Lsq, InitialStepIsTwiceMeanAbsOverSqrtQmax) {
  const at::Tensor x = at::tensor({-1.0f, 2.0f, -3.0f, 4.0f});
  EXPECT_FLOAT_EQ(lsq_init_scale(x, 127).item<float>(), static_cast<float>(2 * 2.5 / std::sqrt(127.0)));
  const at::Tensor w = at::tensor({1.0f, 1.0f, 3.0f, 3.0f}).reshape({2, 2});
  const at::Tensor s = lsq_init_scale(w, 7, 0);
  EXPECT_FLOAT_EQ(s[0].item<float>(), static_cast<float>(2 / std::sqrt(7.0)));
  EXPECT_FLOAT_EQ(s[1].item<float>(), static_cast<float>(6 / std::sqrt(7.0)));
  EXPECT_DOUBLE_EQ(lsq_grad_factor(100, 127), 1.0 / std::sqrt(12700.0));
}

TEST(Lsq, LsqPlusGradientsFollowTheDocumentedFormulas) {
  const at::Tensor x = at::tensor({0.26f, -0.5f, 5.0f, -5.0f});
  at::Tensor xr = x.clone().set_requires_grad(true);
  at::Tensor s = at::full({1}, 0.1f).set_requires_grad(true);
  at::Tensor b = at::full({1}, 0.2f).set_requires_grad(true);
  const double gf = 0.5;
  at::Tensor y = fake_quantize_lsq_plus(xr, s, b, -8, 7, gf);
  // v = (x - 0.2) / 0.1 = 0.6, -7, 48, -52 -> q = 1, -7, 7 (clipped), -8 (clipped)
  EXPECT_NEAR(y[0].item<float>(), 0.3f, 1e-6);
  EXPECT_NEAR(y[2].item<float>(), 0.9f, 1e-6);
  y.sum().backward();
  EXPECT_EQ(xr.grad()[0].item<float>(), 1.0f);
  EXPECT_EQ(xr.grad()[2].item<float>(), 0.0f);
  // dS = gf * sum(q - v inside, bound outside) = 0.5 * ((1 - 0.6) + (-7 + 7) + 7 + (-8))
  EXPECT_NEAR(s.grad().item<float>(), 0.5 * (0.4 + 0.0 + 7 - 8), 1e-5);
  // dBeta = gf * (number of clipped elements)
  EXPECT_NEAR(b.grad().item<float>(), 0.5 * 2, 1e-6);
}

TEST(Lsq, RejectsNonPositiveScaleAndBadShapes) {
  const at::Tensor x = at::randn({4, 3});
  EXPECT_THROW(fake_quantize_learnable_per_tensor_affine(x, at::zeros({1}), at::zeros({1}), -128, 127, 1.0), Error);
  EXPECT_THROW(fake_quantize_learnable_per_channel_affine(x, at::ones({4}), at::zeros({3}), 0, -128, 127, 1.0), Error);
  EXPECT_THROW(fake_quantize_learnable_per_channel_affine(x, at::ones({4}), at::zeros({4}), 2, -128, 127, 1.0), Error);
}
