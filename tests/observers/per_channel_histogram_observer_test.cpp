// PerChannelHistogramObserver: each channel behaves exactly as a per-tensor HistogramObserver
// on that channel's values.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "framework/core/error.h"
#include "observers/histogram_observer.h"
#include "observers/per_channel_histogram_observer.h"
#include "tests/observers/observer_test_util.h"

using namespace qforge;

namespace {
QSpec per_channel(QType qt, bool symmetric, int64_t axis) {
  QSpec s = obs_testing::per_tensor(qt, symmetric);
  s.granularity = Granularity::kPerChannel;
  s.axis = axis;
  return s;
}
}  // namespace

TEST(PerChannelHistogramObserver, EachChannelEqualsAPerTensorHistogramObserver) {
  for (HistogramMethod m : {HistogramMethod::kL2, HistogramMethod::kEntropy, HistogramMethod::kPercentile,
                            HistogramMethod::kMse}) {
    ObserverOptions o;
    o.method = m;
    o.ch_axis = 1;
    PerChannelHistogramObserver obs(o);
    const at::Tensor b0 = obs_testing::randn({50, 3, 4}, 41);
    at::Tensor b1 = obs_testing::randn({20, 3, 4}, 42) * at::tensor({1.0f, 3.0f, 0.2f}).reshape({1, 3, 1});
    b1[0][2][0] = NAN;
    obs.update(b0);
    obs.update(b1);
    EXPECT_EQ(obs.nonfinite_count(), 1);
    const auto [lo, hi] = obs.range(per_channel(qint8, false, 1));
    ASSERT_EQ(lo.sizes(), (at::IntArrayRef{3}));
    for (int64_t c = 0; c < 3; ++c) {
      HistogramObserver ref(o);
      ref.update(b0.select(1, c));
      ref.update(b1.select(1, c));
      EXPECT_EQ(obs.histograms()[c].counts(), ref.histogram().counts()) << to_string(m) << " channel " << c;
      const auto [rlo, rhi] = ref.range(obs_testing::per_tensor(qint8, false));
      EXPECT_EQ(lo[c].item<float>(), rlo.item<float>()) << to_string(m) << " channel " << c;
      EXPECT_EQ(hi[c].item<float>(), rhi.item<float>()) << to_string(m) << " channel " << c;
    }
  }
}

TEST(PerChannelHistogramObserver, StateRoundTripAndMerge) {
  ObserverOptions o;
  PerChannelHistogramObserver a(o), b(o), fresh(o);
  a.update(obs_testing::randn({4, 100}, 43));
  b.update(obs_testing::randn({4, 100}, 44) * 2.0f);
  fresh.load_state(a.state());
  const QSpec s = per_channel(quint8, false, 0);
  EXPECT_TRUE(at::equal(a.qparams(s).scale, fresh.qparams(s).scale));
  EXPECT_EQ(a.state().at("histogram").sizes(), (at::IntArrayRef{4, kHistogramBins}));
  a.merge(b);
  EXPECT_EQ(a.count(), 800);
  PerChannelHistogramObserver c(o);
  c.update(obs_testing::randn({5, 10}, 45));
  EXPECT_THROW(a.merge(c), Error);  // channel counts differ
  auto bad = fresh.state();
  bad["histogram"] = at::zeros({4, 10});
  EXPECT_THROW(fresh.load_state(bad), Error);
}

TEST(PerChannelHistogramObserver, BadAxisAndUnseenChannelThrow) {
  ObserverOptions o;
  o.ch_axis = 2;
  PerChannelHistogramObserver obs(o);
  EXPECT_THROW(obs.update(at::ones({3, 3})), Error);
  o.ch_axis = 0;
  PerChannelHistogramObserver nan_channel(o);
  nan_channel.update(at::tensor({1.0f, 2.0f, NAN, NAN}).reshape({2, 2}));
  EXPECT_THROW(nan_channel.range(per_channel(qint8, true, 0)), Error);
}
