// k-means (codebook) weights: the 1-D weighted k-means against brute force, the nearest-level
// assignment, fake-quant gradients, quantize / freeze / describe on Linear, QAT of the levels,
// checkpoints into a fresh model, model_size and the errors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "fake_quant/codebook.h"
#include "fake_quant/fake_quantize.h"
#include "framework/core/error.h"
#include "framework/io/calibration_dump.h"
#include "framework/io/calibration_io.h"
#include "framework/io/model_io.h"
#include "framework/format/safetensors.h"
#include "framework/api/kmeans.h"
#include "framework/nn/conv.h"
#include "framework/nn/embedding.h"
#include "framework/nn/linear.h"
#include "framework/api/quantize.h"
#include "tests/error_of.h"

using namespace qforge;
using qforge::testing::error_of;

namespace {

// Weighted SSE of `v` [n] (weights w) against the nearest of `levels`.
double weighted_sse(const std::vector<double>& v, const std::vector<double>& w, const std::vector<double>& levels) {
  double sse = 0.0;
  for (size_t i = 0; i < v.size(); ++i) {
    double d = std::numeric_limits<double>::infinity();
    for (double l : levels) d = std::min(d, (v[i] - l) * (v[i] - l));
    sse += w[i] * d;
  }
  return sse;
}

// The optimal weighted k-means objective by brute force over every assignment of n values to k
// clusters (each cluster at its weighted mean).
double brute_force_sse(const std::vector<double>& v, const std::vector<double>& w, int k) {
  const size_t n = v.size();
  int64_t total = 1;
  for (size_t i = 0; i < n; ++i) total *= k;
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> a(n);
  for (int64_t code = 0; code < total; ++code) {
    int64_t c = code;
    for (size_t i = 0; i < n; ++i) {
      a[i] = static_cast<int>(c % k);
      c /= k;
    }
    std::vector<double> sw(k, 0.0), sv(k, 0.0);
    for (size_t i = 0; i < n; ++i) {
      sw[a[i]] += w[i];
      sv[a[i]] += w[i] * v[i];
    }
    double sse = 0.0;
    for (size_t i = 0; i < n; ++i) {
      const double m = sw[a[i]] > 0 ? sv[a[i]] / sw[a[i]] : 0.0;
      sse += w[i] * (v[i] - m) * (v[i] - m);
    }
    best = std::min(best, sse);
  }
  return best;
}

std::vector<double> to_vec(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous().flatten();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

double codebook_rel_error(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-12);
}

// A [rows, n] weight quantized per channel, fitted and returned as QParams with the fp16 levels.
QParams fitted(const at::Tensor& w, const QType& qt, Granularity g = Granularity::kPerChannel, int64_t group = 0) {
  QuantizerConfig c;
  c.spec.qtype = qt;
  c.spec.granularity = g;
  c.spec.group_size = group;
  Quantizer q(QuantizerImpl::Role::kWeight, c, ActivationMode::kNone, "w");
  q->fit_codebook(w);
  return q->qparams(w);
}

}  // namespace

TEST(KMeans1d, MatchesTheBruteForceOptimumOnTinyClusteredRows) {
  // Three clear clusters, with weights: k-means++ seeding then Lloyd finds the global optimum.
  const std::vector<std::vector<double>> rows{{-2.0, -1.9, -2.2, 0.1, 0.0, 3.0, 3.3, 2.9},
                                              {5.0, 5.5, -1.0, -1.2, 0.4, 0.5, 0.45, 5.2}};
  const std::vector<double> w{1.0, 2.0, 0.5, 1.0, 3.0, 1.0, 1.0, 0.25};
  at::Tensor values = at::empty({2, 8}, at::kFloat), imp = at::tensor(std::vector<float>(w.begin(), w.end()));
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 8; ++i) values[r][i] = static_cast<float>(rows[r][i]);
  const at::Tensor levels = kmeans_1d(values, 3, imp);
  ASSERT_EQ(levels.sizes(), at::IntArrayRef({2, 3}));
  for (int r = 0; r < 2; ++r) {
    const std::vector<double> v(to_vec(values[r]));
    const double got = weighted_sse(v, w, to_vec(levels[r]));
    const double opt = brute_force_sse(v, w, 3);
    EXPECT_NEAR(got, opt, 1e-5 * std::max(opt, 1.0)) << "row " << r;
    EXPECT_TRUE(at::equal(levels[r], std::get<0>(levels[r].sort())));  // ascending
  }
}

TEST(KMeans1d, RandomRowsEndAtALloydFixedPointAndAreDeterministic) {
  at::manual_seed(3);
  const at::Tensor values = at::randn({16, 200});
  const at::Tensor imp = at::rand({200}) + 0.1;
  const at::Tensor levels = kmeans_1d(values, 8, imp);
  for (int64_t r = 0; r < 16; ++r) {
    const std::vector<double> v = to_vec(values[r]), w = to_vec(imp), l = to_vec(levels[r]);
    // Each level is the weighted mean of the values nearest to it.
    std::vector<double> sw(8, 0.0), sv(8, 0.0);
    for (size_t i = 0; i < v.size(); ++i) {
      size_t best = 0;
      for (size_t j = 1; j < 8; ++j)
        if (std::abs(v[i] - l[j]) < std::abs(v[i] - l[best])) best = j;
      sw[best] += w[i];
      sv[best] += w[i] * v[i];
    }
    for (size_t j = 0; j < 8; ++j)
      if (sw[j] > 0) {
        EXPECT_NEAR(l[j], sv[j] / sw[j], 1e-5) << "row " << r << " level " << j;
      }
  }
  // Same seed, same result, whatever the thread count.
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor again = kmeans_1d(values, 8, imp);
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(levels, again));
}

TEST(KMeans1d, ImportancePullsLevelsTowardHeavyValuesAndBadInputIsAnError) {
  const at::Tensor v = at::tensor({0.0f, 1.0f, 2.0f, 3.0f}).reshape({1, 4});
  const at::Tensor heavy_end = at::tensor({1.0f, 1.0f, 1.0f, 100.0f});
  const at::Tensor l = kmeans_1d(v, 2, heavy_end);
  EXPECT_NEAR(l[0][1].item<float>(), 3.0f, 0.05f);  // the heavy value gets a level (almost) of its own
  EXPECT_NE(error_of([&] { kmeans_1d(at::tensor({NAN, 1.0f}).reshape({1, 2}), 2); }).find("NaN"), std::string::npos);
  EXPECT_NE(error_of([&] { kmeans_1d(v, 2, at::tensor({1.0f, -1.0f, 1.0f, 1.0f})); }).find(">= 0"), std::string::npos);
  EXPECT_NE(error_of([&] { kmeans_1d(v, 2, at::ones({3})); }).find("importance must be"), std::string::npos);
}

TEST(Codebook, AssignmentIsTheNearestLevelWithTiesToTheLowerIndex) {
  QSpec spec;
  spec.qtype = qkmeans2;
  spec.granularity = Granularity::kPerChannel;
  const at::Tensor x = at::tensor({-1.0f, 0.5f, 0.25f, 9.0f, 1.0f, 2.0f, 1.5f, -3.0f}).reshape({2, 4});
  const at::Tensor cb = at::tensor({-1.0f, 0.0f, 0.5f, 1.0f, 0.0f, 1.0f, 2.0f, 3.0f}).reshape({2, 4});
  const QParams qp = make_codebook_qparams(spec, cb, x.sizes());
  const at::Tensor codes = codebook_assign(x, qp);
  // 0.25 lies halfway between 0 and 0.5: the lower index wins. 1.5 likewise between 1 and 2.
  EXPECT_TRUE(at::equal(codes, at::tensor({0, 2, 1, 3, 1, 2, 1, 0}, at::kByte).reshape({2, 4}))) << codes;
  EXPECT_TRUE(at::equal(fake_quantize(x, qp), at::tensor({-1.0f, 0.5f, 0.0f, 1.0f, 1.0f, 2.0f, 1.0f, 0.0f}).reshape({2, 4})));
  EXPECT_NE(error_of([&] { codebook_assign(at::tensor({0.0f, NAN, 1.0f, 2.0f, 0.0f, 0.0f, 0.0f, 0.0f}).reshape({2, 4}), qp); })
                .find("not finite"),
            std::string::npos);
  // Levels must be float16 values.
  EXPECT_NE(error_of([&] { make_codebook_qparams(spec, cb + 1e-4f, x.sizes()); }).find("float16"), std::string::npos);
}

TEST(Codebook, GradientsAreStraightThroughInXAndSummedPerLevel) {
  QSpec spec;
  spec.qtype = qkmeans2;
  spec.granularity = Granularity::kPerChannel;
  const at::Tensor x = at::tensor({-0.9f, 0.4f, 0.6f, 1.2f, 0.1f, 2.2f}).reshape({2, 3}).requires_grad_(true);
  const at::Tensor cb = at::tensor({-1.0f, 0.0f, 0.5f, 1.0f, 0.0f, 1.0f, 2.0f, 3.0f}).reshape({2, 4}).requires_grad_(true);
  QParams qp;
  qp.spec = spec;
  qp.codebook = cb;
  const at::Tensor y = fake_quantize(x, qp);
  const at::Tensor dy = at::tensor({1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}).reshape({2, 3});
  y.backward(dy);
  EXPECT_TRUE(at::equal(x.grad(), dy));
  // Row 0: -0.9 -> 0, 0.4 -> 2, 0.6 -> 2; row 1: 1.2 -> 1, 0.1 -> 0, 2.2 -> 2.
  EXPECT_TRUE(at::equal(cb.grad(), at::tensor({1.0f, 0.0f, 5.0f, 0.0f, 5.0f, 4.0f, 6.0f, 0.0f}).reshape({2, 4})))
      << cb.grad();
}

TEST(Codebook, KMeansBeatsTheUniformGridOfTheSameBitsOnGaussianWeights) {
  at::manual_seed(11);
  const at::Tensor w = at::randn({64, 256});
  auto mse = [&](const at::Tensor& wq) { return (wq - w).pow(2).mean().item<double>(); };
  const double km4 = mse(fake_quantize(w, fitted(w, qkmeans4)));
  const double km3 = mse(fake_quantize(w, fitted(w, qkmeans3)));
  const double km2 = mse(fake_quantize(w, fitted(w, qkmeans2)));
  QSpec s4;
  s4.qtype = qint4;
  s4.granularity = Granularity::kPerChannel;
  s4.symmetric = false;
  QSpec s2 = s4;
  s2.qtype = qint2;
  const double u4 = mse(fake_quantize(w, weight_minmax_qparams(w, s4, "w")));
  const double u2 = mse(fake_quantize(w, weight_minmax_qparams(w, s2, "w")));
  EXPECT_LT(km4, km3);
  EXPECT_LT(km3, km2);
  EXPECT_LT(km4, 0.8 * u4);
  EXPECT_LT(km2, 0.5 * u2);
  // Per group: more codebooks, lower error.
  EXPECT_LT(mse(fake_quantize(w, fitted(w, qkmeans2, Granularity::kPerGroup, 64))), km2);
}

TEST(Codebook, FrozenLinearRunsTheLookUpTableKernelAndMatchesFakeQuant) {
  struct Case {
    QType qt;
    Granularity g;
    int64_t group;
    ActivationMode act;
  };
  const std::vector<Case> cases{{qkmeans4, Granularity::kPerChannel, 0, ActivationMode::kNone},
                                {qkmeans3, Granularity::kPerChannel, 0, ActivationMode::kNone},
                                {qkmeans2, Granularity::kPerChannel, 0, ActivationMode::kNone},
                                {qkmeans4, Granularity::kPerGroup, 64, ActivationMode::kNone},
                                {qkmeans2, Granularity::kPerGroup, 64, ActivationMode::kNone},
                                {qkmeans4, Granularity::kPerTensor, 0, ActivationMode::kNone},
                                {qkmeans4, Granularity::kPerChannel, 0, ActivationMode::kDynamicPerToken}};
  for (const int64_t M : {1, 5, 40}) {
    for (const Case& c : cases) {
      at::manual_seed(5);
      nn::Linear lin(128, 48);
      lin->eval();
      Scheme s(c.qt);
      s.weight_granularity = c.g;
      s.group_size = c.group;
      s.activations = c.act;
      quantize(lin, s);
      const at::Tensor x = at::randn({M, 128});
      at::Tensor y_fq;
      {
        at::NoGradGuard g;
        y_fq = lin(x);
      }
      freeze(lin);
      const at::Tensor y = lin(x);
      const LayerReport r = lin->report();
      const std::string what = std::string(c.qt.name) + " " + to_string(c.g) + " M=" + std::to_string(M) + " " + r.kernel;
      EXPECT_LE(codebook_rel_error(y, y_fq), 1e-5) << what;
      EXPECT_NE(r.kernel.find("lut"), std::string::npos) << what;
      EXPECT_FALSE(lin->weight.defined()) << what;
      // The stored codes and levels dequantize to the fake-quantized weight.
      const QuantizedTensor fw = lin->frozen_weight();
      EXPECT_EQ(fw.codebook.scalar_type(), at::kHalf);
      EXPECT_FALSE(fw.scale.defined());
    }
  }
}

TEST(Codebook, EmbeddingGathersRowsAndConvFallsBackSayingWhy) {
  for (const Granularity g : {Granularity::kPerChannel, Granularity::kPerGroup, Granularity::kPerTensor}) {
    for (const QType& qt : {qkmeans4, qkmeans2}) {
      at::manual_seed(8);
      nn::Embedding emb(50, 32);
      Scheme s(qt);
      s.weight_granularity = g;
      s.group_size = g == Granularity::kPerGroup ? 16 : 0;
      quantize(emb, s);
      const at::Tensor ids = at::randint(0, 50, {3, 7}, at::kLong);
      const at::Tensor y_fq = emb(ids).detach();
      freeze(emb);
      EXPECT_EQ(emb->report().kernel, "gather_codebook_rows");
      EXPECT_TRUE(at::equal(emb(ids), y_fq)) << qt.name << " " << to_string(g);
    }
  }
  // Convolutions have no look-up-table kernel: the codebook weight is dequantized per call, and
  // describe() says so; the frozen output still equals fake-quant.
  at::manual_seed(8);
  nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).padding(1));
  quantize(conv, Scheme(qkmeans3));
  const at::Tensor x = at::randn({2, 3, 6, 6});
  const at::Tensor y_fq = conv(x).detach();
  freeze(conv);
  EXPECT_EQ(conv->report().kernel, "dequantize+at::conv");
  EXPECT_FALSE(conv->report().fallback_reason.empty());
  EXPECT_LE(codebook_rel_error(conv(x), y_fq), 1e-5);
}

TEST(Codebook, QatTrainsTheLevelsAndLowersTheLoss) {
  at::manual_seed(2);
  nn::Linear lin(32, 8);
  quantize(lin, Scheme(qkmeans2));
  lin->train();
  const at::Tensor x = at::randn({64, 32});
  const at::Tensor target = at::randn({64, 8});
  lin(x);  // fits the codebook
  const at::Tensor cb = lin->weight_quantizer()->codebook();
  ASSERT_EQ(cb.sizes(), at::IntArrayRef({8, 4}));
  const at::Tensor before = cb.detach().clone();
  torch::optim::SGD opt(lin->parameters(), torch::optim::SGDOptions(0.05));
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    const at::Tensor loss = (lin(x) - target).pow(2).mean();
    loss.backward();
    ASSERT_TRUE(cb.grad().defined());
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, first);
  EXPECT_FALSE(at::equal(before, cb.detach()));
  // Evaluation and freeze use the float16 values of the trained levels.
  lin->eval();
  const at::Tensor y_fq = lin(x).detach();
  freeze(lin);
  EXPECT_LE(codebook_rel_error(lin(x), y_fq), 1e-5);
}

TEST(Codebook, CheckpointsLoadIntoAFreshModelFrozenOrFitted) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir();
  for (const bool frozen : {false, true}) {
    at::manual_seed(9);
    nn::Linear a(64, 16);
    a->eval();
    Scheme s(qkmeans3);
    s.weight_granularity = Granularity::kPerGroup;
    s.group_size = 32;
    quantize(a, s);
    const at::Tensor x = at::randn({3, 64});
    const at::Tensor y_a = a(x).detach();  // fits the codebook
    if (frozen) freeze(a);
    const std::string path = dir + "/codebook_" + std::to_string(frozen) + ".h5";
    io::save_model(a, path);
    at::manual_seed(123);
    nn::Linear b(64, 16);
    b->eval();
    io::load_model(b, path);
    EXPECT_EQ(b->frozen(), frozen);
    EXPECT_TRUE(at::equal(b(x).detach(), a(x).detach())) << "frozen " << frozen;
    EXPECT_LE(codebook_rel_error(b(x).detach(), y_a), 1e-5);
    fs::remove(path);
  }
}

TEST(Codebook, SafetensorsExportHoldsIndicesAndFloat16Levels) {
  at::manual_seed(4);
  nn::Linear lin(64, 8);
  quantize(lin, Scheme(qkmeans2));
  freeze(lin);
  const std::string path = ::testing::TempDir() + "/codebook.safetensors";
  io::export_safetensors(lin, path);
  io::SafetensorsReadOptions ro;
  ro.to_float32 = false;
  const io::SafetensorsFile f = io::read_safetensors(path, ro);
  std::filesystem::remove(path);
  ASSERT_TRUE(f.tensors.count("weight") && f.tensors.count("weight.codebook"));
  EXPECT_EQ(f.tensors.at("weight").numel(), 64 * 8 / 4);  // 2-bit fields
  EXPECT_EQ(f.tensors.at("weight.codebook").scalar_type(), at::kHalf);
  EXPECT_TRUE(at::equal(f.tensors.at("weight.codebook"), lin->frozen_weight().codebook));
  EXPECT_EQ(f.tensors.count("weight.scale"), 0u);
  EXPECT_NE(f.metadata.at("qforge.quantized").find("codebook[..., code]"), std::string::npos);
}

TEST(Codebook, CalibrationDumpsWriteTheLevelsAndLoadIntoAFreshModel) {
  at::manual_seed(6);
  nn::Linear a(32, 8);
  Scheme s(qkmeans3);
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  quantize(a, s);
  {
    Calibration calib(a);
    a(at::randn({16, 32}));
  }
  const std::string path = ::testing::TempDir() + "/codebook_calibration.h5";
  io::save_calibration(a, path);
  const io::CalibrationDump dump = io::load_calibration_dump(path);
  std::filesystem::remove(path);
  bool found = false;
  for (const auto& [module, points] : dump)
    for (const auto& [point, e] : points)
      if (point == "weight") {
        found = true;
        EXPECT_TRUE(e.qparams.codebook.defined());
        EXPECT_EQ(e.qparams.codebook.size(-1), 8);
      }
  EXPECT_TRUE(found);
}

TEST(Codebook, ModelSizeCountsIndicesAndLevels) {
  nn::Linear lin(torch::nn::LinearOptions(256, 64).bias(false));
  quantize(lin, Scheme(qkmeans4));
  freeze(lin);
  const int64_t idx = 64 * 256 / 2, levels = 64 * 16 * 2;
  EXPECT_EQ(estimate_memory(64 * 256, qkmeans4, 0, 64), idx + levels);
  EXPECT_EQ(estimate_memory(64 * 256, qkmeans2, 0, 64), 64 * 256 / 4 + 64 * 4 * 2);
  // The frozen layer holds at least the indices and levels, and less than a quarter of float.
  const int64_t bytes = lin->storage_bytes();
  EXPECT_GE(bytes, idx + levels);
  EXPECT_LT(bytes, 64 * 256 * 4 / 4 + 64 * 64 + 1024);
}

TEST(Codebook, WrongUsesAreClearErrors) {
  nn::Linear lin(16, 4);
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.activation_qtype = qkmeans4;
  EXPECT_NE(error_of([&] { quantize(lin, s); }).find("for weights only"), std::string::npos);
  nn::Linear bad(16, 4);
  {
    at::NoGradGuard g;
    bad->weight[0][0] = NAN;
  }
  quantize(bad, Scheme(qkmeans4));
  EXPECT_NE(error_of([&] { bad(at::randn({1, 16})); }).find("NaN"), std::string::npos);
  EXPECT_EQ(qtype_from_name("kmeans3"), qkmeans3);
  EXPECT_NE(qkmeans4, quint4);
}
