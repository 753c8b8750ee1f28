// Calibration dumps: write/read round trips, merge equals the observers' own merge, clear errors.
#include "framework/io/calibration_dump.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "framework/core/error.h"
#include "framework/io/format.h"
#include "framework/format/hdf5.h"
#include "tests/io/io_fixtures.h"
#include "tests/io/io_test_util.h"

namespace qforge::io {
namespace {

using testing::same_tensor;
using testing::TempDir;

struct Point {
  std::string module, point, kind;
  ObserverOptions options;
  QSpec spec;
  std::vector<int64_t> shape;
};

std::vector<Point> points() {
  std::vector<Point> p;
  QSpec u8;
  u8.qtype = quint8;
  QSpec s8_channel;
  s8_channel.granularity = Granularity::kPerChannel;
  s8_channel.symmetric = true;
  QSpec s4_group;
  s4_group.qtype = qint4;
  s4_group.granularity = Granularity::kPerGroup;
  s4_group.group_size = 8;
  s4_group.symmetric = true;
  ObserverOptions group_opts;
  group_opts.group_size = 8;
  ObserverOptions hist;
  hist.bins = 128;
  ObserverOptions hist_pct = hist;
  hist_pct.method = HistogramMethod::kPercentile;
  hist_pct.percentile = 99.0;
  p.push_back({"fc1", "input", "minmax", {}, u8, {16, 32}});
  p.push_back({"fc1", "weight", "per_channel_minmax", {}, s8_channel, {8, 32}});
  p.push_back({"encoder.layer.3.attention", "weight", "per_channel_minmax", group_opts, s4_group, {8, 32}});
  p.push_back({"encoder.layer.3.attention", "output", "histogram", hist, u8, {16, 32}});
  p.push_back({"fc2", "input", "histogram", hist_pct, u8, {16, 32}});
  p.push_back({"fc2", "output", "moving_average_minmax", {}, u8, {16, 32}});
  return p;
}

// Data for shard `s` of point `i`: different ranges per shard so merges change the statistics.
at::Tensor shard_data(size_t i, int s, at::IntArrayRef shape) {
  at::Tensor x = testing::pattern(shape, 37 + 2 * static_cast<int64_t>(i), 11 + s, 101);
  x = x * (1.0 + 0.5 * s) + 0.25 * s;
  if (s == 1) x.view(-1)[3] = NAN;  // counted in nonfinite_count
  return x;
}

CalibrationDump calibrate(int shard, std::vector<std::unique_ptr<Observer>>* observers = nullptr) {
  CalibrationDump dump;
  const std::vector<Point> ps = points();
  for (size_t i = 0; i < ps.size(); ++i) {
    std::unique_ptr<Observer> o = make_observer(ps[i].kind, ps[i].options);
    o->update(shard_data(i, shard, ps[i].shape));
    dump[ps[i].module][ps[i].point] = make_calibration_entry(*o, ps[i].options, ps[i].spec);
    if (observers) observers->push_back(std::move(o));
  }
  return dump;
}

void expect_same_entry(const CalibrationEntry& a, const CalibrationEntry& b, const std::string& what) {
  EXPECT_EQ(a.observer_kind, b.observer_kind) << what;
  EXPECT_EQ(a.spec.to_string(), b.spec.to_string()) << what;
  EXPECT_EQ(a.options.method, b.options.method) << what;
  EXPECT_EQ(a.options.bins, b.options.bins) << what;
  EXPECT_EQ(a.options.group_size, b.options.group_size) << what;
  EXPECT_EQ(a.options.percentile, b.options.percentile) << what;
  ASSERT_EQ(a.state.size(), b.state.size()) << what;
  for (const auto& [name, t] : a.state) {
    ASSERT_TRUE(b.state.count(name)) << what << " " << name;
    EXPECT_TRUE(same_tensor(t, b.state.at(name))) << what << " " << name;
  }
  ASSERT_EQ(a.qparams.defined(), b.qparams.defined()) << what;
  if (a.qparams.defined()) {
    EXPECT_TRUE(same_tensor(a.qparams.scale, b.qparams.scale)) << what;
    EXPECT_TRUE(same_tensor(a.qparams.zero_point, b.qparams.zero_point)) << what;
  }
}

void expect_same_dump(const CalibrationDump& a, const CalibrationDump& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [module, pts] : a) {
    ASSERT_TRUE(b.count(module)) << module;
    ASSERT_EQ(pts.size(), b.at(module).size()) << module;
    for (const auto& [point, e] : pts) {
      ASSERT_TRUE(b.at(module).count(point)) << module << "/" << point;
      expect_same_entry(e, b.at(module).at(point), module + "/" + point);
    }
  }
}

TEST(CalibrationDump, WriteThenReadGivesTheSameStatesAndQparams) {
  TempDir dir;
  const CalibrationDump dump = calibrate(0);
  save_calibration_dump(dir.file("calib.h5"), dump);
  const CalibrationDump back = load_calibration_dump(dir.file("calib.h5"));
  expect_same_dump(dump, back);
  // A restored observer gives the same qparams as the original.
  for (const auto& [module, pts] : back) {
    for (const auto& [point, e] : pts) {
      const QParams qp = e.make_observer()->qparams(e.spec);
      EXPECT_TRUE(same_tensor(qp.scale, dump.at(module).at(point).qparams.scale)) << module << "/" << point;
    }
  }
}

TEST(CalibrationDump, MergeOfShardDumpsEqualsObserverMerge) {
  TempDir dir;
  std::vector<std::unique_ptr<Observer>> a, b;
  save_calibration_dump(dir.file("a.h5"), calibrate(0, &a));
  save_calibration_dump(dir.file("b.h5"), calibrate(1, &b));
  const CalibrationDump merged = merge_calibration_dumps(
      {load_calibration_dump(dir.file("a.h5")), load_calibration_dump(dir.file("b.h5"))});
  const std::vector<Point> ps = points();
  for (size_t i = 0; i < ps.size(); ++i) {
    a[i]->merge(*b[i]);
    const CalibrationEntry expected = make_calibration_entry(*a[i], ps[i].options, ps[i].spec);
    expect_same_entry(expected, merged.at(ps[i].module).at(ps[i].point), ps[i].module + "/" + ps[i].point);
  }
  // The merged dump is itself a dump.
  save_calibration_dump(dir.file("merged.h5"), merged);
  expect_same_dump(merged, load_calibration_dump(dir.file("merged.h5")));
}

TEST(CalibrationDump, MergeKeepsPointsPresentInOnlyOneDump) {
  CalibrationDump a = calibrate(0), b = calibrate(1);
  b.erase("fc1");
  const CalibrationDump merged = merge_calibration_dumps({a, b});
  expect_same_entry(a.at("fc1").at("input"), merged.at("fc1").at("input"), "fc1/input");
}

TEST(CalibrationDump, MergeRejectsDisagreeingDumps) {
  CalibrationDump a = calibrate(0), b = calibrate(1);
  b["fc1"]["input"].spec.qtype = qint8;
  try {
    merge_calibration_dumps({a, b});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fc1/input'"), std::string::npos) << e.what();
  }
  b = calibrate(1);
  b["fc1"]["input"] = b["fc2"]["input"];  // histogram vs minmax
  EXPECT_THROW(merge_calibration_dumps({a, b}), Error);
}

TEST(CalibrationDump, MergesThatOverflowAreRefusedBeforeAnythingIsWritten) {
  TempDir dir;
  CalibrationDump dump = calibrate(0);
  // Counts near the top of int64 (a dump merged with itself many times over).
  for (auto& [module, pts] : dump)
    for (auto& [point, e] : pts) e.state["count"] = at::scalar_tensor(std::numeric_limits<int64_t>::max() / 2 + 1, at::kLong);
  save_calibration_dump(dir.file("big.h5"), dump);
  const CalibrationDump big = load_calibration_dump(dir.file("big.h5"));
  try {
    merge_calibration_dumps({big, big});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overflow int64"), std::string::npos) << e.what();
  }
  // Histogram counts that would sum to inf: the merged state would not load, so no merge.
  CalibrationDump hist;
  for (const auto& [module, pts] : calibrate(0))
    for (const auto& [point, e] : pts)
      if (e.observer_kind == "histogram") {
        CalibrationEntry h = e;
        h.state["histogram"] = at::full_like(h.state.at("histogram"), 3e38f);
        hist[module][point] = h;
      }
  ASSERT_FALSE(hist.empty());
  EXPECT_THROW(merge_calibration_dumps({hist, hist}), Error);
}

TEST(CalibrationDump, LayerErrorsRoundTripInTheirOrderAndStayOutOfThePoints) {
  TempDir dir;
  LayerErrorTable t;
  t.batches = 4;
  t.layers.push_back({"fc2", "Linear", "", {{"accumulated_sqnr_db", 12.5}, {"clipped_fraction", 0.25}}});
  t.layers.push_back({"", "Linear", "", {{"own_sqnr_db", std::numeric_limits<double>::infinity()}}});  // the root layer
  t.layers.push_back({"emb", "Embedding", "no inputs: output errors not measured",
                      {{"weight_sqnr_db", 40.0}, {"own_sqnr_db", std::nan("")}}});
  const CalibrationDump dump = calibrate(0);
  save_calibration_dump(dir.file("e.h5"), dump, nullptr, &t);
  const std::optional<LayerErrorTable> back = load_layer_errors(dir.file("e.h5"));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->batches, 4);
  ASSERT_EQ(back->layers.size(), 3u);
  EXPECT_EQ(back->layers[0].path, "fc2");  // worst first, as written (not by name)
  EXPECT_EQ(back->layers[1].path, "");
  EXPECT_EQ(back->layers[2].path, "emb");
  EXPECT_EQ(back->layers[0].values.at("accumulated_sqnr_db"), 12.5);
  EXPECT_TRUE(std::isinf(back->layers[1].values.at("own_sqnr_db")));
  EXPECT_TRUE(std::isnan(back->layers[2].values.at("own_sqnr_db")));
  EXPECT_EQ(back->layers[2].note, "no inputs: output errors not measured");
  EXPECT_EQ(load_calibration_dump(dir.file("e.h5")).size(), dump.size());  // not read as a module
  save_calibration_dump(dir.file("none.h5"), dump);
  EXPECT_FALSE(load_layer_errors(dir.file("none.h5")).has_value());
}

TEST(CalibrationDump, ObserverThatSawNothingHasNoQparams) {
  TempDir dir;
  CalibrationDump dump;
  dump["m"]["input"] = make_calibration_entry(*make_observer("minmax"), {}, QSpec{});
  save_calibration_dump(dir.file("c.h5"), dump);
  const CalibrationDump back = load_calibration_dump(dir.file("c.h5"));
  EXPECT_FALSE(back.at("m").at("input").qparams.defined());
  EXPECT_EQ(h5::File::open(dir.file("c.h5")).root().open_group("m").open_group("input").has("qparams"), false);
}

TEST(CalibrationDump, PointsCarryOnlyTheirKindsOptionsPlusBinEdgesAndClipRange) {
  TempDir dir;
  CalibrationDump dump;
  QSpec s8;
  s8.symmetric = true;
  auto hist = make_observer("histogram");
  hist->update(at::linspace(-3, 5, 1000));
  auto mm = make_observer("minmax");
  mm->update(at::linspace(-1, 2, 100));
  dump["m"]["input"] = make_calibration_entry(*hist, {}, s8);
  dump["m"]["other"] = make_calibration_entry(*mm, {}, s8);
  save_calibration_dump(dir.file("c.h5"), dump);
  const h5::Group m = h5::File::open(dir.file("c.h5")).root().open_group("m");
  const h5::Group h = m.open_group("input"), n = m.open_group("other");
  EXPECT_TRUE(h.has_attr("bins") && h.has_attr("method"));
  EXPECT_FALSE(h.has_attr("averaging_constant") || h.has_attr("percentile") || h.has_attr("ch_axis"));
  EXPECT_FALSE(n.has_attr("bins") || n.has_attr("method") || n.has_attr("averaging_constant"));
  const at::Tensor edges = h.read_tensor("bin_edges");
  ASSERT_EQ(edges.numel(), ObserverOptions{}.bins + 1);
  EXPECT_FLOAT_EQ(edges[0].item<float>(), -3.0f);
  EXPECT_FLOAT_EQ(edges[-1].item<float>(), 5.0f);
  const h5::Group qp = n.open_group("qparams");
  const float s = qp.read_tensor("scale").item<float>();
  EXPECT_FLOAT_EQ(qp.read_tensor("clip_max").item<float>(), 127 * s);
  EXPECT_FLOAT_EQ(qp.read_tensor("clip_min").item<float>(), -128 * s);
  // The derived datasets are not state: the dump reads back to the same observers.
  expect_same_dump(dump, load_calibration_dump(dir.file("c.h5")));
}

TEST(CalibrationDump, ForeignNewerAndTruncatedFilesGiveClearErrors) {
  TempDir dir;
  auto expect_error = [](const std::string& path, const std::string& needle) {
    try {
      load_calibration_dump(path);
      FAIL() << "expected an error for " << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  {
    h5::File f = h5::File::create(dir.file("foreign.h5"));
    f.root().write_tensor("x", at::ones({3}));
    f.close();
  }
  expect_error(dir.file("foreign.h5"), "without qforge's 'format' attribute");
  {
    h5::File f = h5::File::create(dir.file("newer.h5"));
    write_format(f.root(), kCalibrationFormat, kCalibrationFormatVersion + 1);
    f.close();
  }
  expect_error(dir.file("newer.h5"), "written by a newer qforge");
  save_calibration_dump(dir.file("good.h5"), calibrate(0));
  std::vector<char> bytes = testing::read_bytes(dir.file("good.h5"));
  bytes.resize(bytes.size() / 2);
  testing::write_bytes(dir.file("truncated.h5"), bytes);
  expect_error(dir.file("truncated.h5"), dir.file("truncated.h5"));
  // A state the observer kind rejects names the group.
  CalibrationDump bad = calibrate(0);
  bad["fc1"]["weight"].state.erase("max");
  save_calibration_dump(dir.file("bad.h5"), bad);
  expect_error(dir.file("bad.h5"), "group '/fc1/weight'");
  // A histogram point declaring 2^30 bins over its small stored histogram: refused before the
  // observer allocates 4 GiB of counts.
  CalibrationDump huge = calibrate(0);
  bool declared = false;
  for (auto& [module, pts] : huge)
    for (auto& [point, e] : pts)
      if (e.observer_kind == "histogram") e.options.bins = int64_t{1} << 30, declared = true;
  ASSERT_TRUE(declared);
  save_calibration_dump(dir.file("huge_bins.h5"), huge);
  expect_error(dir.file("huge_bins.h5"), "bins must be <= 1048576, got 1073741824");
}

}  // namespace
}  // namespace qforge::io
