// The search end to end on a small MLP of qforge layers: exact predicted bytes (the frozen model
// measures the same), budgets met, constraints and ties honoured, more budget never predicts
// more error, both sensitivity methods, and the rules reproduce the chosen schemes.
#include "framework/search/search.h"
#include "framework/search/sensitivity.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <torch/optim/adam.h>

#include "framework/core/error.h"
#include "framework/io/calibration_dump.h"
#include "framework/io/calibration_io.h"
#include "framework/nn/embedding.h"
#include "framework/nn/layer_norm.h"
#include "framework/nn/linear.h"
#include "framework/api/quantize.h"

namespace qforge::search {
namespace {

struct Mlp : torch::nn::Module {
  Mlp()
      : fc1(register_module("fc1", nn::Linear(32, 64))),
        fc2(register_module("fc2", nn::Linear(64, 64))),
        fc3(register_module("fc3", nn::Linear(64, 64))),
        head(register_module("head", nn::Linear(64, 4))) {}
  at::Tensor forward(const at::Tensor& x) {
    return head(at::relu(fc3(at::relu(fc2(at::relu(fc1(x)))))));
  }
  nn::Linear fc1, fc2, fc3, head;
};

struct Fixture {
  std::shared_ptr<Mlp> model;
  std::vector<at::Tensor> x, y;
  std::function<at::Tensor(int64_t)> loss;
};

// A small MLP trained for a few hundred steps on a learnable task (labels from a random linear
// teacher), so quantizing its weights costs loss.
Fixture make_fixture() {
  at::manual_seed(0);
  Fixture f;
  f.model = std::make_shared<Mlp>();
  const at::Tensor teacher = at::randn({32, 4});
  for (int b = 0; b < 2; ++b) {
    f.x.push_back(at::randn({64, 32}));
    f.y.push_back(at::matmul(f.x.back(), teacher).argmax(1));
  }
  torch::optim::Adam opt(f.model->parameters(), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < 200; ++step) {
    opt.zero_grad();
    at::cross_entropy_loss(f.model->forward(f.x[step % 2]), f.y[step % 2]).backward();
    opt.step();
  }
  f.model->eval();
  f.loss = [m = f.model, x = f.x, y = f.y](int64_t b) { return at::cross_entropy_loss(m->forward(x[b]), y[b]); };
  return f;
}

std::vector<Candidate> candidates() {
  return {Candidate{qint8, Granularity::kPerChannel, 0, std::nullopt}, Candidate{qint4, Granularity::kPerGroup, 16, std::nullopt},
          Candidate{qint2, Granularity::kPerGroup, 16, std::nullopt}, Candidate{std::nullopt, Granularity::kPerChannel, 0, std::nullopt}};
}

SearchOptions options(double size_ratio, Method m = Method::kHessian) {
  SearchOptions o;
  o.method = m;
  o.candidates = candidates();
  o.budget.size_ratio = size_ratio;
  o.hutchinson.max_probes = 32;
  return o;
}

TEST(Search, PredictedBytesAreTheFrozenModelsBytesAndTheBudgetHolds) {
  Fixture f = make_fixture();
  const Scheme base(qint8);  // weight-only
  const SearchResult r = search(*f.model, base, 2, f.loss, options(0.35));
  EXPECT_LE(static_cast<double>(r.bytes), 0.35 * r.float_bytes);
  quantize(*f.model, apply(base, r));
  freeze(*f.model);
  EXPECT_EQ(model_size(*f.model).total_bytes, r.bytes);
}

TEST(Search, CodebookCandidatesArePricedExactly) {
  // k-means candidates only (on this small MLP their float32 look-up tables outweigh int8's
  // scales, so a mixed list would rarely pick them): every layer takes one, and the predicted
  // bytes are the frozen model's.
  Fixture f = make_fixture();
  const Scheme base(qint8);
  SearchOptions o = options(0.5);
  o.candidates = {Candidate{qkmeans4, Granularity::kPerChannel, 0, std::nullopt},
                  Candidate{qkmeans2, Granularity::kPerChannel, 0, std::nullopt}};
  const SearchResult r = search(*f.model, base, 2, f.loss, o);
  EXPECT_LE(static_cast<double>(r.bytes), 0.5 * r.float_bytes);
  for (const LayerChoice& l : r.layers)
    EXPECT_NE(l.candidates[static_cast<size_t>(l.chosen)].candidate.find("qkmeans"), std::string::npos) << l.path;
  quantize(*f.model, apply(base, r));
  freeze(*f.model);
  EXPECT_EQ(model_size(*f.model).total_bytes, r.bytes);
}

TEST(Search, Mxfp4AndNvfp4CandidatesArePricedExactly) {
  // The formats' blocks (32, 16) divide both Linear input sizes (32, 64); the predicted bytes are
  // the frozen model's (codes, block scales, the fp4 kernel's float32 scales).
  Fixture f = make_fixture();
  const Scheme base(qint8);
  SearchOptions o = options(0.5);
  o.candidates = {Candidate{qmxfp4, Granularity::kPerGroup, 32, std::nullopt},
                  Candidate{qnvfp4, Granularity::kPerGroup, 16, std::nullopt}};
  const SearchResult r = search(*f.model, base, 2, f.loss, o);
  EXPECT_LE(static_cast<double>(r.bytes), 0.5 * r.float_bytes);
  quantize(*f.model, apply(base, r));
  freeze(*f.model);
  EXPECT_EQ(model_size(*f.model).total_bytes, r.bytes);
}

// With static activations the unsearched LayerNorm's output quantizer counts too.
struct NormedMlp : torch::nn::Module {
  NormedMlp()
      : fc1(register_module("fc1", nn::Linear(32, 64))),
        norm(register_module("norm", nn::LayerNorm(torch::nn::LayerNormOptions({64})))),
        head(register_module("head", nn::Linear(64, 4))) {}
  at::Tensor forward(const at::Tensor& x) { return head(norm(at::relu(fc1(x)))); }
  nn::Linear fc1;
  nn::LayerNorm norm;
  nn::Linear head;
};

TEST(Search, PredictedBytesIncludeTheUnsearchedLayersQuantizers) {
  at::manual_seed(2);
  auto model = std::make_shared<NormedMlp>();
  model->eval();
  const at::Tensor x = at::randn({64, 32});
  const at::Tensor y = at::randint(0, 4, {64}, at::kLong);
  Scheme base(qint8);
  base.activations = ActivationMode::kStatic;
  base.observer = "minmax";
  const SearchResult r = search(*model, base, 1, [&](int64_t) { return at::cross_entropy_loss(model->forward(x), y); },
                                options(0.6));
  quantize(*model, apply(base, r));
  {
    Calibration calib(*model);
    model->forward(x);
  }
  freeze(*model);
  EXPECT_EQ(model_size(*model).total_bytes, r.bytes);
}

TEST(Search, MoreBudgetNeverPredictsMoreErrorAndTheFrontIsMonotone) {
  Fixture f = make_fixture();
  const Scheme base(qint8);
  double last = std::numeric_limits<double>::infinity();
  for (double ratio : {0.24, 0.3, 0.45, 1.2}) {
    const SearchResult r = search(*f.model, base, 2, f.loss, options(ratio));
    EXPECT_LE(r.predicted, last + 1e-12) << ratio;
    last = r.predicted;
    ASSERT_GE(r.pareto.size(), 2u);
    for (size_t i = 1; i < r.pareto.size(); ++i) {
      EXPECT_GT(r.pareto[i].bytes, r.pareto[i - 1].bytes);
      EXPECT_LT(r.pareto[i].predicted, r.pareto[i - 1].predicted);
    }
  }
  // The whole float model fits a ratio above 1: nothing is quantized, nothing is predicted lost.
  EXPECT_EQ(last, 0.0);
}

TEST(Search, MinBitsAndTiesAreHonoured) {
  Fixture f = make_fixture();
  SearchOptions o = options(0.3);
  o.min_bits = {{"fc1", 8}, {"head", 8}};
  o.ties = {{"fc2", "fc3"}};
  const SearchResult r = search(*f.model, Scheme(qint8), 2, f.loss, o);
  std::map<std::string, std::string> chosen;
  for (const LayerChoice& l : r.layers) chosen[l.path] = l.candidates[l.chosen].candidate;
  for (const char* p : {"fc1", "head"}) {
    EXPECT_TRUE(chosen[p] == "qint8 per_channel" || chosen[p] == "float") << p << ": " << chosen[p];
  }
  EXPECT_EQ(chosen["fc2"], chosen["fc3"]);
}

TEST(Search, TheRecipesOwnRuleForALayerKeepsItsOtherSettings) {
  Fixture f = make_fixture();
  Scheme base(qint8);
  base.activations = ActivationMode::kDynamicPerToken;
  LayerRule head;
  head.pattern = "head";
  head.activations = ActivationMode::kNone;
  base.rules.push_back(head);
  const SearchResult r = search(*f.model, base, 2, f.loss, options(0.3));
  quantize(*f.model, apply(base, r));
  EXPECT_EQ(f.model->head->scheme().activations, ActivationMode::kNone);
  EXPECT_EQ(f.model->fc2->scheme().activations, ActivationMode::kDynamicPerToken);
}

TEST(Search, InfeasibleBudgetNamesTheSmallestReachableSize) {
  Fixture f = make_fixture();
  try {
    search(*f.model, Scheme(qint8), 2, f.loss, options(0.01));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be met: the smallest reachable is"), std::string::npos) << e.what();
  }
}

TEST(Search, LossMethodRanksTwoBitsAboveEightBitsOnEveryLayer) {
  Fixture f = make_fixture();
  const SearchResult r = search(*f.model, Scheme(qint8), 2, f.loss, options(0.3, Method::kLoss));
  for (const LayerChoice& l : r.layers) {
    double s8 = 0, s2 = 0;
    for (const CandidateCost& c : l.candidates) {
      if (c.candidate == "qint8 per_channel") s8 = c.sensitivity;
      if (c.candidate == "qint2 per_group(16)") s2 = c.sensitivity;
    }
    EXPECT_GT(s2, s8) << l.path;
  }
  // The model is back in float afterwards (the loss method attaches one layer at a time).
  for (const auto& [path, layer] : quantizable_layers(*f.model)) EXPECT_FALSE(layer->quantized()) << path;
}

TEST(Search, RulesReproduceTheChosenSchemesBitForBit) {
  Fixture f = make_fixture();
  const Scheme base(qint8);
  const SearchResult r = search(*f.model, base, 2, f.loss, options(0.3));
  quantize(*f.model, apply(base, r));
  for (const LayerChoice& l : r.layers) {
    const std::string& want = l.candidates[l.chosen].candidate;
    const QuantizableLayer* layer = nullptr;
    for (const auto& [path, q] : quantizable_layers(*f.model))
      if (path == l.path) layer = q;
    ASSERT_NE(layer, nullptr);
    if (want == "float") {
      EXPECT_FALSE(layer->quantized()) << l.path;
    } else {
      ASSERT_TRUE(layer->scheme().weights) << l.path;
      const QSpec& s = layer->scheme().weights->spec;
      const std::string got = std::string(s.qtype.name) + " " + to_string(s.granularity) +
                              (s.granularity == Granularity::kPerGroup ? "(" + std::to_string(s.group_size) + ")" : "");
      EXPECT_EQ(got, want) << l.path;
    }
  }
}

TEST(Search, RejectsQuantizedModelsAndBadBudgets) {
  Fixture f = make_fixture();
  SearchOptions none = options(0.3);
  none.budget = Budget{};
  EXPECT_THROW(search(*f.model, Scheme(qint8), 2, f.loss, none), Error);
  SearchOptions negative = options(-1.0);
  EXPECT_THROW(search(*f.model, Scheme(qint8), 2, f.loss, negative), Error);
  quantize(*f.model, Scheme(qint8));
  EXPECT_THROW(search(*f.model, Scheme(qint8), 2, f.loss, options(0.3)), Error);
}

TEST(Search, EveryMethodNameHasOneSensitivityStrategy) {
  for (const std::string& name : method_names()) {
    const Method m = method_from_name(name);
    EXPECT_EQ(sensitivity_method(m).method(), m) << name;
    EXPECT_EQ(to_string(m), name);
    // Only the histogram method prices activations; the others reject activation candidates.
    EXPECT_EQ(sensitivity_method(m).searches_activations(), m == Method::kHistogram) << name;
  }
  EXPECT_EQ(method_names().size(), 3u);
}

// A fresh temporary file path, removed at scope exit.
struct TempPath {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("qforge_latency_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++) + ".json"))
                         .string();
  ~TempPath() { std::filesystem::remove(path); }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

TEST(Search, LayersAreTimedAtTheShapeTheySeeAndTheLatencyBudgetHolds) {
  Fixture f = make_fixture();
  const TempPath cache;
  SearchOptions o = options(0.0);
  o.budget = Budget{};
  o.latency.cache_path = cache.path;
  o.latency.repeats = 3;
  // First a generous budget: every layer measured, nothing from the (absent) cache file.
  o.budget.latency_ms = 1e6;
  const SearchResult loose = search(*f.model, Scheme(qint8), 2, f.loss, o);
  EXPECT_GT(loose.latency_measured, 0);  // (fc2 and fc3 share shapes: one timing serves both)
  EXPECT_EQ(loose.pareto_axis, "latency_ms");
  ASSERT_EQ(loose.layers.size(), 4u);
  EXPECT_EQ(loose.layers[0].input_shape, (std::vector<int64_t>{64, 32}));  // batch 0 of the fixture
  EXPECT_EQ(loose.layers[3].input_shape, (std::vector<int64_t>{64, 64}));
  double fastest = 0, slowest = 0;
  for (const LayerChoice& l : loose.layers) {
    double lo = 1e30, hi = 0;
    for (const CandidateCost& c : l.candidates) {
      EXPECT_GT(c.latency_ms, 0) << l.path << " " << c.candidate;
      EXPECT_FALSE(c.kernel.empty());
      lo = std::min(lo, c.latency_ms);
      hi = std::max(hi, c.latency_ms);
    }
    fastest += lo;
    slowest += hi;
  }
  // A budget between the fastest and the slowest choice binds, and holds.
  o.budget.latency_ms = fastest + 0.25 * (slowest - fastest);
  const SearchResult r = search(*f.model, Scheme(qint8), 2, f.loss, o);
  EXPECT_EQ(r.latency_measured, 0);  // all from the cache file the first search wrote
  EXPECT_GT(r.latency_cached, 0);
  double total = 0;
  for (size_t i = 0; i < r.layers.size(); ++i) {
    const CandidateCost& c = r.layers[i].candidates[r.layers[i].chosen];
    total += c.latency_ms;
    // Cached figures are the measured ones.
    EXPECT_DOUBLE_EQ(c.latency_ms, loose.layers[i].candidates[r.layers[i].chosen].latency_ms);
  }
  EXPECT_LE(total, *o.budget.latency_ms + 1e-12);
  EXPECT_NEAR(r.latency_ms, total, 1e-9);  // the MLP has no unsearched layer with weights
  EXPECT_GE(r.predicted, loose.predicted);
  // Size and latency together: both hold. The latency budget is the one the size-only choice
  // needs, so the pair is feasible whatever this machine's timings are.
  SearchOptions size_only = o;
  size_only.budget = Budget{};
  size_only.budget.size_ratio = 0.4;
  const SearchResult by_size = search(*f.model, Scheme(qint8), 2, f.loss, size_only);
  o.budget.size_ratio = 0.4;
  o.budget.latency_ms = by_size.latency_ms * (1 + 1e-9);
  const SearchResult both = search(*f.model, Scheme(qint8), 2, f.loss, o);
  EXPECT_NEAR(both.predicted, by_size.predicted, 1e-12 + 1e-9 * by_size.predicted);
  EXPECT_LE(static_cast<double>(both.bytes), 0.4 * both.float_bytes);
  EXPECT_LE(both.latency_ms, *o.budget.latency_ms + 1e-12);
  EXPECT_EQ(both.pareto_axis, "bytes");
  EXPECT_EQ(both.budget.to_string().rfind("size_ratio: 0.4, latency_ms: ", 0), 0u) << both.budget.to_string();
}

// Issue 39 item 8: with progress on, the search says how far its sensitivities and its pricing
// are (layers priced, kernels timed, from the cache, time left) instead of staying silent.
TEST(Search, Issue39Item8ProgressCountsLayersPricedAndKernelsTimed) {
  Fixture f = make_fixture();
  const TempPath cache;
  SearchOptions o = options(0.0);
  o.budget = Budget{};
  o.budget.latency_ms = 1e6;
  o.latency.cache_path = cache.path;
  o.latency.repeats = 1;
  o.progress = true;
  ::testing::internal::CaptureStderr();
  const SearchResult r = search(*f.model, Scheme(qint8), 2, f.loss, o);
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("search: sensitivities:  50% (1/2)"), std::string::npos) << out;  // one step per batch
  EXPECT_NE(out.find("search: sensitivities: done in"), std::string::npos) << out;
  EXPECT_NE(out.find("search: pricing layers:  50% (2/4)"), std::string::npos) << out;
  EXPECT_NE(out.find("search: pricing layers: 100% (4/4)"), std::string::npos) << out;
  EXPECT_NE(out.find("search: pricing layers: done in"), std::string::npos) << out;
  EXPECT_NE(out.find(" eta "), std::string::npos) << out;
  EXPECT_NE(out.find(std::to_string(r.latency_measured) + " kernels timed, " + std::to_string(r.latency_cached) +
                     " from the cache"),
            std::string::npos)
      << out;
  // Off (the default): nothing on stderr.
  o.progress = false;
  ::testing::internal::CaptureStderr();
  search(*f.model, Scheme(qint8), 2, f.loss, o);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(Search, ACandidateNoLayerCanTakeNamesItsIndex) {
  Fixture f = make_fixture();
  SearchOptions o = options(0.5);
  o.candidates.push_back(Candidate{qint4, Granularity::kPerGroup, 48, std::nullopt});  // 32 and 64 in_features: no fit
  try {
    check_search(*f.model, Scheme(qint8), o);
    FAIL() << "expected a SearchError";
  } catch (const SearchError& e) {
    EXPECT_EQ(e.candidate(), 4);
    EXPECT_NE(std::string(e.what()).find("qint4 per_group(48)' fits no searched layer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a multiple of group_size 48"), std::string::npos) << e.what();
  }
}

TEST(Search, AnotherBudgetReusesStoredSensitivitiesAndChangedWeightsMeasureAgain) {
  Fixture f = make_fixture();
  const SearchResult first = search(*f.model, Scheme(qint8), 2, f.loss, options(0.5));
  EXPECT_FALSE(first.reused);
  ASSERT_EQ(first.sensitivities.values.size(), 4u);
  // Through a calibration dump file, as qtrain keeps them.
  const TempPath file;
  io::save_calibration_dump(file.path, {}, &first.sensitivities);
  const std::optional<io::SearchSensitivities> stored = io::load_search_sensitivities(file.path);
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->key, first.sensitivities.key);
  EXPECT_TRUE(io::load_calibration_dump(file.path).empty());  // not mistaken for a module
  SearchOptions o = options(0.3);
  o.reuse = &*stored;
  const SearchResult second = search(*f.model, Scheme(qint8), 2, f.loss, o);
  EXPECT_TRUE(second.reused) << second.reuse_note;
  for (size_t i = 0; i < first.layers.size(); ++i)
    for (size_t c = 0; c < first.layers[i].candidates.size(); ++c)
      EXPECT_EQ(second.layers[i].candidates[c].sensitivity, first.layers[i].candidates[c].sensitivity);
  // Other probes, or other weights: measured again, and the report says why.
  SearchOptions probes = o;
  probes.hutchinson.max_probes = 16;
  const SearchResult other = search(*f.model, Scheme(qint8), 2, f.loss, probes);
  EXPECT_FALSE(other.reused);
  EXPECT_NE(other.reuse_note.find("other settings"), std::string::npos) << other.reuse_note;
  {
    at::NoGradGuard no_grad;
    f.model->fc2->weight.mul_(1.01);
  }
  EXPECT_FALSE(search(*f.model, Scheme(qint8), 2, f.loss, o).reused);
}

TEST(Search, HistogramMethodReadsTheCalibrationAndSearchesActivations) {
  Fixture f = make_fixture();
  Scheme base(qint8);
  base.activations = ActivationMode::kStatic;  // histogram observers by default
  // The base scheme's calibration, as qtrain's search stage makes it; then float again.
  quantize(*f.model, base);
  {
    Calibration calib(*f.model);
    for (const at::Tensor& x : f.x) f.model->forward(x);
    calib.finish();
  }
  const io::CalibrationDump calibration = io::calibration_dump(*f.model);
  for_each_quantizable(*f.model, [](const std::string&, QuantizableLayer& l) { l.detach(); });

  SearchOptions o = options(0.5, Method::kHistogram);
  EXPECT_THROW(search(*f.model, base, 2, f.loss, o), SearchError);  // no calibration given
  o.calibration = &calibration;
  std::vector<Candidate> cands;
  for (Candidate c : candidates()) {
    if (!c.qtype) {
      cands.push_back(c);
      continue;
    }
    for (ActivationMode a : {ActivationMode::kStatic, ActivationMode::kNone}) {
      c.activations = a;
      cands.push_back(c);
    }
  }
  o.candidates = cands;
  const SearchResult r = search(*f.model, base, 2, f.loss, o);
  for (const LayerChoice& l : r.layers) {
    // One histogram, every width: fewer bits, more error.
    ASSERT_EQ(l.activation_error.size(), 3u) << l.path;
    EXPECT_LT(l.activation_error.at("qint8"), l.activation_error.at("qint4")) << l.path;
    EXPECT_LT(l.activation_error.at("qint4"), l.activation_error.at("qint2")) << l.path;
    // Same weights, float inputs: exactly the weight's share, which the static input adds to.
    std::map<std::string, double> by_name;
    for (const CandidateCost& c : l.candidates) by_name[c.candidate] = c.sensitivity;
    const double w_only = by_name.at("qint8 per_channel / a:float");
    EXPECT_GT(w_only, 0);
    EXPECT_NEAR(by_name.at("qint8 per_channel / a:static") - w_only, l.activation_error.at("qint8"),
                1e-9 + 1e-6 * w_only);
    EXPECT_EQ(by_name.at("float"), 0.0);
  }
  EXPECT_LE(static_cast<double>(r.bytes), 0.5 * r.float_bytes);
  // Activation choices belong to the histogram method only.
  SearchOptions hessian = o;
  hessian.method = Method::kHessian;
  try {
    search(*f.model, base, 2, f.loss, hessian);
    ADD_FAILURE() << "expected a SearchError";
  } catch (const SearchError& e) {
    EXPECT_NE(std::string(e.what()).find("histogram method only"), std::string::npos) << e.what();
  }
  // The rules carry the activation choice: a rerun builds the same layers.
  quantize(*f.model, apply(base, r));
  for (size_t i = 0; i < r.layers.size(); ++i) {
    const LayerChoice& l = r.layers[i];
    const std::string& chosen = l.candidates[l.chosen].candidate;
    QuantizableLayer* layer = nullptr;
    for (const auto& [path, ql] : quantizable_layers(*f.model))
      if (path == l.path) layer = ql;
    ASSERT_NE(layer, nullptr);
    if (chosen == "float") {
      EXPECT_FALSE(layer->quantized()) << l.path;
    } else {
      const bool static_in = chosen.find("a:static") != std::string::npos;
      EXPECT_EQ(layer->scheme().activations, static_in ? ActivationMode::kStatic : ActivationMode::kNone) << l.path;
    }
  }
}

TEST(Search, AnActivationChoiceALayerCannotTakeIsSkippedNotMislabelled) {
  struct Net : torch::nn::Module {
    Net() : emb(register_module("emb", nn::Embedding(10, 16))), fc(register_module("fc", nn::Linear(16, 4))) {}
    at::Tensor forward(const at::Tensor& i) { return fc(emb(i)); }
    nn::Embedding emb;
    nn::Linear fc;
  };
  at::manual_seed(1);
  auto net = std::make_shared<Net>();
  const at::Tensor idx = at::randint(0, 10, {32}, at::kLong), y = at::randint(0, 4, {32}, at::kLong);
  Scheme base(qint8);
  base.activations = ActivationMode::kStatic;
  quantize(net, base);
  {
    Calibration calib(net);
    net->forward(idx);
  }
  const io::CalibrationDump calibration = io::calibration_dump(*net);
  for_each_quantizable(*net, [](const std::string&, QuantizableLayer& l) { l.detach(); });
  SearchOptions o;
  o.method = Method::kHistogram;
  o.calibration = &calibration;
  for (ActivationMode a : {ActivationMode::kStatic, ActivationMode::kNone})
    o.candidates.push_back(Candidate{qint8, Granularity::kPerChannel, 0, a});
  o.budget.size_ratio = 1.0;
  const SearchResult r = search(*net, base, 1, [&](int64_t) { return at::cross_entropy_loss(net->forward(idx), y); }, o);
  ASSERT_EQ(r.layers.size(), 2u);
  EXPECT_EQ(r.layers[0].path, "emb");
  ASSERT_EQ(r.layers[0].candidates.size(), 1u);  // indices take no static quantizer
  EXPECT_EQ(r.layers[0].candidates[0].candidate, "qint8 per_channel / a:float");
  EXPECT_EQ(r.layers[1].candidates.size(), 2u);
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0].rfind("qint8 per_channel / a:static on emb: ", 0), 0u) << r.skipped[0];
}

TEST(LatencyCache, RoundTripsAndRefusesForeignFiles) {
  const TempPath p;
  {
    LatencyCache c(p.path);
    EXPECT_FALSE(c.find("k").has_value());
    c.put("k", 0.25);
    c.save();
  }
  LatencyCache again(p.path);
  ASSERT_TRUE(again.find("k").has_value());
  EXPECT_DOUBLE_EQ(*again.find("k"), 0.25);
  EXPECT_EQ(again.hits(), 2);
  std::ofstream(p.path) << "{\"entries\": {}}";
  EXPECT_THROW(LatencyCache{p.path}, Error);
  std::ofstream(p.path) << "not json";
  try {
    LatencyCache bad(p.path);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p.path), std::string::npos) << e.what();
  }
  // The file the refusal names is left as it was.
  std::ifstream in(p.path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "not json");
}

// Issue 39 item 17: an unwritable cache is a warning naming it (the measured latencies are still
// used), and a cache that is a symbolic link is written through the link.
TEST(LatencyCache, Item17UnwritableCacheIsAWarningAndASymlinkIsWrittenThrough) {
  namespace fs = std::filesystem;
  const TempPath dir;
  fs::create_directories(dir.path);
  const std::string target = dir.path + "/real/latency.json", link = dir.path + "/link.json";
  fs::create_directories(dir.path + "/real");
  fs::create_symlink("real/latency.json", link);  // relative and dangling until the first save
  {
    LatencyCache c(link);
    c.put("k", 0.5);
    EXPECT_EQ(c.save(), "");
  }
  EXPECT_TRUE(fs::is_symlink(link));
  ASSERT_TRUE(fs::is_regular_file(target));
  {
    LatencyCache c(link);
    ASSERT_TRUE(c.find("k").has_value());
    c.put("k2", 0.75);
    EXPECT_EQ(c.save(), "");
  }
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(LatencyCache(target).find("k2").has_value());
  // A path under a regular file can never be created (root included, unlike a read-only directory).
  const std::string blocked = target + "/sub/latency.json";
  LatencyCache c(blocked);
  c.put("k", 0.5);
  const std::string warning = c.save();
  EXPECT_NE(warning.find("latency cache " + blocked + " could not be written"), std::string::npos) << warning;
  EXPECT_NE(warning.find("search.latency_cache"), std::string::npos) << warning;
  EXPECT_NE(warning.find("off"), std::string::npos) << warning;
  EXPECT_TRUE(c.find("k").has_value());  // the measurements stay usable
  fs::remove_all(dir.path);
}

TEST(Latency, ColdTimingIsPositiveAndKeysNameTheMachine) {
  Fixture f = make_fixture();
  const QuantizableLayer::InputRecord rec{{8, 32}, at::kFloat};
  const at::Tensor x = synthetic_input(rec, 0);
  EXPECT_EQ(x.sizes().vec(), rec.shape);
  EXPECT_GT(time_forward_ms(*f.model->fc1, x, LatencyOptions{}), 0.0);
  const std::string key = latency_key(*f.model->fc1, {64, 32}, rec, "float");
  EXPECT_NE(key.find(cpu_model_name()), std::string::npos);
  EXPECT_NE(key.find("x[8,32]:Float"), std::string::npos) << key;
  const at::Tensor idx = synthetic_input({{5}, at::kLong}, 7);
  EXPECT_LT(idx.max().item<int64_t>(), 7);
  EXPECT_GE(idx.min().item<int64_t>(), 0);
}

}  // namespace
}  // namespace qforge::search
