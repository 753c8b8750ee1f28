// Committed format fixtures (tests/fixtures/*_v1.h5) load bit for bit, forever: a reader of every
// later qforge must keep reading format_version 1 files.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "framework/io/calibration_dump.h"
#include "framework/io/checkpoint.h"
#include "tests/io/io_fixtures.h"
#include "tests/io/io_test_util.h"
#include "tests/paths.h"

namespace qforge::io {
namespace {

using testing::same_tensor;

const std::string kDir = QFORGE_FIXTURES_DIR;

TEST(Fixtures, CheckpointV1LoadsBitForBit) {
  const CheckpointReader r(kDir + "/checkpoint_v1.h5");
  EXPECT_EQ(r.format_version(), 1);
  const CheckpointData expected = testing::checkpoint_v1();
  const CheckpointData d = r.read();
  EXPECT_EQ(d.step, expected.step);
  EXPECT_EQ(d.recipe, expected.recipe);
  EXPECT_EQ(d.optimizer_kind, expected.optimizer_kind);
  auto same_map = [](const auto& a, const auto& b) {
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [k, t] : a) {
      ASSERT_TRUE(b.count(k)) << k;
      EXPECT_TRUE(same_tensor(t, b.at(k))) << k;
    }
  };
  same_map(d.parameters, expected.parameters);
  same_map(d.buffers, expected.buffers);
  same_map(d.optimizer, expected.optimizer);
  ASSERT_EQ(d.quantized.size(), expected.quantized.size());
  for (const auto& [k, q] : expected.quantized) {
    const QuantizedTensor& got = d.quantized.at(k);
    EXPECT_EQ(got.spec.qtype, q.spec.qtype) << k;
    EXPECT_EQ(got.spec.granularity, q.spec.granularity) << k;
    EXPECT_EQ(got.spec.axis, q.spec.axis) << k;
    EXPECT_EQ(got.spec.group_size, q.spec.group_size) << k;
    EXPECT_EQ(got.shape, q.shape) << k;
    EXPECT_TRUE(same_tensor(got.data, q.data)) << k;
    EXPECT_TRUE(same_tensor(got.scale, q.scale)) << k;
    EXPECT_TRUE(same_tensor(got.zero_point, q.zero_point)) << k;
    EXPECT_TRUE(same_tensor(got.dequantize(), q.dequantize())) << k;
  }
}

TEST(Fixtures, CalibrationV1LoadsBitForBit) {
  const CalibrationDump d = load_calibration_dump(kDir + "/calibration_v1.h5");
  const CalibrationDump expected = testing::calibration_v1();
  ASSERT_EQ(d.size(), expected.size());
  for (const auto& [module, pts] : expected) {
    for (const auto& [point, e] : pts) {
      const CalibrationEntry& got = d.at(module).at(point);
      const std::string what = module + "/" + point;
      EXPECT_EQ(got.observer_kind, e.observer_kind) << what;
      EXPECT_EQ(got.spec.to_string(), e.spec.to_string()) << what;
      EXPECT_EQ(got.options.bins, e.options.bins) << what;
      EXPECT_EQ(got.options.method, e.options.method) << what;
      EXPECT_EQ(got.options.percentile, e.options.percentile) << what;
      ASSERT_EQ(got.state.size(), e.state.size()) << what;
      for (const auto& [name, t] : e.state) EXPECT_TRUE(same_tensor(got.state.at(name), t)) << what << " " << name;
      ASSERT_EQ(got.qparams.defined(), e.qparams.defined()) << what;
      if (e.qparams.defined()) {
        EXPECT_TRUE(same_tensor(got.qparams.scale, e.qparams.scale)) << what;
        EXPECT_TRUE(same_tensor(got.qparams.zero_point, e.qparams.zero_point)) << what;
      }
    }
  }
}

}  // namespace
}  // namespace qforge::io
