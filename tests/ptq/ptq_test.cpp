// PTQ solvers: GPTQ against its unblocked float64 reference, AdaRound converging to a binary
// rounding, SmoothQuant and cross-layer equalisation leaving the float model unchanged, each
// method lowering output error against round-to-nearest on layers with outliers, solved models
// freezing and reloading to the same outputs, and bad options refused.
#include "framework/ptq/ptq.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "fake_quant/fake_quantize.h"
#include "framework/io/model_io.h"
#include "framework/nn/conv.h"
#include "framework/nn/embedding.h"
#include "framework/nn/linear.h"
#include "framework/ptq/float_view.h"
#include "framework/ptq/numeric_suite.h"
#include "framework/api/quantize.h"
#include "framework/api/quantizer.h"

namespace qforge::ptq {
namespace {

namespace fs = std::filesystem;

double rel_error(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).norm() / b.norm().clamp_min(1e-30)).item<double>();
}

// Inputs with a few outlier channels (as transformer activations have) and correlated columns.
at::Tensor outlier_inputs(int64_t rows, int64_t k, uint64_t seed) {
  at::manual_seed(seed);
  // Low-rank structure plus noise: correlated input features, as real activations have.
  at::Tensor x = at::matmul(at::randn({rows, 8}), at::randn({8, k})) + 0.3 * at::randn({rows, k});
  x.select(1, 3).mul_(20);
  x.select(1, k / 2).mul_(12);
  return x;
}

QSpec int_spec(QType q, Granularity g, int64_t group = 0) {
  QSpec s;
  s.qtype = q;
  s.granularity = g;
  s.axis = 0;
  s.group_size = group;
  s.symmetric = true;
  return s;
}

at::Tensor hessian_of(const at::Tensor& x) { return 2 * at::matmul(x.t(), x) / static_cast<double>(x.size(0)); }

TEST(Gptq, BlockedFloat32MatchesUnblockedFloat64Reference) {
  at::manual_seed(1);
  const at::Tensor w = at::randn({12, 64});
  const at::Tensor x = outlier_inputs(512, 64, 2);
  const at::Tensor h = hessian_of(x);
  for (const QSpec& spec : {int_spec(qint4, Granularity::kPerChannel), int_spec(qint4, Granularity::kPerGroup, 16),
                            int_spec(qint8, Granularity::kPerTensor), int_spec(qint2, Granularity::kPerGroup, 32)}) {
    for (bool act_order : {false, true}) {
      GptqOptions o;
      o.block_size = 8;  // groups of 16 and 32 straddle blocks: the look-ahead path runs
      o.act_order = act_order;
      const GptqResult ref = gptq_reference(w, h, spec, o);
      const GptqResult fast = gptq(w, h, spec, o);
      const std::string what = spec.to_string() + (act_order ? " act_order" : "");
      // Same grid and the same codes (a float32 / float64 tie may flip a rare code by one step).
      EXPECT_TRUE(at::allclose(fast.qparams.scale, ref.qparams.scale, 1e-4, 1e-7)) << what;
      const at::Tensor step = broadcast_qparam(ref.qparams.scale, w, spec);
      const at::Tensor codes_diff = (grouped(fast.weight, spec) - grouped(ref.weight, spec)).abs() / step;
      EXPECT_GE((codes_diff < 0.01).to(at::kFloat).mean().item<double>(), 0.99) << what;
      EXPECT_LE(codes_diff.max().item<double>(), 1.01) << what;
      // The result lies on its grid: fake_quantize leaves it unchanged.
      EXPECT_TRUE(at::allclose(fake_quantize(fast.weight, fast.qparams), fast.weight, 0, 1e-6)) << what;
    }
  }
}

TEST(Gptq, ResultDoesNotDependOnBlockSize) {
  at::manual_seed(3);
  const at::Tensor w = at::randn({8, 48});
  const at::Tensor h = hessian_of(outlier_inputs(256, 48, 4));
  const QSpec spec = int_spec(qint4, Granularity::kPerGroup, 16);
  GptqOptions a, b;
  a.block_size = 1;
  b.block_size = 128;
  const GptqResult ra = gptq(w, h, spec, a), rb = gptq(w, h, spec, b);
  EXPECT_LE(rel_error(ra.weight, rb.weight), 1e-3);
}

TEST(Gptq, LowersLayerOutputErrorAgainstRoundToNearest) {
  at::manual_seed(5);
  const at::Tensor w = at::randn({32, 128}) * 0.1;
  const at::Tensor x = outlier_inputs(1024, 128, 6);
  for (const QSpec& spec : {int_spec(qint4, Granularity::kPerChannel), int_spec(qint4, Granularity::kPerGroup, 32),
                            int_spec(qint2, Granularity::kPerGroup, 32)}) {
    const QParams rtn_qp = weight_minmax_qparams(w, spec, "w");
    const at::Tensor w_rtn = fake_quantize(w, rtn_qp);
    const GptqResult r = gptq(w, hessian_of(x), spec, GptqOptions{});
    const at::Tensor y = at::matmul(x, w.t());
    const double e_rtn = relative_mse(at::matmul(x, w_rtn.t()), y), e_gptq = relative_mse(at::matmul(x, r.weight.t()), y);
    EXPECT_LT(e_gptq, 0.7 * e_rtn) << spec.to_string() << ": rtn " << e_rtn << ", gptq " << e_gptq;
  }
}

TEST(Gptq, Float8GridsAndPerTensorInt8SolveOntoTheirGrids) {
  at::manual_seed(21);
  const at::Tensor w = at::randn({16, 64}) * 0.1;
  const at::Tensor x = outlier_inputs(512, 64, 22);
  QSpec f8 = int_spec(qfloat8_e4m3fn, Granularity::kPerChannel);
  for (const QSpec& spec : {f8, int_spec(qint8, Granularity::kPerTensor)}) {
    const GptqResult r = gptq(w, hessian_of(x), spec, GptqOptions{});
    EXPECT_TRUE(at::equal(fake_quantize(r.weight, r.qparams), r.weight)) << spec.to_string();
    const at::Tensor y = at::matmul(x, w.t());
    const at::Tensor w_rtn = fake_quantize(w, weight_minmax_qparams(w, spec, "w"));
    EXPECT_LT(relative_mse(at::matmul(x, r.weight.t()), y), relative_mse(at::matmul(x, w_rtn.t()), y)) << spec.to_string();
  }
}

TEST(Gptq, BadInputsAndOptionsAreErrors) {
  const at::Tensor w = at::randn({4, 8}), h = at::eye(8);
  const QSpec spec = int_spec(qint4, Granularity::kPerChannel);
  GptqOptions o;
  o.damp = 0;
  EXPECT_THROW(gptq(w, h, spec, o), Error);
  EXPECT_THROW(gptq(w, at::eye(7), spec, GptqOptions{}), Error);
  at::Tensor bad = w.clone();
  bad[0][0] = NAN;
  EXPECT_THROW(gptq(bad, h, spec, GptqOptions{}), Error);
  EXPECT_THROW(gptq(w, h, int_spec(qint4, Granularity::kPerGroup, 3), GptqOptions{}), Error);
  // A singular H (dead inputs) is handled: those columns are zero, the rest solve.
  at::Tensor hs = h.clone();
  hs[2][2] = 0;
  const GptqResult r = gptq(w, hs, spec, GptqOptions{});
  EXPECT_TRUE(at::equal(r.weight.select(1, 2), at::zeros({4})));
}

TEST(AdaRound, RoundingConvergesToABinaryMaskAndBeatsNearest) {
  at::manual_seed(8);
  const at::Tensor w = at::randn({16, 64}) * 0.1;
  const at::Tensor x = outlier_inputs(2048, 64, 9);
  const QSpec spec = int_spec(qint4, Granularity::kPerChannel);
  const QParams qp = weight_minmax_qparams(w, spec, "w");
  AdaRoundOptions o;
  o.iterations = 2500;
  const AdaRoundResult r = adaround(w, qp, x, at::matmul(x, w.t()), o);
  EXPECT_GE(r.binary_fraction, 0.97);
  // Every weight moved to the grid point just below or just above it.
  const at::Tensor scaled = w / qp.scale.unsqueeze(1), chosen = r.weight / qp.scale.unsqueeze(1);
  EXPECT_TRUE(at::logical_or((chosen - at::floor(scaled)).abs() < 1e-3, (chosen - at::ceil(scaled)).abs() < 1e-3)
                  .all()
                  .item<bool>());
  const at::Tensor y = at::matmul(x, w.t());
  EXPECT_LT(relative_mse(at::matmul(x, r.weight.t()), y), relative_mse(at::matmul(x, fake_quantize(w, qp).t()), y));
}

TEST(AdaRound, Float8GridsAndBadShapesAreErrors) {
  const at::Tensor w = at::randn({4, 8});
  QSpec f8 = int_spec(qfloat8_e4m3fn, Granularity::kPerChannel);
  f8.symmetric = true;
  const QParams qp{f8, at::ones({4}), at::zeros({4}, at::kInt)};
  EXPECT_THROW(adaround(w, qp, at::randn({10, 8}), at::randn({10, 4}), AdaRoundOptions{}), Error);
  const QSpec s4 = int_spec(qint4, Granularity::kPerChannel);
  const QParams q4 = weight_minmax_qparams(w, s4, "w");
  EXPECT_THROW(adaround(w, q4, at::randn({10, 7}), at::randn({10, 4}), AdaRoundOptions{}), Error);
}

// A model of every layer kind the solvers take, plus an Embedding they leave alone.
struct Net : torch::nn::Module {
  Net()
      : conv1(register_module("conv1", nn::Conv2d(torch::nn::Conv2dOptions(2, 8, 3).padding(1)))),
        conv2(register_module("conv2", nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).stride(2)))),
        fc1(register_module("fc1", nn::Linear(8 * 3 * 3, 32))),
        fc2(register_module("fc2", nn::Linear(32, 32))),
        fc3(register_module("fc3", nn::Linear(32, 5))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = at::relu(conv2(at::relu(conv1(x))));
    h = at::relu(fc1(h.flatten(1)));
    return fc3(at::relu(fc2(h)));
  }
  nn::Conv2d conv1, conv2;
  nn::Linear fc1, fc2, fc3;
};

// fc3's input in the float model (every quantizer passing values through) over `batches`.
at::Tensor fc3_float_input(Net& net, const std::vector<at::Tensor>& batches) {
  at::NoGradGuard g;
  FloatView fv(net);
  std::vector<at::Tensor> xs;
  for (const auto& b : batches) {
    at::Tensor h = at::relu(net.conv2(at::relu(net.conv1(b))));
    xs.push_back(at::relu(net.fc2(at::relu(net.fc1(h.flatten(1))))));
  }
  return at::cat(xs);
}

Scheme w4a8() {
  Scheme s(qint4);
  s.weight_granularity = Granularity::kPerChannel;
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  return s;
}

TEST(Solve, GptqAndBiasCorrectionLowerEveryLayersErrorAndFreezeReproducesThem) {
  at::manual_seed(11);
  auto net = std::make_shared<Net>();
  net->eval();
  const std::vector<at::Tensor> batches{at::randn({16, 2, 7, 7}), at::randn({16, 2, 7, 7}), at::randn({16, 2, 7, 7})};
  const at::Tensor test = at::randn({8, 2, 7, 7});
  at::Tensor y_float;
  {
    at::NoGradGuard g;
    y_float = net->forward(test);
  }
  quantize(net, w4a8());
  {
    Calibration calib(net);
    for (const auto& b : batches) net->forward(b);
  }
  at::Tensor y_rtn;
  {
    at::NoGradGuard g;
    y_rtn = net->forward(test);
  }
  SolveOptions o;
  o.rounding = Rounding::kGptq;
  o.bias_correction = true;
  const SolveReport rep = solve(*net, 3, [&](int64_t b) { return net->forward(batches[static_cast<size_t>(b)]); }, o);
  ASSERT_EQ(rep.layers.size(), 5u);
  EXPECT_EQ(rep.layers[0].path, "conv1");  // forward order
  EXPECT_EQ(rep.layers[4].path, "fc3");
  for (const LayerSolve& l : rep.layers) {
    EXPECT_EQ(l.method, "gptq+bias_correction") << l.path;
    EXPECT_GT(l.rows, 0) << l.path;
    EXPECT_LT(l.error_after, l.error_before) << l.path;
  }
  at::Tensor y_solved;
  {
    at::NoGradGuard g;
    y_solved = net->forward(test);
  }
  EXPECT_LT(rel_error(y_solved, y_float), rel_error(y_rtn, y_float));
  // The checkpoint of the solved fake-quant model loads into a fresh model with the same outputs.
  const fs::path file = fs::temp_directory_path() / ("qforge_ptq_" + std::to_string(::getpid()) + ".h5");
  io::save_model(net, file.string());
  auto fresh = std::make_shared<Net>();
  fresh->eval();
  io::load_model(fresh, file.string());
  fs::remove(file);
  {
    at::NoGradGuard g;
    EXPECT_TRUE(at::allclose(fresh->forward(test), y_solved, 1e-5, 1e-6));
  }
  // Frozen: the integer codes GPTQ chose.
  freeze(net);
  {
    at::NoGradGuard g;
    EXPECT_LE(rel_error(net->forward(test), y_solved), 1e-5);
  }
}

TEST(Solve, AFrozenGptqLayerHoldsTheSameBytesAsRtnAndOldCheckpointsWithTheGridStillLoad) {
  at::manual_seed(21);
  nn::Linear solved(64, 32), rtn(64, 32);
  {
    at::NoGradGuard g;
    rtn->weight.copy_(solved->weight);
    rtn->bias.copy_(solved->bias);
  }
  solved->eval();
  rtn->eval();
  const at::Tensor x = outlier_inputs(256, 64, 22);
  Scheme s(qint4);
  s.weight_granularity = Granularity::kPerGroup;
  s.group_size = 16;
  quantize(solved, s);
  quantize(rtn, s);
  SolveOptions o;
  o.rounding = Rounding::kGptq;
  solve(*solved, 1, [&](int64_t) { return solved(x); }, o);
  const QParams grid = solved->weight_quantizer()->qparams();
  ASSERT_EQ(grid.scale.numel(), 32 * 4);  // the solver fixed a per-group grid on the quantizer
  at::Tensor y_solved;
  {
    at::NoGradGuard g;
    y_solved = solved(x);
  }
  freeze(solved);
  freeze(rtn);
  // The packed weight is the only copy of the grid: no per-group scale / zero_point beside it.
  EXPECT_EQ(solved->storage_bytes(), rtn->storage_bytes());
  EXPECT_EQ(solved->weight_quantizer()->named_buffers()["scale"].numel(), 1);
  EXPECT_LE(rel_error(solved(x), y_solved), 1e-5);
  // A checkpoint written before the grid was dropped (the frozen layer's quantizer still holding
  // it, recorded as calibrated) loads, and the loaded layer holds the packed weight only.
  solved->weight_quantizer()->set_qparams(grid);
  const fs::path file = fs::temp_directory_path() / ("qforge_ptq_grid_" + std::to_string(::getpid()) + ".h5");
  io::save_model(solved, file.string());
  nn::Linear fresh(64, 32);
  fresh->eval();
  io::load_model(fresh, file.string());
  fs::remove(file);
  EXPECT_TRUE(fresh->frozen());
  EXPECT_EQ(fresh->storage_bytes(), rtn->storage_bytes());
  EXPECT_LE(rel_error(fresh(x), y_solved), 1e-5);
}

TEST(Solve, KMeansWeightedByInputEnergyLowersOutputErrorOfCodebookWeights) {
  // A Linear whose inputs have outlier channels: the energy-weighted codebook spends its levels on
  // the columns that move the output, the unweighted one on the weights' own spread.
  at::manual_seed(4);
  nn::Linear lin(64, 32);
  lin->eval();
  const at::Tensor x = outlier_inputs(512, 64, 5);
  at::Tensor y_float;
  {
    at::NoGradGuard g;
    y_float = lin(x);
  }
  quantize(lin, Scheme(qkmeans2));
  SolveOptions o;
  o.rounding = Rounding::kKMeans;
  const SolveReport rep = solve(*lin, 1, [&](int64_t) { return lin(x); }, o);
  ASSERT_EQ(rep.layers.size(), 1u);
  EXPECT_EQ(rep.layers[0].method, "kmeans");
  EXPECT_LT(rep.layers[0].error_after, 0.8 * rep.layers[0].error_before);
  // The float weight stays; fake-quant and the frozen layer use the refit codebook.
  at::Tensor y_solved;
  {
    at::NoGradGuard g;
    y_solved = lin(x);
  }
  freeze(lin);
  EXPECT_LE(rel_error(lin(x), y_solved), 1e-5);
  // GPTQ does not apply to codebook weights, kmeans not to uniform grids: a rule naming either is an error.
  nn::Linear u(64, 32);
  quantize(u, Scheme(qint4));
  SolveOptions bad;
  bad.rules.push_back({"*", Rounding::kKMeans});
  EXPECT_THROW(plan_solve(*u, bad), SolveError);
}

TEST(Solve, AdaRoundOnAModelAndRulesPerLayer) {
  at::manual_seed(12);
  auto net = std::make_shared<Net>();
  net->eval();
  const std::vector<at::Tensor> batches{at::randn({32, 2, 7, 7}), at::randn({32, 2, 7, 7})};
  Scheme s = w4a8();
  s.activations = ActivationMode::kNone;
  quantize(net, s);
  SolveOptions o;
  o.rounding = Rounding::kAdaRound;
  o.adaround.iterations = 300;
  o.rules = {{"fc3", Rounding::kNearest}, {"conv*", Rounding::kGptq}};
  const SolveReport rep = solve(*net, 2, [&](int64_t b) { return net->forward(batches[static_cast<size_t>(b)]); }, o);
  std::map<std::string, std::string> method;
  for (const LayerSolve& l : rep.layers) method[l.path] = l.method;
  EXPECT_EQ(method["conv1"], "gptq");
  EXPECT_EQ(method["conv2"], "gptq");
  EXPECT_EQ(method["fc1"], "adaround");
  EXPECT_EQ(method["fc3"], "rtn");
  for (const LayerSolve& l : rep.layers) {
    if (l.method == "adaround") {
      EXPECT_LE(l.error_after, l.error_before * 1.05) << l.path << " " << l.note;
    }
  }
  // Frozen equals fake-quant with the rounding AdaRound chose.
  at::NoGradGuard g;
  const at::Tensor y_fq = net->forward(batches[0]);
  freeze(net);
  EXPECT_LE(rel_error(net->forward(batches[0]), y_fq), 1e-5);
}

struct WithEmbedding : torch::nn::Module {
  WithEmbedding() : emb(register_module("emb", nn::Embedding(10, 16))), fc(register_module("fc", nn::Linear(16, 4))) {}
  at::Tensor forward(const at::Tensor& ids) { return fc(emb(ids)); }
  nn::Embedding emb;
  nn::Linear fc;
};

TEST(Solve, AMethodOnLayersThatCannotTakeItIsAnErrorNamingTheRule) {
  auto m = std::make_shared<WithEmbedding>();
  Scheme s(qint4);
  s.weight_granularity = Granularity::kPerChannel;
  quantize(m, s);
  SolveOptions o;
  o.rules = {{"fc", Rounding::kGptq}, {"emb", Rounding::kGptq}};
  try {
    plan_solve(*m, o);
    FAIL() << "expected a SolveError";
  } catch (const SolveError& e) {
    EXPECT_EQ(e.rule(), 1);
    EXPECT_NE(std::string(e.what()).find("Embedding"), std::string::npos) << e.what();
  }
  // The default method skips such layers with a note instead.
  o.rules.clear();
  o.rounding = Rounding::kGptq;
  const auto plan = plan_solve(*m, o);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].method, "rtn");
  EXPECT_NE(plan[0].note.find("Embedding"), std::string::npos);
  EXPECT_EQ(plan[1].method, "gptq");
}

struct Mlp : torch::nn::Module {
  explicit Mlp(bool gelu)
      : fc1(register_module("fc1", nn::Linear(24, 32))), fc2(register_module("fc2", nn::Linear(32, 32))),
        fc3(register_module("fc3", nn::Linear(32, 6))), gelu_(gelu) {}
  at::Tensor forward(const at::Tensor& x) {
    auto act = [&](const at::Tensor& t) { return gelu_ ? at::gelu(t) : at::relu(t); };
    return fc3(act(fc2(act(fc1(x)))));
  }
  nn::Linear fc1, fc2, fc3;
  bool gelu_;
};

TEST(SmoothQuant, LeavesTheFloatModelUnchangedAndLowersW8A8Error) {
  at::manual_seed(13);
  auto build = [] {
    at::manual_seed(14);
    auto m = std::make_shared<Mlp>(false);
    m->eval();
    return m;
  };
  // Two channels a hundred times larger than the rest: per-tensor int8 inputs lose the others.
  auto inputs = [](int64_t rows, uint64_t seed) {
    at::manual_seed(seed);
    at::Tensor x = at::randn({rows, 24});
    x.select(1, 3).mul_(100);
    x.select(1, 17).mul_(60);
    return x;
  };
  const at::Tensor calib = inputs(256, 15), test = inputs(64, 16);
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  auto error_of = [&](bool smooth, SmoothReport* rep) {
    auto m = build();
    at::Tensor y_float;
    {
      at::NoGradGuard g;
      y_float = m->forward(test);
    }
    quantize(m, s);
    if (smooth) {
      *rep = smooth_quant(*m, 1, [&](int64_t) { return m->forward(calib); }, SmoothQuantOptions{0.5});
      FloatView fv(*m);
      at::NoGradGuard g;
      EXPECT_LE(rel_error(m->forward(test), y_float), 1e-5);
    }
    {
      Calibration c(m);
      m->forward(calib);
    }
    at::NoGradGuard g;
    return rel_error(m->forward(test), y_float);
  };
  SmoothReport rep;
  const double plain = error_of(false, nullptr), smoothed = error_of(true, &rep);
  ASSERT_EQ(rep.layers.size(), 3u);
  EXPECT_LT(rep.layers[0].act_range_after, rep.layers[0].act_range_before);
  EXPECT_LT(smoothed, plain) << "plain " << plain << ", smoothed " << smoothed;
  SmoothReport unused;
  EXPECT_THROW(smooth_quant(*build(), 1, [](int64_t) { return at::Tensor(); }, SmoothQuantOptions{1.5}), Error);
  (void)unused;
}

// Issue 39 item 19: input channels silent on the calibration batches get their activation maximum
// floored at kSmoothActFloor of the layer's largest (not a 1e-5 factor that wipes their weight
// column), and a layer whose factors span more than kSmoothExtremeSpread is warned about.
TEST(SmoothQuant, Item19SilentChannelsAreFlooredAndExtremeFactorsWarned) {
  auto build = [] {
    at::manual_seed(31);
    auto m = std::make_shared<Mlp>(false);
    m->eval();
    Scheme s(qint8);
    s.activations = ActivationMode::kStatic;
    s.observer = "minmax";
    quantize(m, s);
    return m;
  };
  at::manual_seed(32);
  at::Tensor calib = at::randn({128, 24});
  calib.slice(1, 0, 4).zero_();  // four input channels never fire during calibration
  const at::Tensor amax = calib.abs().amax(0);
  auto m = build();
  const SmoothReport rep = smooth_quant(*m, 1, [&](int64_t) { return m->forward(calib); }, SmoothQuantOptions{1.0});
  ASSERT_EQ(rep.layers.size(), 3u);
  EXPECT_EQ(rep.layers[0].path, "fc1");
  EXPECT_EQ(rep.layers[0].floored_channels, 4);
  // α = 1: s_j = a_j, so a silent channel's pre_quant_scale is 1 / (kSmoothActFloor · max_k a_k).
  const at::Tensor pqs = m->fc1->pre_quant_scale();
  const double floor = kSmoothActFloor * amax.max().item<double>();
  for (int64_t j = 0; j < 4; ++j) EXPECT_NEAR(pqs[j].item<double>() * floor, 1.0, 1e-5) << "channel " << j;
  EXPECT_NEAR(pqs[10].item<double>() * amax[10].item<double>(), 1.0, 1e-5);
  EXPECT_LE(rep.layers[0].max_factor / rep.layers[0].min_factor, 1.0 / kSmoothActFloor * (1 + 1e-5));
  EXPECT_TRUE(rep.warnings.empty()) << rep.warnings.front();
  // α = 0.2 and a weight column of zeros: s = a^0.2 / 1e-5^0.8 for it, thousands of times the others.
  auto w = build();
  {
    at::NoGradGuard g;
    w->fc2->weight.select(1, 5).zero_();
  }
  const SmoothReport warned = smooth_quant(*w, 1, [&](int64_t) { return w->forward(calib); }, SmoothQuantOptions{0.2});
  ASSERT_EQ(warned.warnings.size(), 1u);
  EXPECT_EQ(warned.warnings[0].rfind("fc2: SmoothQuant factors span", 0), 0u) << warned.warnings[0];
  // The zero weight column spreads the factors, not the activations: a higher alpha helps, a
  // lower one (what the warning used to advise) spreads them further.
  EXPECT_NE(warned.warnings[0].find("The weight columns (max |W| per input channel) drive the spread"), std::string::npos)
      << warned.warnings[0];
  EXPECT_NE(warned.warnings[0].find("try a higher alpha than 0.20"), std::string::npos) << warned.warnings[0];
  // The advice holds: at alpha 0.9 the same layer's factors span less than at 0.2.
  auto h = build();
  {
    at::NoGradGuard g;
    h->fc2->weight.select(1, 5).zero_();
  }
  const SmoothReport higher = smooth_quant(*h, 1, [&](int64_t) { return h->forward(calib); }, SmoothQuantOptions{0.9});
  EXPECT_LT(higher.layers[1].max_factor / higher.layers[1].min_factor,
            warned.layers[1].max_factor / warned.layers[1].min_factor);
}

TEST(SmoothQuant, PreQuantScaleTravelsThroughCheckpointsIntoAFreshModel) {
  auto m = std::make_shared<Mlp>(false);
  m->eval();
  Scheme s(qint8);
  s.activations = ActivationMode::kDynamicPerToken;
  quantize(m, s);
  const at::Tensor x = outlier_inputs(32, 24, 17);
  smooth_quant(*m, 1, [&](int64_t) { return m->forward(x); }, SmoothQuantOptions{0.8});
  ASSERT_TRUE(m->fc1->pre_quant_scale().defined());
  const fs::path file = fs::temp_directory_path() / ("qforge_sq_" + std::to_string(::getpid()) + ".h5");
  io::save_model(m, file.string());
  auto fresh = std::make_shared<Mlp>(false);
  fresh->eval();
  io::load_model(fresh, file.string());
  fs::remove(file);
  ASSERT_TRUE(fresh->fc1->pre_quant_scale().defined());
  at::NoGradGuard g;
  EXPECT_TRUE(at::allclose(fresh->forward(x), m->forward(x), 1e-5, 1e-6));
  freeze(m);
  EXPECT_LE(rel_error(m->forward(x), fresh->forward(x)), 1e-5);
  EXPECT_THROW(fresh->fc1->set_pre_quant_scale(at::zeros({24})), Error);
  EXPECT_THROW(fresh->fc1->set_pre_quant_scale(at::ones({23})), Error);
}

// fc1's output channels with ranges that differ by orders of magnitude (what per-tensor grids
// suffer from) and fc2 undoing it: the same function as a balanced network, as BatchNorm folding
// leaves one.
void imbalance(Mlp& m) {
  at::NoGradGuard g;
  const at::Tensor d = at::logspace(-2, 1, 32);
  m.fc1->weight.mul_(d.unsqueeze(1));
  m.fc1->bias.mul_(d);
  m.fc2->weight.div_(d.unsqueeze(0));
}

TEST(Equalize, LeavesTheFloatModelUnchangedAroundReluAndUndoesGelu) {
  for (bool gelu : {false, true}) {
    at::manual_seed(18);
    auto m = std::make_shared<Mlp>(gelu);
    m->eval();
    imbalance(*m);
    const at::Tensor x = at::randn({64, 24});
    at::Tensor y0;
    {
      at::NoGradGuard g;
      y0 = m->forward(x);
    }
    const EqualizeReport rep = equalize(*m, [&](int64_t) { return m->forward(x); });
    ASSERT_EQ(rep.pairs.size(), 2u);
    EXPECT_EQ(rep.pairs[0].first, "fc1");
    EXPECT_EQ(rep.pairs[0].second, "fc2");
    at::NoGradGuard g;
    EXPECT_LE(rel_error(m->forward(x), y0), 1e-5) << (gelu ? "gelu" : "relu");
    if (gelu) {
      EXPECT_FALSE(rep.pairs[0].applied);
      EXPECT_NE(rep.pairs[0].reason.find("positively homogeneous"), std::string::npos) << rep.pairs[0].reason;
    } else {
      EXPECT_TRUE(rep.pairs[0].applied) << rep.pairs[0].reason;
      EXPECT_LT(rep.pairs[0].range_spread_after, rep.pairs[0].range_spread_before);
    }
  }
}

TEST(Equalize, LowersPerTensorInt4ErrorAndBiasCorrectionLowersItFurther) {
  auto run = [](bool cle, bool bc) {
    at::manual_seed(19);
    auto m = std::make_shared<Mlp>(false);
    m->eval();
    imbalance(*m);
    const at::Tensor x = at::randn({256, 24});
    at::Tensor y0;
    {
      at::NoGradGuard g;
      y0 = m->forward(x);
    }
    if (cle) equalize(*m, [&](int64_t) { return m->forward(x); });
    Scheme s(qint4);
    s.weight_granularity = Granularity::kPerTensor;
    quantize(m, s);
    if (bc) {
      SolveOptions o;
      o.bias_correction = true;
      solve(*m, 1, [&](int64_t) { return m->forward(x); }, o);
    }
    at::NoGradGuard g;
    return rel_error(m->forward(x), y0);
  };
  const double plain = run(false, false), cle = run(true, false), both = run(true, true);
  EXPECT_LT(cle, 0.7 * plain) << plain << " " << cle;
  EXPECT_LE(both, cle) << cle << " " << both;
}

TEST(NumericSuite, PerLayerErrorsMatchTheirFormulasAndLeaveTheModelAsItWas) {
  at::manual_seed(21);
  auto net = std::make_shared<Net>();
  net->eval();
  const std::vector<at::Tensor> batches{at::randn({16, 2, 7, 7}), at::randn({16, 2, 7, 7})};
  Scheme s(qint8);
  s.weight_granularity = Granularity::kPerChannel;
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  quantize(net, s);
  {
    Calibration calib(net);
    for (const auto& b : batches) net->forward(b);
  }
  const QParams fc3_in = net->fc3->input_quantizer()->qparams();
  auto run = [&](int64_t b) { return net->forward(batches[static_cast<size_t>(b)]); };
  const std::vector<LayerError> errors = layer_errors(*net, 2, run);
  ASSERT_EQ(errors.size(), 5u);
  EXPECT_EQ(errors[0].path, "conv1");  // module order
  EXPECT_EQ(errors[4].path, "fc3");
  for (const LayerError& e : errors) {
    EXPECT_TRUE(e.note.empty()) << e.path << ": " << e.note;
    EXPECT_GT(e.rows, 0) << e.path;
    EXPECT_GT(e.weight_sqnr_db, 30.0) << e.path;  // int8 per-channel weights
    EXPECT_TRUE(std::isfinite(e.own_sqnr_db) && std::isfinite(e.accumulated_sqnr_db)) << e.path;
    // Min/max calibrated on these very batches with float upstream layers: quantized upstream
    // layers may push a few inputs past the range, the model input (conv1) never.
    EXPECT_LT(e.clipped_fraction, 0.01) << e.path;
    EXPECT_EQ(e.nonfinite_inputs, 0) << e.path;
  }
  // conv1 reads the model input: its accumulated error is its own error, nothing clips.
  EXPECT_EQ(errors[0].clipped_fraction, 0.0);
  EXPECT_EQ(errors[0].accumulated_sqnr_db, errors[0].own_sqnr_db);
  // fc3 from the formulas, independently: its float input, then Qin(x) · Q(W)ᵀ + b against x · Wᵀ + b.
  const at::Tensor x = fc3_float_input(*net, batches);
  const at::Tensor w = net->fc3->weight.detach(), bias = net->fc3->bias.detach();
  const at::Tensor wq = fake_quantize(w, weight_minmax_qparams(w, net->fc3->weight_quantizer()->config().spec, "fc3"));
  const at::Tensor y_f = at::addmm(bias, x, w.t()), y_q = at::addmm(bias, fake_quantize(x, fc3_in), wq.t());
  const double expect_db = 10 * std::log10(y_f.to(at::kDouble).pow(2).sum().item<double>() /
                                           (y_q - y_f).to(at::kDouble).pow(2).sum().item<double>());
  EXPECT_NEAR(errors[4].own_sqnr_db, expect_db, 1e-6);
  EXPECT_NEAR(errors[4].own_relative_mse, relative_mse(y_q, y_f), 1e-12);
  EXPECT_NEAR(errors[4].weight_sqnr_db, sqnr_db(w, wq), 1e-9);
  // Nothing moved: the calibrated range, the observers' mode.
  EXPECT_TRUE(at::equal(net->fc3->input_quantizer()->qparams().scale, fc3_in.scale));
  EXPECT_FALSE(net->fc3->input_quantizer()->observing());
  // Inputs three times wider than calibration: clipping is counted; worst first sorts by SQNR.
  const std::vector<LayerError> wide =
      worst_first(layer_errors(*net, 2, [&](int64_t b) { return net->forward(3 * batches[static_cast<size_t>(b)]); }));
  for (size_t i = 1; i < wide.size(); ++i) EXPECT_LE(wide[i - 1].accumulated_sqnr_db, wide[i].accumulated_sqnr_db);
  for (const LayerError& e : wide) {
    if (e.path == "conv1") {
      EXPECT_GT(e.clipped_fraction, 0.0);
    }
  }
  EXPECT_EQ(sqnr_db(w, w), std::numeric_limits<double>::infinity());
  // The caller's mode comes back (the passes run in eval mode).
  net->train();
  const std::vector<LayerError> again = layer_errors(*net, 2, run);
  EXPECT_TRUE(net->is_training());
  EXPECT_EQ(again[4].own_sqnr_db, errors[4].own_sqnr_db);
  net->eval();
  freeze(net);
  EXPECT_THROW(layer_errors(*net, 1, run), Error);
}

// Issue 39 item 1: after GPTQ (and bias correction) replaced the weights, the numeric suite
// compares with the float weights the solver started from, not the solution with itself.
TEST(NumericSuite, Item1SolvedLayersAreComparedWithTheFloatWeightsTheSolverStartedFrom) {
  at::manual_seed(23);
  auto net = std::make_shared<Net>();
  net->eval();
  const std::vector<at::Tensor> batches{at::randn({16, 2, 7, 7}), at::randn({16, 2, 7, 7})};
  Scheme s(qint4);  // weight-only: with no input quantizer a layer compared with itself is exact
  s.weight_granularity = Granularity::kPerChannel;
  quantize(net, s);
  const at::Tensor w_float = net->fc3->weight.detach().clone(), b_float = net->fc3->bias.detach().clone();
  SolveOptions o;
  o.rounding = Rounding::kGptq;
  o.bias_correction = true;
  auto run = [&](int64_t b) { return net->forward(batches[static_cast<size_t>(b)]); };
  SolveReport rep = solve(*net, 2, run, o);
  ASSERT_EQ(rep.replaced.size(), 5u);
  ASSERT_TRUE(at::equal(rep.replaced.at("fc3").weight, w_float));
  ASSERT_TRUE(at::equal(rep.replaced.at("fc3").bias, b_float));
  const at::Tensor w_solved = net->fc3->weight.detach().clone(), b_solved = net->fc3->bias.detach().clone();
  // Without the starting weights a solved weight-only layer reads as exact: the trap the suite avoids.
  EXPECT_EQ(layer_errors(*net, 2, run)[4].own_sqnr_db, std::numeric_limits<double>::infinity());
  NumericSuiteOptions suite;
  suite.float_weights = rep.replaced;
  const std::vector<LayerError> errors = layer_errors(*net, 2, run, suite);
  ASSERT_EQ(errors.size(), 5u);
  // The suite put the solved weights back.
  EXPECT_TRUE(at::equal(net->fc3->weight.detach(), w_solved));
  EXPECT_TRUE(at::equal(net->fc3->bias.detach(), b_solved));
  for (const LayerError& e : errors) {
    EXPECT_TRUE(std::isfinite(e.weight_sqnr_db) && std::isfinite(e.own_sqnr_db) && std::isfinite(e.accumulated_sqnr_db))
        << e.path;
    EXPECT_GT(e.own_sqnr_db, 5.0) << e.path;  // int4 per-channel: errors, not garbage
  }
  // fc3 from the formulas: its input in the float model it started from, x · Wᵀ + b against x · W'ᵀ + b'.
  at::Tensor x;
  {
    at::NoGradGuard g;
    std::map<std::string, FloatWeights> solved;
    for (const auto& [path, fw] : rep.replaced) {
      torch::nn::Module& m = *net->named_children()[path];
      solved[path] = {m.named_parameters()["weight"].detach().clone(), m.named_parameters()["bias"].detach().clone()};
      m.named_parameters()["weight"].detach().copy_(fw.weight);
      m.named_parameters()["bias"].detach().copy_(fw.bias);
    }
    x = fc3_float_input(*net, batches);
    for (const auto& [path, fw] : solved) {
      net->named_children()[path]->named_parameters()["weight"].detach().copy_(fw.weight);
      net->named_children()[path]->named_parameters()["bias"].detach().copy_(fw.bias);
    }
  }
  const at::Tensor wq = net->fc3->weight_quantizer()->forward(w_solved).detach();
  const at::Tensor y_f = at::addmm(b_float, x, w_float.t()), y_q = at::addmm(b_solved, x, wq.t());
  EXPECT_NEAR(errors[4].own_sqnr_db, sqnr_db(y_f, y_q), 1e-6);
  EXPECT_NEAR(errors[4].weight_sqnr_db, sqnr_db(w_float, wq), 1e-9);
  EXPECT_NEAR(errors[4].own_relative_mse, relative_mse(y_q, y_f), 1e-12);
}

}  // namespace
}  // namespace qforge::ptq
