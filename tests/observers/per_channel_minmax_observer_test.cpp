// PerChannelMinMaxObserver (per-channel and per-group) and MovingAveragePerChannelMinMaxObserver.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "framework/core/error.h"
#include "observers/moving_average_per_channel_minmax_observer.h"
#include "observers/per_channel_minmax_observer.h"
#include "tests/golden/golden.h"
#include "tests/observers/observer_test_util.h"

using namespace qforge;

int check_golden_per_channel_minmax();  // minmax_observer_test.cpp

TEST(PerChannelMinMaxObserver, MatchesPyTorchGoldenBitExactForBothAxes) {
  // 4 data kinds x (per_channel_minmax, moving_average_per_channel_minmax) x ch_axis {0, 1}.
  EXPECT_EQ(check_golden_per_channel_minmax(), 16);
}

TEST(PerChannelMinMaxObserver, ShapeSweepMatchesAminmaxAlongAxis) {
  for (int64_t n : obs_testing::sweep_sizes()) {
    const at::Tensor x = obs_testing::randn({3, n, 2}, static_cast<uint64_t>(n));
    PerChannelMinMaxObserver obs(1);
    obs.update(x);
    const auto [mn, mx] = at::aminmax(x.transpose(0, 1).reshape({n, -1}), 1);
    EXPECT_TRUE(at::equal(obs.min_val(), mn)) << n;
    EXPECT_TRUE(at::equal(obs.max_val(), mx)) << n;
    PerChannelMinMaxObserver neg(-2);  // negative axes count from the end
    neg.update(x);
    EXPECT_TRUE(at::equal(neg.min_val(), mn)) << n;
  }
}

TEST(PerChannelMinMaxObserver, PerGroupGivesInputShapeWithLastDimDividedByGroupSize) {
  const at::Tensor x = obs_testing::randn({5, 64}, 11);
  PerChannelMinMaxObserver obs(0, 16);
  obs.update(x);
  ASSERT_EQ(obs.min_val().sizes(), (at::IntArrayRef{5, 4}));
  const auto [mn, mx] = at::aminmax(x.reshape({5, 4, 16}), 2);
  EXPECT_TRUE(at::equal(obs.min_val(), mn));
  EXPECT_TRUE(at::equal(obs.max_val(), mx));
  QSpec s;
  s.granularity = Granularity::kPerGroup;
  s.group_size = 16;
  const QParams qp = obs.qparams(s);
  EXPECT_EQ(qp.scale.sizes(), (at::IntArrayRef{5, 4}));
  EXPECT_EQ(qparams_shape(s, x.sizes()), qp.scale.sizes().vec());
  s.group_size = 32;
  EXPECT_THROW(obs.range(s), Error);
  EXPECT_THROW(obs.update(at::ones({5, 60})), Error);
}

TEST(PerChannelMinMaxObserver, BadAxisThrowsNamingShapeAndAxis) {
  PerChannelMinMaxObserver obs(3);
  try {
    obs.update(at::ones({2, 3}));
    FAIL() << "expected qforge::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ch_axis 3"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  }
  PerChannelMinMaxObserver ok(1);
  ok.update(at::ones({2, 3}));
  EXPECT_THROW(ok.update(at::ones({2, 4})), Error);  // channel count changed
  QSpec s;
  s.granularity = Granularity::kPerChannel;
  s.axis = 0;
  EXPECT_THROW(ok.range(s), Error);  // asked for another axis
}

TEST(PerChannelMinMaxObserver, NanIsExcludedPerChannelAndUnseenChannelThrows) {
  PerChannelMinMaxObserver obs(0);
  at::Tensor x = at::tensor({1.0f, NAN, 2.0f, NAN, NAN, NAN}).reshape({2, 3});
  obs.update(x);
  EXPECT_EQ(obs.nonfinite_count(), 4);
  EXPECT_EQ(obs.min_val()[0].item<float>(), 1.0f);
  EXPECT_EQ(obs.max_val()[0].item<float>(), 2.0f);
  QSpec s;
  s.granularity = Granularity::kPerChannel;
  try {
    obs.range(s);
    FAIL() << "expected qforge::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no finite values"), std::string::npos) << e.what();
  }
  obs.update(at::tensor({0.0f, 0.0f, 0.0f, -1.0f, 4.0f, 0.5f}).reshape({2, 3}));
  const auto [mn, mx] = obs.range(s);
  EXPECT_EQ(mn[1].item<float>(), -1.0f);
  EXPECT_EQ(mx[1].item<float>(), 4.0f);
}

TEST(PerChannelMinMaxObserver, MergeOfHalvesEqualsWholeExactly) {
  const at::Tensor x = obs_testing::randn({8, 33}, 21);
  PerChannelMinMaxObserver whole(1), a(1), b(1);
  whole.update(x);
  a.update(x.narrow(0, 0, 3));
  b.update(x.narrow(0, 3, 5));
  a.merge(b);
  EXPECT_TRUE(at::equal(a.min_val(), whole.min_val()));
  EXPECT_TRUE(at::equal(a.max_val(), whole.max_val()));
  PerChannelMinMaxObserver other_axis(0);
  EXPECT_THROW(a.merge(other_axis), Error);
}

TEST(PerChannelMinMaxObserver, StateRoundTripAndValidation) {
  PerChannelMinMaxObserver obs(0);
  obs.update(obs_testing::randn({4, 10}, 2));
  PerChannelMinMaxObserver fresh(0);
  fresh.load_state(obs.state());
  QSpec s;
  s.granularity = Granularity::kPerChannel;
  EXPECT_TRUE(at::equal(obs.qparams(s).scale, fresh.qparams(s).scale));
  auto bad = obs.state();
  bad["max"] = at::zeros({5});
  EXPECT_THROW(fresh.load_state(bad), Error);
  EXPECT_TRUE(at::equal(fresh.min_val(), obs.min_val()));  // unchanged after the failed load
}

TEST(MovingAveragePerChannelMinMaxObserver, ChannelsWithoutFiniteValuesKeepTheirAverage) {
  MovingAveragePerChannelMinMaxObserver obs(0.5, 0);
  obs.update(at::tensor({-1.0f, 1.0f, -2.0f, 2.0f}).reshape({2, 2}));
  obs.update(at::tensor({-3.0f, 3.0f, NAN, NAN}).reshape({2, 2}));
  EXPECT_EQ(obs.min_val()[0].item<float>(), -2.0f);
  EXPECT_EQ(obs.max_val()[0].item<float>(), 2.0f);
  EXPECT_EQ(obs.min_val()[1].item<float>(), -2.0f);
  EXPECT_EQ(obs.max_val()[1].item<float>(), 2.0f);
  EXPECT_EQ(obs.nonfinite_count(), 2);
}
