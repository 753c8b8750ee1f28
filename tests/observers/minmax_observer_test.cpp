// MinMaxObserver and MovingAverageMinMaxObserver: golden parity with PyTorch, NaN/inf, merge,
// state round trip, bad input.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "framework/core/error.h"
#include "observers/minmax_observer.h"
#include "observers/moving_average_minmax_observer.h"
#include "tests/golden/golden.h"
#include "tests/observers/observer_test_util.h"

using namespace qforge;
using qforge::obs_testing::per_tensor;

namespace {
ObserverOptions options_of(const nlohmann::json& o) {
  ObserverOptions opt;
  opt.averaging_constant = o.value("averaging_constant", kDefaultAveragingConstant);
  opt.ch_axis = o.value("ch_axis", int64_t{0});
  return opt;
}

// Runs every golden case of `kinds` (observers_minmax.json) and checks state after each batch
// and the final qparams, all bit-exact.
int check_golden_minmax(const std::vector<std::string>& kinds, Granularity g) {
  const auto golden = golden::load_golden("observers_minmax.json");
  int checked = 0;
  for (const auto& c : golden.at("cases")) {
    const std::string kind = c.at("kind");
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) continue;
    const ObserverOptions opt = options_of(c.at("options"));
    auto obs = make_observer(kind, opt);
    const auto& batches = c.at("batches");
    for (size_t b = 0; b < batches.size(); ++b) {
      obs->update(golden::golden_tensor(batches[b]));
      const auto st = obs->state();
      const at::Tensor emin = golden::golden_tensor(c.at("states")[b].at("min"));
      const at::Tensor emax = golden::golden_tensor(c.at("states")[b].at("max"));
      EXPECT_TRUE(golden::bit_equal(st.at("min"), emin))
          << c.at("name") << " batch " << b << " min: " << golden::describe_mismatch(st.at("min"), emin);
      EXPECT_TRUE(golden::bit_equal(st.at("max"), emax))
          << c.at("name") << " batch " << b << " max: " << golden::describe_mismatch(st.at("max"), emax);
    }
    for (const auto& [key, qp_json] : c.at("qparams").items()) {
      const QSpec spec = obs_testing::spec_from_key(key, g, opt.ch_axis);
      const QParams qp = obs->qparams(spec);
      const at::Tensor es = golden::golden_tensor(qp_json.at("scale")).reshape(qp.scale.sizes());
      const at::Tensor ez = golden::golden_tensor(qp_json.at("zero_point")).reshape(qp.zero_point.sizes());
      EXPECT_TRUE(golden::bit_equal(qp.scale, es))
          << c.at("name") << " " << key << " scale: " << golden::describe_mismatch(qp.scale, es);
      EXPECT_TRUE(at::equal(qp.zero_point.to(at::kLong), ez))
          << c.at("name") << " " << key << " zero_point: " << golden::describe_mismatch(qp.zero_point, ez);
    }
    ++checked;
  }
  return checked;
}
}  // namespace

int check_golden_per_channel_minmax() {
  return check_golden_minmax({"per_channel_minmax", "moving_average_per_channel_minmax"}, Granularity::kPerChannel);
}

TEST(MinMaxObserver, MatchesPyTorchGoldenBitExact) {
  EXPECT_EQ(check_golden_minmax({"minmax"}, Granularity::kPerTensor), 4);
}

TEST(MovingAverageMinMaxObserver, MatchesPyTorchGoldenOverSeveralBatchesBitExact) {
  EXPECT_EQ(check_golden_minmax({"moving_average_minmax"}, Granularity::kPerTensor), 8);
}

TEST(MinMaxObserver, NanAndInfAreExcludedAndCounted) {
  MinMaxObserver obs;
  obs.update(at::tensor({1.0f, NAN, -2.0f, INFINITY, -INFINITY, 3.0f}));
  EXPECT_EQ(obs.nonfinite_count(), 3);
  EXPECT_EQ(obs.count(), 3);
  EXPECT_EQ(obs.min_val().item<float>(), -2.0f);
  EXPECT_EQ(obs.max_val().item<float>(), 3.0f);
  EXPECT_EQ(obs.state().at("nonfinite_count").item<int64_t>(), 3);
}

TEST(MinMaxObserver, OnlyNanSeenThrowsSayingSo) {
  MinMaxObserver obs;
  obs.update(at::full({4}, NAN));
  EXPECT_EQ(obs.nonfinite_count(), 4);
  try {
    obs.qparams(per_tensor(qint8, false));
    FAIL() << "expected qforge::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no finite values"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("NaN/inf"), std::string::npos) << e.what();
  }
}

TEST(MinMaxObserver, NothingSeenThrows) {
  MinMaxObserver obs;
  EXPECT_THROW(obs.range(per_tensor(qint8, false)), Error);
  MovingAverageMinMaxObserver ma;
  EXPECT_THROW(ma.qparams(per_tensor(quint8, true)), Error);
}

TEST(MinMaxObserver, EmptyTensorIsANoOp) {
  MinMaxObserver obs;
  obs.update(at::empty({0, 7}));
  EXPECT_FALSE(obs.has_data());
  obs.update(at::tensor({2.0f}));
  obs.update(at::empty({0}));
  EXPECT_EQ(obs.count(), 1);
  EXPECT_EQ(obs.max_val().item<float>(), 2.0f);
}

TEST(MinMaxObserver, ConstantTensorGivesValidNonZeroScale) {
  for (float v : {0.0f, 0.75f, -3.0f}) {
    MinMaxObserver obs;
    obs.update(at::full({5, 5}, v));
    for (bool sym : {false, true}) {
      for (const QType& qt : {qint8, quint8}) {
        const QParams qp = obs.qparams(per_tensor(qt, sym));
        EXPECT_GT(qp.scale.item<float>(), 0.0f);
        EXPECT_TRUE(std::isfinite(qp.scale.item<float>()));
      }
    }
  }
}

TEST(MinMaxObserver, NonFloatingDtypeThrowsNamingIt) {
  MinMaxObserver obs;
  try {
    obs.update(at::ones({3, 4}, at::kInt));
    FAIL() << "expected qforge::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("floating"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[3, 4]"), std::string::npos) << e.what();
  }
}

TEST(MinMaxObserver, AcceptsDoubleAndHalfInputs) {
  MinMaxObserver obs;
  obs.update(at::tensor({1.5, -0.5}, at::kDouble));
  obs.update(at::tensor({2.0f}).to(at::kHalf));
  EXPECT_EQ(obs.min_val().item<float>(), -0.5f);
  EXPECT_EQ(obs.max_val().item<float>(), 2.0f);
}

TEST(MinMaxObserver, PerChannelSpecIsRejected) {
  MinMaxObserver obs;
  obs.update(at::ones({2}));
  QSpec s;
  s.granularity = Granularity::kPerChannel;
  EXPECT_THROW(obs.range(s), Error);
}

TEST(MinMaxObserver, MergeOfHalvesEqualsWholeExactly) {
  const at::Tensor x = obs_testing::randn({1000}, 3);
  for (int64_t n : obs_testing::sweep_sizes()) {
    const at::Tensor data = x.narrow(0, 0, std::min<int64_t>(n, 1000));
    const int64_t half = data.numel() / 2;
    MinMaxObserver whole, a, b;
    whole.update(data);
    a.update(data.narrow(0, 0, half));
    b.update(data.narrow(0, half, data.numel() - half));
    a.merge(b);
    EXPECT_TRUE(at::equal(a.min_val(), whole.min_val())) << n;
    EXPECT_TRUE(at::equal(a.max_val(), whole.max_val())) << n;
    EXPECT_EQ(a.count(), whole.count());
    // Shape sweep: the observer agrees with at::aminmax.
    EXPECT_EQ(whole.min_val().item<float>(), data.min().item<float>()) << n;
    EXPECT_EQ(whole.max_val().item<float>(), data.max().item<float>()) << n;
  }
}

TEST(MinMaxObserver, StateRoundTripGivesSameQparams) {
  MinMaxObserver obs;
  obs.update(obs_testing::randn({64}, 5));
  obs.update(at::tensor({NAN}));
  MinMaxObserver fresh;
  fresh.load_state(obs.state());
  EXPECT_EQ(fresh.nonfinite_count(), 1);
  const QParams a = obs.qparams(per_tensor(quint8, false)), b = fresh.qparams(per_tensor(quint8, false));
  EXPECT_TRUE(at::equal(a.scale, b.scale));
  EXPECT_TRUE(at::equal(a.zero_point, b.zero_point));
}

TEST(MovingAverageMinMaxObserver, FirstBatchInitialisesThenAverages) {
  MovingAverageMinMaxObserver obs(0.5);
  obs.update(at::tensor({-1.0f, 1.0f}));
  EXPECT_EQ(obs.min_val().item<float>(), -1.0f);
  obs.update(at::tensor({-3.0f, 5.0f}));
  EXPECT_EQ(obs.min_val().item<float>(), -2.0f);
  EXPECT_EQ(obs.max_val().item<float>(), 3.0f);
}

TEST(MovingAverageMinMaxObserver, AllNanBatchLeavesTheAverageAlone) {
  MovingAverageMinMaxObserver obs;
  obs.update(at::tensor({-1.0f, 1.0f}));
  obs.update(at::full({3}, NAN));
  EXPECT_EQ(obs.min_val().item<float>(), -1.0f);
  EXPECT_EQ(obs.nonfinite_count(), 3);
}

TEST(MovingAverageMinMaxObserver, MergeIsCountWeightedMean) {
  MovingAverageMinMaxObserver a, b;
  a.update(at::tensor({-1.0f, 1.0f, 0.0f}));  // 3 values
  b.update(at::tensor({-5.0f, 7.0f}));        // 2 values... then 1 more
  b.update(at::tensor({0.0f}));
  const float bmin = b.min_val().item<float>(), bmax = b.max_val().item<float>();
  a.merge(b);
  EXPECT_NEAR(a.min_val().item<float>(), -1.0f + 0.5f * (bmin + 1.0f), 1e-6);
  EXPECT_NEAR(a.max_val().item<float>(), 1.0f + 0.5f * (bmax - 1.0f), 1e-6);
  EXPECT_THROW(a.merge(MovingAverageMinMaxObserver(0.5)), Error);
  EXPECT_THROW(a.merge(MinMaxObserver()), Error);
}
