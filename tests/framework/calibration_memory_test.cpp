// A Calibration's forwards keep no fake-quantized weight: with the eval-mode cache on, every
// layer's forward would leave a float copy of its weight behind (twice the float model at the end
// of the first calibration batch); while the guard is alive the cache is off, after it is back on.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "fake_quant/fake_quantize.h"
#include "framework/api/quantize.h"
#include "framework/api/quantized_tensor.h"
#include "framework/api/quantizer.h"
#include "framework/nn/embedding.h"
#include "framework/nn/linear.h"

using namespace qforge;

namespace {

Scheme static_w8a8() {
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  return s;
}

// References to the weight's TensorImpl besides the layer's own: the cache holds one.
int64_t extra_refs(const nn::Linear& lin) { return static_cast<int64_t>(lin->weight.use_count()); }

}  // namespace

TEST(Calibration, ForwardsKeepNoFakeQuantizedWeightAndTheCacheReturnsAfter) {
  at::manual_seed(3);
  nn::Linear lin(32, 16);
  quantize(lin, static_w8a8());
  lin->eval();
  const at::Tensor x = at::randn({8, 32});
  const int64_t alone = extra_refs(lin);
  ASSERT_TRUE(lin->weight_quantizer()->weight_cache());
  at::Tensor during;
  {
    Calibration calib(lin);
    EXPECT_FALSE(lin->weight_quantizer()->weight_cache());
    during = lin(x);
    lin(x);
    EXPECT_EQ(extra_refs(lin), alone) << "a calibration forward left a cache referring to the weight";
  }
  EXPECT_TRUE(lin->weight_quantizer()->weight_cache());
  // Calibration ran float activations through the fake-quantized weight, as with the cache on.
  const QParams wq = lin->weight_quantizer()->qparams(lin->weight);
  EXPECT_TRUE(at::equal(during, at::linear(x, fake_quantize(lin->weight, wq), lin->bias)));
  {
    at::NoGradGuard g;
    lin(x);
  }
  EXPECT_EQ(extra_refs(lin), alone + 1) << "the eval cache is not back on after the calibration";
}

// A cache the caller turned off stays off after the guard; a guard whose forward throws still
// turns the cache back on.
TEST(Calibration, LeavesACacheTheCallerTurnedOffAndRestoresAfterAThrow) {
  at::manual_seed(4);
  nn::Linear a(8, 8), b(8, 8);
  quantize(a, static_w8a8());
  quantize(b, static_w8a8());
  a->eval();
  b->eval();
  a->weight_quantizer()->set_weight_cache(false);
  { Calibration calib(a); a(at::randn({2, 8})); }
  EXPECT_FALSE(a->weight_quantizer()->weight_cache());
  try {
    Calibration calib(b);
    b(at::randn({2, 8}));
    throw std::runtime_error("a data loader failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(b->weight_quantizer()->weight_cache());
}

// Inside a Calibration an Embedding fake-quantizes only the rows it looks up, with qparams from
// the whole table: the same values as fake-quantizing the table, for every grid that allows it.
TEST(Calibration, EmbeddingLooksUpFakeQuantizedRowsAsTheWholeTableGives) {
  struct Case {
    QType q;
    Granularity g;
    int64_t group;
    bool symmetric;
  };
  for (const Case& c : {Case{qint8, Granularity::kPerChannel, 0, true}, Case{qint8, Granularity::kPerTensor, 0, false},
                        Case{qint4, Granularity::kPerGroup, 16, false}, Case{qint4, Granularity::kPerChannel, 0, true}}) {
    at::manual_seed(5);
    nn::Embedding emb(50, 32);
    Scheme s(c.q);
    s.weight_granularity = c.g;
    s.group_size = c.group;
    s.weight_symmetric = c.symmetric;
    quantize(emb, s);
    emb->eval();
    const at::Tensor idx = at::randint(0, 50, {3, 7});
    at::Tensor whole;
    {
      at::NoGradGuard g;
      whole = emb(idx);  // the cached table's rows
    }
    Calibration calib(emb);
    const at::Tensor rows = emb->weight_quantizer()->weight_rows(emb->weight, idx);
    ASSERT_TRUE(rows.defined()) << c.q.name;
    EXPECT_TRUE(at::equal(rows.reshape(whole.sizes()), whole)) << c.q.name;
    EXPECT_TRUE(at::equal(emb(idx), whole)) << c.q.name << " " << static_cast<int>(c.g);
    EXPECT_TRUE(at::equal(emb(idx.to(at::kInt)), whole)) << c.q.name;
    EXPECT_THROW(emb(at::tensor({50})), c10::Error);  // an index past the table, as at::embedding
    // Indices the whole-table path refuses are left to it.
    EXPECT_FALSE(emb->weight_quantizer()->weight_rows(emb->weight, idx.to(at::kFloat)).defined());
  }
}

// Nested guards on one model: the cache stays paused until the outer one ends (the pauses are
// counted; each guard resumes only its own).
TEST(Calibration, NestedGuardsKeepTheCachePausedUntilTheOuterEnds) {
  nn::Linear lin(8, 8);
  quantize(lin, static_w8a8());
  lin->eval();
  {
    Calibration outer(lin);
    {
      Calibration inner(lin);
      lin(at::randn({2, 8}));
    }
    EXPECT_FALSE(lin->weight_quantizer()->weight_cache()) << "the inner guard ended while the outer is alive";
  }
  EXPECT_TRUE(lin->weight_quantizer()->weight_cache());
}

TEST(Calibration, WeightRowsDeclinesWhereRowsAloneWouldDiffer) {
  nn::Embedding emb(20, 16);
  quantize(emb, Scheme(qint8));
  emb->eval();
  const at::Tensor idx = at::arange(4);
  at::NoGradGuard g;
  EXPECT_FALSE(emb->weight_quantizer()->weight_rows(emb->weight, idx).defined()) << "the cache is on";
  emb->weight_quantizer()->set_weight_cache(false);
  EXPECT_TRUE(emb->weight_quantizer()->weight_rows(emb->weight, idx).defined());
  emb->train();
  EXPECT_FALSE(emb->weight_quantizer()->weight_rows(emb->weight, idx).defined()) << "training";
  emb->eval();
  Scheme lsq(qint8);
  lsq.weight_lsq = true;
  quantize(emb, lsq);
  emb->eval();
  emb->weight_quantizer()->set_weight_cache(false);
  EXPECT_FALSE(emb->weight_quantizer()->weight_rows(emb->weight, idx).defined()) << "LSQ";
}

// quantize_to_int8 goes a block of rows at a time on large tensors (freeze's embedding tables):
// the codes equal the formula on the whole tensor.
TEST(Freeze, LargeTablesQuantizeByBlocksOfRowsToTheSameCodes) {
  at::manual_seed(6);
  const at::Tensor w = at::randn({3001, 700});  // 2.1 M elements, rows not a multiple of a block
  const auto reference = [&](const QParams& qp) {
    const at::Tensor x = grouped(w, qp.spec);
    const at::Tensor s = broadcast_qparam(qp.scale.to(at::kFloat), w, qp.spec);
    const at::Tensor z = broadcast_qparam(qp.zero_point.to(at::kFloat), w, qp.spec);
    return at::clamp(at::round(x * at::reciprocal(s)) + z, qp.spec.quant_min(), qp.spec.quant_max())
        .to(at::kChar)
        .reshape(w.sizes());
  };
  for (const QSpec& spec : {QSpec{qint8, Granularity::kPerChannel, 0, 0, true}, QSpec{qint8, Granularity::kPerTensor, 0, 0, false},
                            QSpec{qint4, Granularity::kPerGroup, 0, 100, false}}) {
    const QParams qp = weight_minmax_qparams(w, spec, "w");
    EXPECT_TRUE(at::equal(quantize_to_int8(w, qp), reference(qp))) << spec.to_string();
  }
  // Per tensor with a zero point (the one-pass kernel takes zero point 0 only): the block path.
  const QParams affine{QSpec{qint8, Granularity::kPerTensor, 0, 0, false}, at::full({}, 0.02f), at::full({}, 3, at::kInt)};
  const at::Tensor codes = quantize_to_int8(w, affine);
  EXPECT_TRUE(at::equal(codes, reference(affine)));
  EXPECT_EQ(codes.max().item<int>(), 127);  // saturates: the block path clamps as the formula does
}

// A frozen int4 Linear keeps no qparams of its own: weight() rebuilds them from the kernel, equal
// to what quantize_tensor made, for asymmetric per-group, per-channel and one-row per-tensor grids.
TEST(Freeze, FrozenInt4WeightGivesBackTheQuantizedTensorItWasPackedFrom) {
  struct Case {
    QType q;
    Granularity g;
    int64_t group, rows;
    bool symmetric;
  };
  for (const Case& c : {Case{quint4, Granularity::kPerGroup, 32, 24, false}, Case{qint3, Granularity::kPerChannel, 0, 24, true},
                        Case{qint4, Granularity::kPerGroup, 32, 24, true}, Case{qint4, Granularity::kPerTensor, 0, 1, false}}) {
    at::manual_seed(7);
    nn::Linear lin(64, c.rows);
    Scheme s(c.q);
    s.weight_granularity = c.g;
    s.group_size = c.group;
    s.weight_symmetric = c.symmetric;
    quantize(lin, s);
    const QuantizedTensor want = quantize_tensor(lin->weight, lin->weight_quantizer()->qparams(lin->weight));
    freeze(lin);
    const QuantizedTensor got = lin->frozen_weight();
    const std::string what = std::string(c.q.name) + " " + want.spec.to_string();
    EXPECT_TRUE(at::equal(got.int_values(), want.int_values())) << what;
    EXPECT_TRUE(at::equal(got.scale, want.scale)) << what << got.scale.sizes() << want.scale.sizes();
    EXPECT_TRUE(at::equal(got.zero_point, want.zero_point)) << what;
    EXPECT_EQ(got.scale.scalar_type(), want.scale.scalar_type()) << what;
    EXPECT_EQ(got.zero_point.scalar_type(), want.zero_point.scalar_type()) << what;
  }
}
