// MXFP4 / NVFP4 fake-quant: hand-worked golden blocks, and a property test against an independent
// oracle (the nearest of the 16 decoded E2M1 codes, ties to the even code; scales from log2 and a
// search over the E4M3 codes).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "fake_quant/fake_quantize.h"
#include "fake_quant/fake_quantize_kernels.h"
#include "fake_quant/microscaling.h"
#include "fake_quant/microscaling_math.h"
#include "framework/core/error.h"

using namespace qforge;

namespace {

at::Tensor row(const std::vector<float>& v) { return at::tensor(v, at::kFloat).reshape({1, -1}); }

std::vector<float> values(const at::Tensor& t) {
  const at::Tensor c = t.contiguous().flatten();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

// A block of `n` values: `head` first, zeros after.
std::vector<float> block(std::vector<float> head, size_t n) {
  head.resize(n, 0.0f);
  return head;
}

// Nearest decoded E2M1 code to v (|v| saturated at 6), ties to the code whose mantissa bit is 0.
float oracle_e2m1(float v) {
  double best = 0.0, best_d = std::numeric_limits<double>::infinity();
  int best_code = 0;
  for (int code = 0; code < 16; ++code) {
    const double c = fq::decode_e2m1(static_cast<uint8_t>(code));
    const double d = std::fabs(static_cast<double>(v) - c);
    if (d < best_d || (d == best_d && (best_code & 1) && !(code & 1))) {
      best = c;
      best_d = d;
      best_code = code;
    }
  }
  return static_cast<float>(best);
}

// Nearest E4M3 value to v >= 0 by search over all finite codes, ties to the even code.
float oracle_e4m3(float v) {
  float best = 0.0f;
  double best_d = std::numeric_limits<double>::infinity();
  int best_code = 0;
  for (int code = 0; code < 0x7f; ++code) {
    const float c = fq::decode_float8(static_cast<uint8_t>(code), fq::kE4M3);
    const double d = std::fabs(static_cast<double>(v) - c);
    if (d < best_d || (d == best_d && (best_code & 1) && !(code & 1))) {
      best = c;
      best_d = d;
      best_code = code;
    }
  }
  return best;
}

// MX scale from the definition with log2 in double: 2^(floor(log2(amax)) - 2), exponent in [-127, 127].
float oracle_mx_scale(float amax) {
  if (amax == 0.0f) return std::ldexp(1.0f, -127);
  const int e = static_cast<int>(std::floor(std::log2(static_cast<double>(amax)))) - 2;
  return std::ldexp(1.0f, std::max(-127, std::min(127, e)));
}

}  // namespace

TEST(Mxfp4, E2M1CodesAreTheSpecTable) {
  const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int code = 0; code < 16; ++code) {
    const float v = fq::decode_e2m1(static_cast<uint8_t>(code));
    EXPECT_EQ(v, want[code]) << code;
    EXPECT_EQ(std::signbit(v), code >= 8) << code;
    EXPECT_EQ(fq::encode_e2m1(v), code) << code;
  }
  for (const float off : {2.5f, -0.25f, 7.0f, NAN, INFINITY}) EXPECT_THROW(fq::encode_e2m1(off), Error) << off;
  EXPECT_EQ(fq::decode_e8m0(127), 1.0f);
  EXPECT_EQ(fq::decode_e8m0(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(fq::decode_e8m0(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(fq::decode_e8m0(fq::kE8M0Nan)));
}

TEST(Mxfp4, HandWorkedBlockOnAndBetweenCodesTiesToEven) {
  // amax 6: X = 2^(floor(log2 6) - 2) = 1, so the values are the E2M1 inputs themselves.
  const std::vector<float> x = block({0.5f, 1, 1.5f, 2, 3, 4, 6, -6,           // on codes
                                      0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5,  // ties
                                      0.3f, 2.6f, -0.7f, -4.9f, 0.2f},
                                     32);
  const std::vector<float> want = block({0.5f, 1, 1.5f, 2, 3, 4, 6, -6,       // kept
                                         0, 1, 1, 2, 2, 4, 4,                  // to the even code
                                         0.5f, 3, -0.5f, -4, 0},
                                        32);
  const QParams qp = microscaling_qparams(row(x), microscaling_spec(qmxfp4));
  EXPECT_EQ(values(qp.scale), std::vector<float>{1.0f});
  EXPECT_FALSE(qp.tensor_scale.defined());
  EXPECT_EQ(values(fake_quantize(row(x), qp)), want);
}

TEST(Mxfp4, SaturatesAboveSixTimesTheScaleAndMasksIt) {
  // amax 0.9: X = 2^(-1 - 2) = 0.125; 0.9 / X = 7.2 saturates to 6 (0.75), 0.8 / X = 6.4 too.
  const std::vector<float> x = block({0.9f, -0.8f, 0.7f, 0.1f}, 32);
  const QParams qp = microscaling_qparams(row(x), microscaling_spec(qmxfp4));
  EXPECT_EQ(values(qp.scale), std::vector<float>{0.125f});
  auto [y, mask] = fake_quantize_cachemask(row(x), qp);
  const std::vector<float> got = values(y);
  EXPECT_EQ(got[0], 0.75f);
  EXPECT_EQ(got[1], -0.75f);
  EXPECT_EQ(got[2], 0.75f);  // 5.6 -> 6
  EXPECT_EQ(got[3], 0.125f);  // 0.8 -> 1
  const at::Tensor m = mask.flatten();
  EXPECT_FALSE(m[0].item<bool>());
  EXPECT_FALSE(m[1].item<bool>());
  EXPECT_TRUE(m[2].item<bool>());
  EXPECT_TRUE(m[3].item<bool>());
}

TEST(Mxfp4, ZeroSubnormalAndHugeBlocks) {
  const float tiny = std::ldexp(3.0f, -126);  // 3 * 2^-126: X clamps at 2^-127, x / X = 6 exactly
  const float sub = 1e-40f;                   // a float32 subnormal: rounds to 0
  const float huge = 3e38f;                   // X = 2^125; x / X = 7.05 saturates to 6
  std::vector<float> x(96, 0.0f);
  x[32] = tiny;
  x[33] = sub;
  x[64] = huge;
  x[65] = -huge / 8;
  const QParams qp = microscaling_qparams(row(x), microscaling_spec(qmxfp4));
  EXPECT_EQ(values(qp.scale), (std::vector<float>{std::ldexp(1.0f, -127), std::ldexp(1.0f, -127),
                                                  std::ldexp(1.0f, 125)}));
  const std::vector<float> y = values(fake_quantize(row(x), qp));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], 0.0f);
  EXPECT_EQ(y[32], tiny);
  EXPECT_EQ(y[33], 0.0f);
  EXPECT_EQ(y[64], std::ldexp(6.0f, 125));
  EXPECT_EQ(y[65], -std::ldexp(1.0f, 125));  // -0.88 X rounds to -1 X
}

TEST(Nvfp4, HandWorkedBlocksWithTheTensorScale) {
  // amax 2688 = 6 * 448: g = 1; block 0's scale e4m3(448) = 448; block 1 amax 6: scale 1;
  // block 2 amax 5: 5 / 6 = 0.833 -> e4m3 0.8125, and 5 / 0.8125 = 6.15 saturates to 6 (4.875).
  std::vector<float> x(64, 0.0f);
  x[0] = 2688.0f;
  x[1] = -1000.0f;  // 2.23 X -> 2 X = 896
  x[16] = 6.0f;
  x[17] = 2.5f;     // tie -> 2
  x[32] = 5.0f;
  x[33] = 1.0f;     // 1.23 X -> 1 X
  const QParams qp = microscaling_qparams(row(x), microscaling_spec(qnvfp4));
  EXPECT_EQ(qp.tensor_scale.item<float>(), 1.0f);
  EXPECT_EQ(values(qp.scale), (std::vector<float>{448.0f, 1.0f, 0.8125f, fq::kE4M3MinSubnormal}));
  const std::vector<float> y = values(fake_quantize(row(x), qp));
  EXPECT_EQ(y[0], 2688.0f);
  EXPECT_EQ(y[1], -896.0f);
  EXPECT_EQ(y[16], 6.0f);
  EXPECT_EQ(y[17], 2.0f);
  EXPECT_EQ(y[32], 4.875f);
  EXPECT_EQ(y[33], 0.8125f);
  for (int i = 48; i < 64; ++i) EXPECT_EQ(y[i], 0.0f);  // the all-zero block
}

TEST(Nvfp4, TensorScaleFromAnObserverOrTheFloorForZeros) {
  // An observer's amax of 5376 gives g = 2: block amax 6 -> e4m3(0.5) = 0.5, element scale 1.
  const at::Tensor g = at::full({}, fq::nvfp4_tensor_scale(5376.0f));
  EXPECT_EQ(g.item<float>(), 2.0f);
  const std::vector<float> x = block({6.0f, 1.4f}, 16);
  const QParams qp = microscaling_qparams(row(x), microscaling_spec(qnvfp4), g);
  EXPECT_EQ(values(qp.scale), std::vector<float>{1.0f});
  EXPECT_EQ(values(fake_quantize(row(x), qp))[1], 1.5f);
  const QParams zero = microscaling_qparams(at::zeros({2, 16}), microscaling_spec(qnvfp4));
  EXPECT_EQ(zero.tensor_scale.item<float>(), fq::kMinNormalF32);
  EXPECT_TRUE(at::equal(fake_quantize(at::zeros({2, 16}), zero), at::zeros({2, 16})));
  EXPECT_THROW(microscaling_qparams(at::ones({1, 32}), microscaling_spec(qmxfp4), g), Error);  // no tensor scale
  EXPECT_THROW(microscaling_qparams(row(x), microscaling_spec(qnvfp4), at::full({}, -1.0f)), Error);
}

TEST(Mxfp4, NanAndInfAreRefusedForScalesPropagatedWithGivenScales) {
  for (const float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> x(32, 1.0f);
    x[3] = bad;
    try {
      microscaling_qparams(row(x), microscaling_spec(qmxfp4));
      FAIL() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("element 3"), std::string::npos) << e.what();
    }
  }
  // With scales already fixed: NaN stays NaN, infinities saturate to ±6 * scale.
  const QParams qp = microscaling_qparams(at::ones({1, 32}), microscaling_spec(qmxfp4));  // X = 0.25
  std::vector<float> x(32, 1.0f);
  x[0] = NAN;
  x[1] = INFINITY;
  x[2] = -INFINITY;
  const std::vector<float> y = values(fake_quantize(row(x), qp));
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 1.5f);
  EXPECT_EQ(y[2], -1.5f);
  EXPECT_EQ(y[3], 1.0f);
}

TEST(Mxfp4Nvfp4, GroupSizeOtherThanTheFormatsIsRefused) {
  QSpec s = microscaling_spec(qnvfp4);
  s.group_size = 32;
  EXPECT_THROW(microscaling_qparams(at::ones({1, 64}), s), Error);
  EXPECT_THROW(microscaling_qparams(at::ones({1, 40}), microscaling_spec(qmxfp4)), Error);  // 40 % 32
}

// The tensor path, the scalar reference and the independent oracle agree bit for bit on values
// spread over 2^-40 .. 2^40 with exact ties planted.
TEST(Mxfp4Nvfp4, PropertyMatchesBruteForceNearestCodeOracle) {
  at::manual_seed(35);
  for (const QType* q : {&qmxfp4, &qnvfp4}) {
    const int64_t bs = q->block_size;
    at::Tensor x = at::randn({24, 8 * bs}) * at::exp(at::randn({24, 8, 1}) * 6.0).expand({24, 8, bs}).reshape({24, -1});
    x.index_put_({at::indexing::Slice(0, 4)}, at::round(x.index({at::indexing::Slice(0, 4)}) * 4) / 4);  // ties
    x.index_put_({5}, 0.0f);
    const QParams qp = microscaling_qparams(x, microscaling_spec(*q));
    const std::vector<float> y = values(fake_quantize(x, qp));
    const std::vector<float> xs = values(x), scales = values(qp.scale);
    const float g = q == &qnvfp4 ? qp.tensor_scale.item<float>() : 1.0f;
    if (q == &qnvfp4) {
      EXPECT_EQ(g, x.abs().max().item<float>() / 2688.0f);
    }
    std::vector<float> ref(xs.size()), ref_scales(scales.size());
    fq::microscaling_run_reference(xs.data(), ref.data(), static_cast<int64_t>(xs.size()), static_cast<int>(bs),
                                   q == &qnvfp4, g, ref_scales.data());
    EXPECT_EQ(ref, y) << q->name;
    EXPECT_EQ(ref_scales, scales) << q->name;
    // A tail shorter than a block is refused, not left unwritten.
    EXPECT_THROW(fq::microscaling_run_reference(xs.data(), ref.data(), bs + 1, static_cast<int>(bs), q == &qnvfp4, g,
                                                nullptr),
                 Error);
    for (size_t b = 0; b < scales.size(); ++b) {
      float amax = 0.0f;
      for (int64_t i = 0; i < bs; ++i) amax = std::max(amax, std::fabs(xs[b * bs + i]));
      const float want_scale = q == &qnvfp4
                                   ? oracle_e4m3(std::min(448.0f, std::max(fq::kE4M3MinSubnormal, amax / 6.0f / g))) * g
                                   : oracle_mx_scale(amax);
      ASSERT_EQ(scales[b], want_scale) << q->name << " block " << b << " amax " << amax;
      for (int64_t i = 0; i < bs; ++i) {
        const size_t k = b * bs + i;
        ASSERT_EQ(y[k], oracle_e2m1(xs[k] / scales[b]) * scales[b]) << q->name << " element " << k << " x " << xs[k];
      }
    }
  }
}

TEST(Nvfp4, StraightThroughGradientWhereNotSaturated) {
  at::manual_seed(3);
  const at::Tensor x0 = at::randn({4, 64}) * 3;
  const at::Tensor x = x0.clone().set_requires_grad(true);
  const QSpec spec = microscaling_spec(qnvfp4);
  fake_quantize_microscaling(x, spec).sum().backward();
  const QParams qp = microscaling_qparams(x0, spec);
  const at::Tensor s = qp.scale.reshape({4, 4, 1}).expand({4, 4, 16}).reshape({4, 64});
  const at::Tensor want = ((x0 / s).abs() <= 6).to(at::kFloat);
  EXPECT_TRUE(at::equal(x.grad(), want));
  EXPECT_GT(want.sum().item<float>(), 200.0f);  // most elements pass the gradient
}
