// MXFP4 / NVFP4 weights in layers: schemes that ask another block are refused, the fake-quant
// forward is the block format, freeze packs codes and scale bytes that dequantize exactly to the
// fake-quant weight, checkpoints round-trip, and foreign or truncated entries are refused.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>

#include "fake_quant/fake_quantize.h"
#include "fake_quant/microscaling.h"
#include "framework/api/quantize.h"
#include "framework/api/quantized_tensor.h"
#include "framework/core/error.h"
#include "framework/format/hdf5.h"
#include "framework/io/calibration_io.h"
#include "framework/io/checkpoint.h"
#include "framework/io/model_io.h"
#include "framework/nn/conv.h"
#include "framework/nn/linear.h"
#include "tests/error_of.h"

using namespace qforge;
using qforge::testing::error_of;
namespace h5 = qforge::io::h5;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A Linear with planted outlier input channels, so blocks have different scales.
nn::Linear make_linear(int64_t in, int64_t out, uint64_t seed) {
  at::manual_seed(seed);
  nn::Linear lin(in, out);
  lin->eval();
  at::NoGradGuard g;
  lin->weight.mul_(at::exp(at::randn({1, in}) * 1.5));
  return lin;
}

}  // namespace

TEST(Mxfp4Nvfp4Layers, SchemesAskingAnotherBlockOrDimensionAreRefusedWithTheReason) {
  for (const QType* q : {&qmxfp4, &qnvfp4}) {
    nn::Linear lin = make_linear(64, 8, 1);
    Scheme s(*q);
    EXPECT_EQ(s.group_size, q->block_size);
    s.group_size = 64;
    EXPECT_TRUE(contains(error_of([&] { quantize(lin, s); }), "fixed by the format")) << q->name;
    nn::Linear odd = make_linear(40, 8, 1);
    const std::string e = error_of([&] { quantize(odd, Scheme(*q)); });
    EXPECT_TRUE(contains(e, "multiple of " + std::to_string(q->block_size))) << e;
    Scheme act(qint4);
    act.activations = ActivationMode::kStatic;
    act.activation_qtype = *q;
    EXPECT_TRUE(contains(error_of([&] { quantize(lin, act); }), "weight-only")) << q->name;
  }
}

TEST(Mxfp4Nvfp4Layers, ConvolutionsRulesAndFixedGridsFollowTheFormat) {
  // A convolution has no Linear input dimension for the blocks: refused, naming the way out.
  nn::Conv2d conv(torch::nn::Conv2dOptions(32, 8, 3));
  const std::string ec = error_of([&] { quantize(conv, Scheme(qmxfp4)); });
  EXPECT_TRUE(contains(ec, "needs a Linear or Embedding input dimension") && contains(ec, "keep it float")) << ec;
  // A rule naming a microscaling qtype gets the format's block over a per-channel base scheme.
  for (const QType* q : {&qmxfp4, &qnvfp4}) {
    nn::Linear lin = make_linear(64, 8, 1);
    Scheme s(qint8);
    LayerRule r;
    r.pattern = "*";
    r.weights = *q;
    s.rules.push_back(r);
    quantize(lin, s);
    const QSpec& spec = lin->weight_quantizer()->config().spec;
    EXPECT_EQ(spec.qtype, *q);
    EXPECT_EQ(spec.granularity, Granularity::kPerGroup);
    EXPECT_EQ(spec.group_size, q->block_size);
    // No fixed grid can be set: the block scales follow the weight.
    const QParams qp = lin->weight_quantizer()->qparams(lin->weight);
    EXPECT_TRUE(contains(error_of([&] { lin->weight_quantizer()->set_qparams(qp); }), "no fixed grid to set"));
  }
}

TEST(Mxfp4Nvfp4Layers, FakeQuantForwardUsesTheBlockFormatOfTheCurrentWeight) {
  for (const QType* q : {&qmxfp4, &qnvfp4}) {
    nn::Linear lin = make_linear(128, 24, 2);
    quantize(lin, Scheme(*q));
    const at::Tensor x = at::randn({5, 128});
    at::NoGradGuard g;
    const at::Tensor want = at::linear(x, fake_quantize_microscaling(lin->weight, microscaling_spec(*q)), lin->bias);
    EXPECT_TRUE(at::equal(lin(x), want)) << q->name;
    lin->weight.mul_(3.0);  // scales follow the weight (the format's definition), not a calibrated grid
    const at::Tensor want3 = at::linear(x, fake_quantize_microscaling(lin->weight, microscaling_spec(*q)), lin->bias);
    EXPECT_TRUE(at::equal(lin(x), want3)) << q->name;
  }
}

TEST(Mxfp4Nvfp4Layers, FreezePacksNibblesAndScaleBytesThatDequantizeExactly) {
  for (const QType* q : {&qmxfp4, &qnvfp4}) {
    for (const int64_t M : {1, 7}) {
      nn::Linear lin = make_linear(96, 40, 3);
      quantize(lin, Scheme(*q));
      const at::Tensor wq = fake_quantize_microscaling(lin->weight.detach(), microscaling_spec(*q));
      const at::Tensor x = at::randn({M, 96});
      at::Tensor y_fq;
      {
        at::NoGradGuard g;
        y_fq = lin(x);
      }
      freeze(lin);
      const QuantizedTensor fw = lin->frozen_weight();
      ASSERT_TRUE(fw.data.defined()) << q->name;
      EXPECT_EQ(fw.data.scalar_type(), at::kByte);
      EXPECT_EQ(fw.data.numel(), 40 * 96 / 2);  // two E2M1 codes per byte
      EXPECT_EQ(fw.scale.scalar_type(), at::kByte);
      EXPECT_EQ(fw.scale.sizes().vec(), (std::vector<int64_t>{40, 96 / q->block_size}));
      EXPECT_EQ(fw.tensor_scale.defined(), q == &qnvfp4);
      EXPECT_FALSE(fw.zero_point.defined());
      EXPECT_TRUE(at::equal(fw.dequantize(), wq)) << q->name;
      EXPECT_TRUE(at::equal(pack_quantized(fw.int_values(), fw.qparams()).data, fw.data)) << q->name;
      const at::Tensor y = lin(x);
      EXPECT_LE((y - y_fq).abs().max().item<float>(), 1e-5f * y_fq.abs().max().item<float>()) << q->name;
      EXPECT_FALSE(lin->report().kernel.empty());
      // The stored form: nibbles, one scale byte per block, nvfp4's float32 tensor scale.
      EXPECT_EQ(fw.bytes(), estimate_memory(40 * 96, *q, q->block_size)) << q->name;
    }
  }
}

TEST(Mxfp4Nvfp4Layers, CheckpointsRoundTripFrozenOrNot) {
  const std::string dir = ::testing::TempDir();
  for (const QType* q : {&qmxfp4, &qnvfp4}) {
    for (const bool frozen : {false, true}) {
      nn::Linear a = make_linear(64, 16, 4);
      quantize(a, Scheme(*q));
      const at::Tensor x = at::randn({3, 64});
      if (frozen) freeze(a);
      const std::string path = dir + "/fp4_" + q->name + std::to_string(frozen) + ".h5";
      io::save_model(a, path);
      nn::Linear b = make_linear(64, 16, 99);
      io::load_model(b, path);
      EXPECT_EQ(b->frozen(), frozen);
      EXPECT_TRUE(at::equal(b(x).detach(), a(x).detach())) << q->name << " frozen " << frozen;
      if (frozen) {
        EXPECT_TRUE(at::equal(b->frozen_weight().scale, a->frozen_weight().scale));
      }
      std::filesystem::remove(path);
    }
  }
}

namespace {

// An mxfp4 Linear and an nvfp4 Linear (by rule) behind static int8 activations.
struct TwoFormats : torch::nn::Module {
  TwoFormats() : fc1(register_module("fc1", make_linear(64, 32, 7))), fc2(register_module("fc2", make_linear(32, 8, 8))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(at::relu(fc1(x))); }
  nn::Linear fc1, fc2;
};

Scheme two_formats_scheme() {
  Scheme s(qmxfp4);
  s.activations = ActivationMode::kStatic;
  LayerRule r;
  r.pattern = "fc2";
  r.weights = qnvfp4;
  s.rules.push_back(r);
  return s;
}

}  // namespace

// A run's calibration.h5 with MX weights reads back and merges: the weight points are left out
// (their scales follow the weight), the int8 activation points round-trip.
TEST(Mxfp4Nvfp4Layers, CalibrationDumpsOfMicroscalingWeightsLoadAndMerge) {
  const std::string path = ::testing::TempDir() + "/fp4_calibration.h5";
  auto a = std::make_shared<TwoFormats>();
  quantize(*a, two_formats_scheme());
  {
    Calibration c(*a);
    for (int i = 0; i < 3; ++i) a->forward(at::randn({4, 64}));
  }
  io::save_calibration(*a, path);
  const io::CalibrationDump dump = io::load_calibration_dump(path);
  for (const char* layer : {"fc1", "fc2"}) {
    ASSERT_TRUE(dump.count(layer)) << layer;
    EXPECT_TRUE(dump.at(layer).count("input")) << layer;
    EXPECT_FALSE(dump.at(layer).count("weight")) << layer;
  }
  const io::CalibrationDump merged = io::merge_calibration_dumps({dump, dump});
  EXPECT_TRUE(at::equal(merged.at("fc1").at("input").qparams.scale, dump.at("fc1").at("input").qparams.scale));
  io::save_calibration_dump(path, merged);  // as `qdump merge` writes it
  auto b = std::make_shared<TwoFormats>();
  quantize(*b, two_formats_scheme());
  io::load_calibration(*b, path);
  freeze(*a);
  freeze(*b);
  const at::Tensor x = at::randn({3, 64});
  EXPECT_TRUE(at::equal(b->forward(x), a->forward(x)));
  std::filesystem::remove(path);
}

namespace {

// Writes `q` as a checkpoint's quantized group, after `edit` changes the group, and reads it back.
std::string read_back_error(const QuantizedTensor& q, const std::function<void(const h5::Group&)>& edit) {
  const std::string path = ::testing::TempDir() + "/fp4_foreign.h5";
  {
    h5::File f = h5::File::create(path);
    const h5::Group g = f.root().create_group("w");
    g.set_attr("qtype", q.qtype().name);
    g.set_attr("bits", q.qtype().bits);
    g.set_attr("granularity", to_string(q.spec.granularity));
    g.set_attr("axis", q.spec.axis);
    g.set_attr("group_size", q.spec.group_size);
    g.set_attr("shape", q.shape);
    g.set_attr("packing", q.packing());
    edit(g);
    f.close();
  }
  const std::string e = error_of([&] { io::read_quantized_group(h5::File::open(path).root().open_group("w"), "w"); });
  std::filesystem::remove(path);
  return e;
}

}  // namespace

TEST(Mxfp4Nvfp4Layers, ForeignOrTruncatedEntriesAreRefusedClearly) {
  nn::Linear mx = make_linear(64, 8, 5), nv = make_linear(64, 8, 5);
  quantize(mx, Scheme(qmxfp4));
  quantize(nv, Scheme(qnvfp4));
  freeze(mx);
  freeze(nv);
  const QuantizedTensor m = mx->frozen_weight(), n = nv->frozen_weight();
  auto full = [](const QuantizedTensor& q) {
    return [q](const h5::Group& g) {
      g.write_tensor("data", q.data);
      g.write_tensor("scale", q.scale);
      if (q.tensor_scale.defined()) g.write_tensor("tensor_scale", q.tensor_scale);
    };
  };
  EXPECT_EQ(read_back_error(m, full(m)), "");
  EXPECT_EQ(read_back_error(n, full(n)), "");
  // Truncated codes.
  EXPECT_TRUE(contains(read_back_error(m, [&](const h5::Group& g) {
    g.write_tensor("data", m.data.narrow(0, 0, 100).clone());
    g.write_tensor("scale", m.scale);
  }), "bytes"));
  // Float scales (a foreign writer's), the E8M0 NaN code, a missing tensor scale.
  EXPECT_TRUE(contains(read_back_error(m, [&](const h5::Group& g) {
    g.write_tensor("data", m.data);
    g.write_tensor("scale", m.qparams().scale);
  }), "uint8 E8M0"));
  EXPECT_TRUE(contains(read_back_error(m, [&](const h5::Group& g) {
    g.write_tensor("data", m.data);
    g.write_tensor("scale", at::full_like(m.scale, 255));
  }), "NaN code 255"));
  EXPECT_TRUE(contains(read_back_error(n, [&](const h5::Group& g) {
    g.write_tensor("data", n.data);
    g.write_tensor("scale", n.scale);
  }), "tensor_scale"));
  // Another block size than the format's.
  QuantizedTensor wrong = m;
  wrong.spec.group_size = 16;
  EXPECT_TRUE(contains(read_back_error(wrong, [&](const h5::Group& g) {
    g.write_tensor("data", m.data);
    g.write_tensor("scale", at::zeros({8, 4}, at::kByte));
  }), "fixed by the format"));
}

// QParams from elsewhere with a zero, infinite or NaN block scale (or tensor scale) are refused
// before any encoding (E8M0's exponent of such a number is undefined).
TEST(Mxfp4Nvfp4Layers, PackingRefusesNonFiniteOrNonPositiveScales) {
  for (const QType* q : {&qmxfp4, &qnvfp4}) {
    nn::Linear lin = make_linear(32, 4, 6);
    quantize(lin, Scheme(*q));
    freeze(lin);
    const QuantizedTensor fw = lin->frozen_weight();
    for (const float bad : {0.0f, -1.0f, INFINITY, NAN}) {
      QParams qp = fw.qparams();
      qp.scale = qp.scale.clone();
      qp.scale.view(-1)[0] = bad;
      const std::string e = error_of([&] { pack_quantized(fw.int_values(), qp); });
      EXPECT_TRUE(contains(e, "is not a finite positive number")) << q->name << " " << bad << ": " << e;
      if (q == &qnvfp4) {
        QParams qg = fw.qparams();
        qg.tensor_scale = at::full({}, bad, at::kFloat);
        const std::string eg = error_of([&] { pack_quantized(fw.int_values(), qg); });
        EXPECT_TRUE(contains(eg, "tensor scale")) << bad << ": " << eg;
      }
    }
  }
}

// Frozen layers run the fp4 weight-only kernels (kernels/cpu/fp4_linear.h): within the stated
// bound of the fake-quant product, |y - y_fq| <= 2 gamma_(K+2) (sum_k |x_k| |w_k| + |b|),
// gamma_n = n u / (1 - n u), u = 2^-24.
TEST(Mxfp4Nvfp4Layers, FrozenLayersRunTheFp4KernelWithinTheSummationBound) {
  for (const QType* q : {&qmxfp4, &qnvfp4}) {
    for (const int64_t M : {1, 3, 33}) {
      nn::Linear lin = make_linear(256, 48, 6);
      quantize(lin, Scheme(*q));
      const at::Tensor wq = fake_quantize_microscaling(lin->weight.detach(), microscaling_spec(*q));
      const at::Tensor b = lin->bias.detach().clone();
      const at::Tensor x = at::randn({M, 256});
      freeze(lin);
      EXPECT_EQ(lin->plan().path, LinearPath::kFp4WeightOnly) << q->name;
      if (M == 1) {
        EXPECT_NE(lin->report().kernel.find("fp4"), std::string::npos) << lin->report().kernel;
      }
      const at::Tensor y = lin(x).detach();
      const double u = std::ldexp(1.0, -24), gamma = 258 * u / (1 - 258 * u);
      const at::Tensor bound = 2 * gamma * (at::linear(x.abs(), wq.abs()) + b.abs());
      EXPECT_TRUE(at::le((y - at::linear(x, wq, b)).abs(), bound).all().item<bool>()) << q->name << " M=" << M;
    }
  }
}

namespace {
double sqnr_db(const at::Tensor& w, const at::Tensor& wq) {
  return 10.0 * std::log10(w.pow(2).sum().item<double>() / (w - wq).pow(2).sum().item<double>());
}
}  // namespace

// SQNR of the 4-bit formats on a Llama-8B-shaped projection [4096, 4096] (Gaussian, std 0.02)
// with 16 planted outlier input channels (x20): docs/formats.md quotes the printed table.
// Run: build/tests/fake_quant/fp4_layers_test --gtest_filter='*Sqnr*'
TEST(Mxfp4Nvfp4Layers, SqnrBesideInt4OnALlamaShapedWeightWithOutliers) {
  at::manual_seed(35);
  at::Tensor w = at::randn({4096, 4096}) * 0.02;
  const at::Tensor cols = at::randperm(4096).slice(0, 0, 16);
  w.index_put_({at::indexing::Slice(), cols}, w.index({at::indexing::Slice(), cols}) * 20);
  std::map<std::string, double> db;
  for (const QType* q : {&qmxfp4, &qnvfp4}) db[q->name] = sqnr_db(w, fake_quantize_microscaling(w, microscaling_spec(*q)));
  for (const int64_t g : {32, 16}) {
    for (const bool sym : {true, false}) {
      QSpec s;
      s.qtype = qint4;
      s.granularity = Granularity::kPerGroup;
      s.group_size = g;
      s.symmetric = sym;
      const std::string name = std::string("int4 g") + std::to_string(g) + (sym ? " symmetric" : " asymmetric");
      db[name] = sqnr_db(w, fake_quantize(w, weight_minmax_qparams(w, s, "sqnr")));
    }
  }
  for (const auto& [name, v] : db) std::printf("SQNR %-22s %6.2f dB\n", name.c_str(), v);
  // NVFP4's finer blocks and E4M3 scales beat MXFP4's power-of-two scales on the same elements.
  EXPECT_GT(db["nvfp4"], db["mxfp4"]);
  for (const auto& [name, v] : db) EXPECT_GT(v, 10.0) << name;
}
