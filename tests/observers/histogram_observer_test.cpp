// HistogramObserver: golden parity with PyTorch's HistogramObserver over several batches, merge
// error bound, state round trip, NaN/inf, and sanity of the entropy/percentile/mse searches.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "framework/core/error.h"
#include "observers/histogram_observer.h"
#include "observers/histogram_search.h"
#include "observers/minmax_observer.h"
#include "tests/golden/golden.h"
#include "tests/observers/observer_test_util.h"

using namespace qforge;
using qforge::obs_testing::per_tensor;

namespace {
at::Tensor histogram_of(const HistogramObserver& obs) { return obs.state().at("histogram"); }

HistogramObserver observer_with(HistogramMethod m, double percentile = kDefaultPercentile) {
  ObserverOptions o;
  o.method = m;
  o.percentile = percentile;
  return HistogramObserver(o);
}
}  // namespace

// The oracle is PyTorch 1.13's HistogramObserver with histc on the float range (see
// gen_observers.py); the stock_integer_range case is stock PyTorch. Histogram counts (integers
// and PyTorch's float re-binning), ranges, the l2 search and qparams all compare bit-exact.
TEST(HistogramObserver, MatchesPyTorchGoldenOverSeveralBatchesBitExact) {
  const auto golden = golden::load_golden("observers_histogram.json");
  int checked = 0;
  for (const auto& c : golden.at("cases")) {
    HistogramObserver obs;
    const auto& batches = c.at("batches");
    const bool constant = c.at("data_kind") == "constant";
    for (size_t b = 0; b < batches.size(); ++b) {
      obs.update(golden::golden_tensor(batches[b]));
      const auto st = obs.state();
      const at::Tensor emin = golden::golden_tensor(c.at("states")[b].at("min"));
      const at::Tensor emax = golden::golden_tensor(c.at("states")[b].at("max"));
      EXPECT_TRUE(golden::bit_equal(st.at("min"), emin)) << c.at("name") << " batch " << b;
      EXPECT_TRUE(golden::bit_equal(st.at("max"), emax)) << c.at("name") << " batch " << b;
      // Sums are compared loosely: PyTorch's float sum order differs from ours; counts are
      // compared bit-exact below.
      const double esum = c.at("states")[b].at("histogram_sum").get<double>() * (constant ? b + 1 : 1);
      EXPECT_NEAR(obs.histogram().total(), esum, 1e-4 * esum) << c.at("name") << " batch " << b;
    }
    at::Tensor ehist = golden::golden_tensor(c.at("final").at("histogram"));
    // PyTorch re-initialises on a constant range and keeps only the last batch; we keep all of
    // them (equal-size batches, so exactly nbatches times the counts).
    if (constant) ehist = ehist * static_cast<float>(batches.size());
    EXPECT_TRUE(golden::bit_equal(histogram_of(obs), ehist))
        << c.at("name") << " histogram: " << golden::describe_mismatch(histogram_of(obs), ehist);
    const auto [lo, hi] = obs.range(per_tensor(qint8, false));
    const at::Tensor esmin = golden::golden_tensor(c.at("search_min"));
    const at::Tensor esmax = golden::golden_tensor(c.at("search_max"));
    EXPECT_TRUE(golden::bit_equal(lo, esmin)) << c.at("name") << " l2 min " << golden::describe_mismatch(lo, esmin);
    EXPECT_TRUE(golden::bit_equal(hi, esmax)) << c.at("name") << " l2 max " << golden::describe_mismatch(hi, esmax);
    for (const auto& [key, qp_json] : c.at("qparams").items()) {
      const QParams qp = obs.qparams(obs_testing::spec_from_key(key));
      const at::Tensor es = golden::golden_tensor(qp_json.at("scale")).reshape({});
      const at::Tensor ez = golden::golden_tensor(qp_json.at("zero_point")).reshape({});
      EXPECT_TRUE(golden::bit_equal(qp.scale, es)) << c.at("name") << " " << key << " scale";
      EXPECT_TRUE(at::equal(qp.zero_point.to(at::kLong), ez)) << c.at("name") << " " << key << " zero_point";
    }
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

TEST(HistogramObserver, NanAndInfAreExcludedAndCounted) {
  HistogramObserver obs;
  obs.update(at::tensor({1.0f, NAN, -2.0f, INFINITY, -INFINITY, 3.0f}));
  EXPECT_EQ(obs.nonfinite_count(), 3);
  EXPECT_EQ(obs.histogram().min(), -2.0f);
  EXPECT_EQ(obs.histogram().max(), 3.0f);
  EXPECT_EQ(obs.histogram().total(), 3.0);
  HistogramObserver only_nan;
  only_nan.update(at::full({8}, NAN));
  EXPECT_THROW(only_nan.qparams(per_tensor(qint8, true)), Error);
  EXPECT_TRUE(only_nan.histogram().empty());
}

TEST(HistogramObserver, ConstantTensorGivesValidNonZeroScale) {
  for (HistogramMethod m : {HistogramMethod::kL2, HistogramMethod::kEntropy, HistogramMethod::kPercentile,
                            HistogramMethod::kMse}) {
    HistogramObserver obs = observer_with(m);
    obs.update(at::full({100}, 0.75f));
    obs.update(at::full({100}, 0.75f));
    for (bool sym : {false, true}) {
      const QParams qp = obs.qparams(per_tensor(quint8, sym));
      EXPECT_GT(qp.scale.item<float>(), 0.0f) << to_string(m);
    }
    const auto [lo, hi] = obs.range(per_tensor(qint8, false));
    EXPECT_EQ(lo.item<float>(), 0.75f);
    EXPECT_EQ(hi.item<float>(), 0.75f);
  }
}

TEST(HistogramObserver, MergeOfHalvesEqualsWholeWithinOneSourceBin) {
  // Bound (docs/observers.md): the merged histogram's cumulative counts differ from the observer
  // that saw both halves in sequence by at most the largest bin of the merged-in histogram.
  for (uint64_t seed : {1, 2, 3}) {
    const at::Tensor x = seed == 3 ? obs_testing::heavy_tailed(8192, seed) : obs_testing::randn({8192}, seed) * (1.0f + seed);
    const at::Tensor a_data = x.narrow(0, 0, 4096), b_data = x.narrow(0, 4096, 4096);
    HistogramObserver whole, a, b;
    whole.update(a_data);
    whole.update(b_data);
    a.update(a_data);
    b.update(b_data);
    a.merge(b);
    EXPECT_EQ(a.histogram().min(), whole.histogram().min());
    EXPECT_EQ(a.histogram().max(), whole.histogram().max());
    EXPECT_EQ(a.count(), 8192);
    EXPECT_NEAR(a.histogram().total(), whole.histogram().total(), 1e-2);
    const at::Tensor cdf_merged = at::cumsum(histogram_of(a).to(at::kDouble), 0);
    const at::Tensor cdf_whole = at::cumsum(histogram_of(whole).to(at::kDouble), 0);
    const double bound = histogram_of(b).max().item<double>() + 1e-2;
    EXPECT_LE((cdf_merged - cdf_whole).abs().max().item<double>(), bound) << "seed " << seed;
    // The chosen ranges agree to within a few bins where the search is sharp (l2, percentile);
    // where the objective is flat near its optimum (mse, entropy) they agree in quantization MSE.
    const double bin = (whole.histogram().max() - whole.histogram().min()) / kHistogramBins;
    for (HistogramMethod m : {HistogramMethod::kL2, HistogramMethod::kPercentile, HistogramMethod::kMse,
                              HistogramMethod::kEntropy}) {
      HistogramObserver wm = observer_with(m), am = observer_with(m);
      wm.load_state(whole.state());
      am.load_state(a.state());
      const QSpec spec = per_tensor(qint8, false);
      const auto [wl, wh] = wm.range(spec);
      const auto [al, ah] = am.range(spec);
      if (m == HistogramMethod::kL2 || m == HistogramMethod::kPercentile) {
        EXPECT_NEAR(al.item<float>(), wl.item<float>(), 3 * bin) << to_string(m) << " seed " << seed;
        EXPECT_NEAR(ah.item<float>(), wh.item<float>(), 3 * bin) << to_string(m) << " seed " << seed;
      } else if (m == HistogramMethod::kMse) {
        const double mw = obs_testing::fake_quant_mse(x, wm.qparams(spec));
        const double ma = obs_testing::fake_quant_mse(x, am.qparams(spec));
        EXPECT_NEAR(ma, mw, 0.03 * mw) << "seed " << seed;
      } else {
        // KL divergence is flat near its minimum on bell-shaped data: thresholds may move by
        // a few percent of the range.
        EXPECT_NEAR(ah.item<float>(), wh.item<float>(), 0.1 * bin * kHistogramBins) << "seed " << seed;
      }
    }
  }
}

TEST(HistogramObserver, MergeIntoEmptyAndWithConstantParts) {
  HistogramObserver empty, a, c;
  a.update(obs_testing::randn({500}, 8));
  empty.merge(a);
  EXPECT_TRUE(at::equal(histogram_of(empty), histogram_of(a)));
  c.update(at::full({50}, 10.0f));
  a.merge(c);
  EXPECT_EQ(a.histogram().max() >= 10.0f, true);
  EXPECT_NEAR(a.histogram().total(), 550.0, 1e-3);
  c.merge(empty);  // constant observer absorbs a wider one
  EXPECT_NEAR(c.histogram().total(), 550.0, 1e-3);
}

TEST(HistogramObserver, StateRoundTripGivesSameQparams) {
  for (HistogramMethod m : {HistogramMethod::kL2, HistogramMethod::kEntropy, HistogramMethod::kPercentile,
                            HistogramMethod::kMse}) {
    HistogramObserver obs = observer_with(m), fresh = observer_with(m);
    obs.update(obs_testing::randn({3000}, 12));
    obs.update(obs_testing::randn({1000}, 13) * 3.0f);
    fresh.load_state(obs.state());
    for (bool sym : {false, true}) {
      const QParams a = obs.qparams(per_tensor(qint8, sym)), b = fresh.qparams(per_tensor(qint8, sym));
      EXPECT_TRUE(at::equal(a.scale, b.scale)) << to_string(m);
      EXPECT_TRUE(at::equal(a.zero_point, b.zero_point)) << to_string(m);
    }
    // Continuing after a load gives the same as continuing the original.
    obs.update(obs_testing::randn({100}, 14) * 5.0f);
    fresh.update(obs_testing::randn({100}, 14) * 5.0f);
    EXPECT_TRUE(at::equal(histogram_of(obs), histogram_of(fresh)));
  }
}

TEST(HistogramObserver, LoadStateRejectsBadTensorsAndStaysUnchanged) {
  HistogramObserver obs;
  obs.update(obs_testing::randn({100}, 15));
  const auto before = obs.state();
  auto bad = before;
  bad["histogram"] = at::zeros({100});
  EXPECT_THROW(obs.load_state(bad), Error);
  bad = before;
  bad["histogram"] = at::full({kHistogramBins}, -1.0f);
  EXPECT_THROW(obs.load_state(bad), Error);
  bad = before;
  bad["min"] = at::scalar_tensor(5.0f);  // min > max
  EXPECT_THROW(obs.load_state(bad), Error);
  bad = before;
  bad["nonfinite_count"] = at::scalar_tensor(1.0f);  // wrong dtype
  EXPECT_THROW(obs.load_state(bad), Error);
  EXPECT_TRUE(at::equal(obs.state().at("histogram"), before.at("histogram")));
  EXPECT_EQ(obs.state().at("min").item<float>(), before.at("min").item<float>());
}

TEST(HistogramObserver, EntropyAndPercentileClipHeavyTailOutliers) {
  const at::Tensor x = obs_testing::heavy_tailed(20000, 31);
  const float data_min = x.min().item<float>(), data_max = x.max().item<float>();
  for (HistogramMethod m : {HistogramMethod::kEntropy, HistogramMethod::kPercentile}) {
    HistogramObserver obs = observer_with(m);
    obs.update(x);
    for (bool sym : {false, true}) {
      const auto [lo, hi] = obs.range(per_tensor(qint8, sym));
      EXPECT_LT(hi.item<float>() - lo.item<float>(), 0.5f * (data_max - data_min)) << to_string(m) << " sym " << sym;
      EXPECT_GT(hi.item<float>(), 0.0f);
      EXPECT_LT(lo.item<float>(), 0.0f);
    }
  }
}

TEST(HistogramObserver, PercentileOfNormalDataIsNearTheGaussianQuantile) {
  const at::Tensor x = obs_testing::randn({200000}, 32);
  HistogramObserver obs = observer_with(HistogramMethod::kPercentile, 99.0);
  obs.update(x);
  const auto [lo, hi] = obs.range(per_tensor(qint8, true));
  EXPECT_NEAR(hi.item<float>(), 2.576f, 0.05f);  // P(|x| < 2.576) = 0.99
  const auto [alo, ahi] = obs.range(per_tensor(qint8, false));
  EXPECT_NEAR(ahi.item<float>(), 2.326f, 0.05f);  // each tail 1%
  EXPECT_NEAR(alo.item<float>(), -2.326f, 0.05f);
}

TEST(HistogramObserver, MseRangeHasLowerFakeQuantMseThanMinMaxOnHeavyTails) {
  // Student-t(3): clipping the tails buys resolution for the bulk. (The brute-force optimum
  // over clip ranges is about 0.8x minmax's MSE at 8 bits and 0.2x at 4 bits.)
  const at::Tensor x = obs_testing::student_t3(50000, 33);
  HistogramObserver obs = observer_with(HistogramMethod::kMse);
  obs.update(x);
  MinMaxObserver minmax;
  minmax.update(x);
  for (const QType& qt : {qint8, quint8, qint4}) {
    for (bool sym : {false, true}) {
      const QSpec spec = per_tensor(qt, sym);
      const double mse = obs_testing::fake_quant_mse(x, obs.qparams(spec));
      const double mm = obs_testing::fake_quant_mse(x, minmax.qparams(spec));
      EXPECT_LT(mse, (qt.bits == 4 ? 0.5 : 0.92) * mm) << qt.name << " sym " << sym << ": mse " << mse << " minmax " << mm;
    }
  }
}

TEST(HistogramObserver, MseRangeIsNotWorseThanMinMaxOnExtremeOutliers) {
  // Cauchy: the largest samples dominate any clipping error, so the best range is ~min/max.
  const at::Tensor x = obs_testing::heavy_tailed(50000, 36);
  HistogramObserver obs = observer_with(HistogramMethod::kMse);
  obs.update(x);
  MinMaxObserver minmax;
  minmax.update(x);
  for (bool sym : {false, true}) {
    const QSpec spec = per_tensor(qint8, sym);
    EXPECT_LE(obs_testing::fake_quant_mse(x, obs.qparams(spec)), 1.001 * obs_testing::fake_quant_mse(x, minmax.qparams(spec)));
  }
}

TEST(HistogramObserver, MseRangeIsNotWorseThanMinMaxOnNormalData) {
  const at::Tensor x = obs_testing::randn({50000}, 34);
  HistogramObserver obs = observer_with(HistogramMethod::kMse);
  obs.update(x);
  MinMaxObserver minmax;
  minmax.update(x);
  for (bool sym : {false, true}) {
    const QSpec spec = per_tensor(qint8, sym);
    EXPECT_LE(obs_testing::fake_quant_mse(x, obs.qparams(spec)), 1.05 * obs_testing::fake_quant_mse(x, minmax.qparams(spec)));
  }
}

TEST(HistogramObserver, SearchDependsOnTheQtypeBits) {
  const at::Tensor x = obs_testing::heavy_tailed(20000, 35);
  for (HistogramMethod m : {HistogramMethod::kL2, HistogramMethod::kEntropy, HistogramMethod::kMse}) {
    HistogramObserver obs = observer_with(m);
    obs.update(x);
    const auto [lo8, hi8] = obs.range(per_tensor(qint8, true));
    const auto [lo4, hi4] = obs.range(per_tensor(qint4, true));
    EXPECT_NE(hi4.item<float>() - lo4.item<float>(), hi8.item<float>() - lo8.item<float>()) << to_string(m);
    if (m != HistogramMethod::kL2) {
      // Fewer levels make clipping cheaper than resolution: the 4-bit range is not wider. (The
      // l2 search is PyTorch's heuristic and promises nothing of the kind.)
      EXPECT_LE(hi4.item<float>() - lo4.item<float>(), hi8.item<float>() - lo8.item<float>()) << to_string(m);
    }
  }
}

TEST(HistogramObserver, ShapeSweepCountsEveryFiniteValue) {
  for (int64_t n : obs_testing::sweep_sizes()) {
    HistogramObserver obs;
    const at::Tensor x = obs_testing::randn({n}, static_cast<uint64_t>(n) + 7);
    obs.update(x);
    obs.update(x * 2.0f);
    EXPECT_NEAR(obs.histogram().total(), 2.0 * n, 1e-3 * n) << n;
    EXPECT_EQ(obs.count(), 2 * n);
    const QParams qp = obs.qparams(per_tensor(quint8, false));
    EXPECT_GT(qp.scale.item<float>(), 0.0f) << n;
  }
}
