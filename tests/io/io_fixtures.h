// Deterministic contents of the committed format fixtures (tests/fixtures/*_v1.h5) and of the
// checkpoints the tests write. Values come from integer arithmetic only (exact in float), so they
// do not depend on a random generator or libm that may change between LibTorch versions.
// NEVER change what the *_v1 builders return: tests/fixtures/*_v1.h5 were written from them and
// must keep loading bit for bit. A new format version gets new builders and new fixture files.
#pragma once

#include <ATen/ATen.h>

#include "framework/io/calibration_dump.h"
#include "framework/io/checkpoint.h"

namespace qforge::io::testing {

// Exactly representable float pattern: ((i * mul + add) % mod - mod / 2) / 16, shaped.
inline at::Tensor pattern(at::IntArrayRef shape, int64_t mul = 37, int64_t add = 11,
                          int64_t mod = 101) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  at::Tensor i = at::arange(n, at::kLong);
  return ((i * mul + add).remainder(mod) - mod / 2).to(at::kFloat).div(16).reshape(shape);
}

// Integer values inside [lo, hi], shaped.
inline at::Tensor int_pattern(at::IntArrayRef shape, int64_t lo, int64_t hi, int64_t mul = 7) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  at::Tensor i = at::arange(n, at::kLong);
  return ((i * mul + 3).remainder(hi - lo + 1) + lo).to(at::kInt).reshape(shape);
}

inline QParams fixture_qparams(QType qt, Granularity g, int64_t axis, int64_t group_size,
                               at::IntArrayRef shape) {
  QSpec spec;
  spec.qtype = qt;
  spec.granularity = g;
  spec.axis = axis;
  spec.group_size = group_size;
  const std::vector<int64_t> qshape = qparams_shape(spec, shape);
  int64_t n = 1;
  for (int64_t d : qshape) n *= d;
  // Scales k / 64 (exact), zero points cycling through the grid's lower half.
  at::Tensor scale = (at::arange(n, at::kFloat) + 1).div(64).reshape(qshape);
  at::Tensor zp = (at::arange(n, at::kLong).remainder(3) + (qt.is_signed ? -1 : qt.quant_max / 4))
                      .to(at::kInt)
                      .reshape(qshape);
  return make_qparams(spec, scale, zp);
}

inline QuantizedTensor fixture_quantized(QType qt, Granularity g, int64_t axis, int64_t group_size,
                                         at::IntArrayRef shape) {
  return pack_quantized(int_pattern(shape, qt.quant_min, qt.quant_max),
                        fixture_qparams(qt, g, axis, group_size, shape));
}

inline CheckpointData checkpoint_v1() {
  CheckpointData d;
  d.parameters["fc1.weight"] = pattern({8, 16});
  d.parameters["fc1.bias"] = pattern({8}, 5, 1, 17);
  d.parameters["temperature"] = pattern({}, 1, 40, 101);  // root-level, 0-dim
  d.parameters["emb.weight"] = pattern({4, 6}, 3, 2, 31).to(at::kHalf);
  d.parameters["proj.weight"] = pattern({3, 4}, 13, 5, 23).to(at::kDouble);
  d.quantized["enc.layer.0.q8.weight"] = fixture_quantized(qint8, Granularity::kPerChannel, 0, 0, {4, 8});
  d.quantized["enc.layer.0.qu8.weight"] = fixture_quantized(quint8, Granularity::kPerTensor, 0, 0, {3, 5});
  d.quantized["enc.layer.1.q4.weight"] = fixture_quantized(qint4, Granularity::kPerGroup, 0, 8, {4, 16});
  d.quantized["enc.layer.1.qu4.weight"] = fixture_quantized(quint4, Granularity::kPerChannel, 1, 0, {3, 5});
  d.quantized["enc.layer.2.q2.weight"] = fixture_quantized(qint2, Granularity::kPerTensor, 0, 0, {3, 5});
  d.buffers["bn.running_mean"] = pattern({8}, 9, 4, 19);
  d.buffers["bn.num_batches_tracked"] = at::scalar_tensor(int64_t{42}, at::kLong);
  d.buffers["mask"] = int_pattern({5}, 0, 1).to(at::kBool);
  d.buffers["bn.running_var"] = pattern({8}, 9, 4, 19).abs().add(1).to(at::kBFloat16);
  d.buffers["codes"] = int_pattern({2, 3}, -100, 100).to(at::kChar);
  d.optimizer["state.0.exp_avg"] = pattern({8, 16}, 11, 3, 29);
  d.optimizer["state.0.step"] = at::scalar_tensor(int64_t{1234}, at::kLong);
  d.optimizer_kind = "adam";
  d.step = 1234;
  d.recipe = "scheme: w4a8\nobserver: histogram\n";
  return d;
}

inline CalibrationDump calibration_v1() {
  CalibrationDump dump;
  {
    CalibrationEntry e;
    e.observer_kind = "minmax";
    e.state = {{"min", at::scalar_tensor(-2.5f)}, {"max", at::scalar_tensor(3.25f)},
               {"count", at::scalar_tensor(int64_t{1000}, at::kLong)},
               {"nonfinite_count", at::scalar_tensor(int64_t{3}, at::kLong)}};
    e.spec.qtype = quint8;
    e.qparams = make_qparams(e.spec, at::scalar_tensor(0.0225f), at::scalar_tensor(111, at::kInt));
    dump["fc1"]["input"] = e;
  }
  {
    CalibrationEntry e;
    e.observer_kind = "per_channel_minmax";
    e.options.ch_axis = 0;
    e.state = {{"min", -pattern({4}, 3, 1, 7).abs() - 1}, {"max", pattern({4}, 5, 2, 11).abs() + 1},
               {"count", at::scalar_tensor(int64_t{64}, at::kLong)},
               {"nonfinite_count", at::scalar_tensor(int64_t{0}, at::kLong)}};
    e.spec.qtype = qint8;
    e.spec.granularity = Granularity::kPerChannel;
    e.spec.symmetric = true;
    e.qparams = make_qparams(e.spec, (at::arange(4, at::kFloat) + 1).div(128),
                             at::zeros({4}, at::kInt));
    dump["fc1"]["weight"] = e;
  }
  {
    CalibrationEntry e;
    e.observer_kind = "histogram";
    e.options.bins = 64;
    e.options.method = HistogramMethod::kPercentile;
    e.options.percentile = 99.5;
    e.state = {{"min", at::scalar_tensor(-1.0f)}, {"max", at::scalar_tensor(3.0f)},
               {"histogram", int_pattern({64}, 0, 50).to(at::kFloat)},
               {"count", at::scalar_tensor(int_pattern({64}, 0, 50).sum().item<int64_t>(), at::kLong)},
               {"nonfinite_count", at::scalar_tensor(int64_t{1}, at::kLong)}};
    e.spec.qtype = quint8;
    e.qparams = make_qparams(e.spec, at::scalar_tensor(0.015625f), at::scalar_tensor(64, at::kInt));
    dump["encoder.layer.3.attention"]["output"] = e;
  }
  {
    CalibrationEntry e;  // an observer that never saw data: no qparams group
    e.observer_kind = "minmax";
    e.state = {{"min", at::scalar_tensor(INFINITY)}, {"max", at::scalar_tensor(-INFINITY)},
               {"count", at::scalar_tensor(int64_t{0}, at::kLong)},
               {"nonfinite_count", at::scalar_tensor(int64_t{0}, at::kLong)}};
    dump["unused"]["input"] = e;
  }
  return dump;
}

}  // namespace qforge::io::testing
