// Observer base and factory: kind names, closest-match errors, clone/reset, load_state
// validation common to every kind.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "framework/core/error.h"
#include "observers/observer.h"
#include "tests/observers/observer_test_util.h"

using namespace qforge;

namespace {
QSpec spec_for(const std::string& kind) {
  QSpec s = obs_testing::per_tensor(qint8, false);
  if (kind.find("per_channel") != std::string::npos) s.granularity = Granularity::kPerChannel;
  return s;
}
}  // namespace

TEST(MakeObserver, CreatesEveryKindByNameAndPyTorchName) {
  for (const std::string& kind : observer_kinds()) {
    const auto obs = make_observer(kind);
    EXPECT_EQ(obs->kind(), kind);
  }
  EXPECT_EQ(make_observer("MovingAveragePerChannelMinMaxObserver")->kind(), "moving_average_per_channel_minmax");
  EXPECT_EQ(make_observer("HistogramObserver")->kind(), "histogram");
}

TEST(MakeObserver, UnknownKindSuggestsTheClosestName) {
  try {
    make_observer("histgram");
    FAIL() << "expected qforge::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'histogram'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(histogram_method_from_name("entropi"), Error);
  EXPECT_EQ(histogram_method_from_name("mse"), HistogramMethod::kMse);
}

TEST(MakeObserver, RejectsBadOptions) {
  ObserverOptions o;
  o.averaging_constant = 0.0;
  EXPECT_THROW(make_observer("moving_average_minmax", o), Error);
  o = ObserverOptions{};
  o.percentile = 150.0;
  EXPECT_THROW(make_observer("histogram", o), Error);
  o = ObserverOptions{};
  o.bins = 1;
  EXPECT_THROW(make_observer("per_channel_histogram", o), Error);
}

TEST(Observer, EveryKindRoundTripsStateCloneAndReset) {
  const at::Tensor x = obs_testing::randn({6, 40}, 51);
  for (const std::string& kind : observer_kinds()) {
    auto obs = make_observer(kind);
    obs->update(x);
    obs->update(x * 1.5f);
    const QSpec spec = spec_for(kind);
    const QParams qp = obs->qparams(spec);

    auto fresh = make_observer(kind);
    fresh->load_state(obs->state());
    const QParams qf = fresh->qparams(spec);
    EXPECT_TRUE(at::equal(qp.scale, qf.scale)) << kind;
    EXPECT_TRUE(at::equal(qp.zero_point, qf.zero_point)) << kind;

    auto copy = obs->clone();
    copy->update(x * 10.0f);  // the clone is independent
    EXPECT_TRUE(at::equal(obs->qparams(spec).scale, qp.scale)) << kind;

    obs->reset();
    EXPECT_FALSE(obs->has_data()) << kind;
    EXPECT_THROW(obs->qparams(spec), Error) << kind;
  }
}

TEST(Observer, LoadStateRejectsMissingAndUnexpectedNamesAndStaysUnchanged) {
  for (const std::string& kind : observer_kinds()) {
    auto obs = make_observer(kind);
    obs->update(obs_testing::randn({4, 8}, 52));
    const auto good = obs->state();
    auto missing = good;
    missing.erase("max");
    EXPECT_THROW(obs->load_state(missing), Error) << kind;
    auto extra = good;
    extra["bin_edges"] = at::zeros({2});
    try {
      obs->load_state(extra);
      ADD_FAILURE() << kind << ": expected qforge::Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bin_edges"), std::string::npos) << e.what();
    }
    auto wrong_dtype = good;
    wrong_dtype["min"] = good.at("min").to(at::kDouble);
    EXPECT_THROW(obs->load_state(wrong_dtype), Error) << kind;
    for (const auto& [name, t] : obs->state()) {
      EXPECT_TRUE(at::equal(t, good.at(name))) << kind << " changed '" << name << "' on a failed load";
    }
  }
}

TEST(Observer, MergeRejectsOtherKinds) {
  auto a = make_observer("minmax");
  auto b = make_observer("histogram");
  EXPECT_THROW(a->merge(*b), Error);
}

TEST(Observer, MergeWithItselfDoublesTheCounts) {
  auto a = make_observer("histogram");
  a->update(obs_testing::randn({100}, 53));
  a->merge(*a);
  EXPECT_EQ(a->count(), 200);
}
