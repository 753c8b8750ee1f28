// float8 emulation against an independent oracle: the nearest of all decoded codes, ties to even.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "fake_quant/fake_quant_math.h"
#include "fake_quant/fake_quantize.h"

using namespace qforge;
using namespace qforge::fq;

namespace {

// All finite non-negative values of the format, ascending, with their codes.
std::vector<std::pair<float, uint8_t>> finite_values(const Float8Format& f) {
  std::vector<std::pair<float, uint8_t>> v;
  for (int code = 0; code < 128; ++code) {
    const float d = decode_float8(static_cast<uint8_t>(code), f);
    if (std::isfinite(d)) v.emplace_back(d, static_cast<uint8_t>(code));
  }
  std::sort(v.begin(), v.end());
  return v;
}

// Round-to-nearest-even by search, saturating to max_finite.
float oracle_round(float x, const Float8Format& f) {
  const auto vals = finite_values(f);
  const float a = std::fabs(x);
  if (a >= vals.back().first) return std::copysign(vals.back().first, x);
  for (size_t i = 0; i + 1 < vals.size(); ++i) {
    const float lo = vals[i].first, hi = vals[i + 1].first;
    if (a >= lo && a <= hi) {
      const double dlo = double(a) - lo, dhi = double(hi) - a;
      float r;
      if (dlo < dhi) r = lo;
      else if (dhi < dlo) r = hi;
      else r = (vals[i].second & 1) ? hi : lo;  // tie: even mantissa (last code bit 0)
      return std::copysign(r, x);
    }
  }
  return NAN;
}

}  // namespace

TEST(Float8, DecodedGridHasTheDocumentedExtremes) {
  EXPECT_EQ(finite_values(kE4M3).back().first, 448.0f);
  EXPECT_EQ(finite_values(kE5M2).back().first, 57344.0f);
  EXPECT_EQ(finite_values(kE4M3)[1].first, std::ldexp(1.0f, -9));   // smallest subnormal
  EXPECT_EQ(finite_values(kE5M2)[1].first, std::ldexp(1.0f, -16));
  EXPECT_TRUE(std::isnan(decode_float8(0x7f, kE4M3)));
  EXPECT_TRUE(std::isinf(decode_float8(0x7c, kE5M2)));
}

TEST(Float8, RoundingMatchesNearestEvenOracle) {
  at::manual_seed(21);
  for (const Float8Format* f : {&kE4M3, &kE5M2}) {
    const auto vals = finite_values(*f);
    std::vector<float> xs;
    for (size_t i = 0; i + 1 < vals.size(); ++i) {  // exact midpoints and their neighbours
      const float mid = (vals[i].first + vals[i + 1].first) / 2;
      xs.insert(xs.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), vals[i].first});
    }
    const at::Tensor r = at::randn({3000}) * (f->max_finite / 8);
    for (int i = 0; i < r.numel(); ++i) xs.push_back(r[i].item<float>());
    xs.insert(xs.end(), {f->max_finite * 1.01f, 1e30f, 1e-30f, 0.0f});
    for (float x : xs) {
      for (float sx : {x, -x}) {
        ASSERT_EQ(round_to_float8(sx, *f), oracle_round(sx, *f)) << "x=" << sx << " mbits=" << f->mantissa_bits;
      }
    }
  }
}

TEST(Float8, EncodeDecodeRoundTripsEveryFiniteCode) {
  for (const Float8Format* f : {&kE4M3, &kE5M2}) {
    for (int code = 0; code < 256; ++code) {
      const float v = decode_float8(static_cast<uint8_t>(code), *f);
      if (!std::isfinite(v)) continue;
      if (v == 0.0f && code != 0 && code != 0x80) continue;
      EXPECT_EQ(encode_float8(v, *f), code) << "code " << code;
      EXPECT_EQ(round_to_float8(v, *f), v);
    }
  }
}

TEST(Float8, FakeQuantizeScalesSaturatesAndPassesGradientInRange) {
  QSpec s;
  s.qtype = qfloat8_e4m3fn;
  const QParams qp = make_qparams(s, at::full({}, 0.5f), at::zeros({}, at::kInt));
  const at::Tensor x = at::tensor({0.0f, 1.0f, 300.0f, -1000.0f, NAN});
  at::Tensor xr = x.clone().set_requires_grad(true);
  const at::Tensor y = fake_quantize(xr, qp);
  EXPECT_EQ(y[1].item<float>(), 1.0f);
  EXPECT_EQ(y[2].item<float>(), 0.5f * round_to_float8(600.0f, kE4M3));
  EXPECT_EQ(y[3].item<float>(), -224.0f);  // saturated at -448 * 0.5
  EXPECT_TRUE(std::isnan(y[4].item<float>()));
  y.sum().backward();
  EXPECT_EQ(xr.grad()[1].item<float>(), 1.0f);
  EXPECT_EQ(xr.grad()[3].item<float>(), 0.0f);
}
