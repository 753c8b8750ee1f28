// The mixed-precision search over ranks (threads of this process): whatever each rank measured,
// every rank chooses rank 0's widths, from rank 0's latencies and sensitivities.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "framework/api/quantize.h"
#include "framework/dist/world.h"
#include "framework/nn/linear.h"
#include "framework/search/search.h"
#include "tests/dist/ranks.h"

namespace qforge::dist {
namespace {

namespace fs = std::filesystem;

struct TwoLayers : torch::nn::Module {
  TwoLayers() : fc1(register_module("fc1", nn::Linear(64, 64))), fc2(register_module("fc2", nn::Linear(64, 8))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(at::relu(fc1(x))); }
  nn::Linear fc1, fc2;
};

struct SearchSetup {
  std::shared_ptr<TwoLayers> model;
  std::function<at::Tensor(int64_t)> loss;
};

// Weights and data from a private generator: the ranks are threads of this process, and another
// rank's thread may draw from the global generator at any time (the latency timer's random inputs),
// which would change a model seeded through it (a rank's sensitivities then differed by 20 %).
SearchSetup make_setup() {
  const std::lock_guard<std::mutex> lock(g_init_mutex);
  at::Generator gen = at::detail::createCPUGenerator(4);
  SearchSetup s;
  s.model = std::make_shared<TwoLayers>();
  s.model->eval();
  {
    at::NoGradGuard no_grad;
    for (at::Tensor& p : s.model->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.1);
  }
  const at::Tensor x = at::randn({32, 64}, gen), y = at::randn({32, 8}, gen);
  s.loss = [m = s.model, x, y](int64_t) { return at::mse_loss(m->forward(x), y); };
  return s;
}

search::SearchOptions search_options(const std::string& cache) {
  search::SearchOptions o;
  o.method = search::Method::kHessian;  // sensitivities from seeded random probes (hutchinson.seed)
  o.candidates = {search::Candidate{qint8, Granularity::kPerChannel, 0, std::nullopt},
                  search::Candidate{std::nullopt, Granularity::kPerChannel, 0, std::nullopt}};
  o.hutchinson.max_probes = 8;
  o.latency.cache_path = cache;
  o.latency.repeats = 1;
  o.latency.cold = false;
  // With a latency table where float costs 100 ms and qint8 1 ms, one layer may stay float; where
  // float costs 1 ms and qint8 100 ms, both may.
  o.budget.latency_ms = 150;
  return o;
}

// Rewrites a latency cache this machine filled: every float kernel `float_ms`, every other one
// `quantized_ms` (what a rank measuring other figures near a budget's boundary would see).
void rewrite_cache(const std::string& from, const std::string& to, double float_ms, double quantized_ms) {
  nlohmann::json j;
  std::ifstream(from) >> j;
  ASSERT_FALSE(j["entries"].empty());
  for (auto& [key, ms] : j["entries"].items()) ms = key.find("|float|") != std::string::npos ? float_ms : quantized_ms;
  std::ofstream(to) << j.dump();
}

std::string choice_of(const search::SearchResult& r) {
  std::string out;
  for (const search::LayerChoice& lc : r.layers) out += lc.path + "=" + lc.candidates[lc.chosen].candidate + ";";
  return out;
}

struct Caches {
  fs::path dir = fs::temp_directory_path() / ("qforge_dist_search_" + std::to_string(::getpid()));
  std::string measured = (dir / "measured.json").string(), slow_float = (dir / "slow_float.json").string(),
              slow_int8 = (dir / "slow_int8.json").string();
  Caches() { fs::create_directories(dir); }
  ~Caches() { fs::remove_all(dir); }
};

// Issue 39 item 14: ranks that measured different latencies near a latency budget chose different
// widths and exited 0 with different models. Rank 0's table decides for all.
TEST(DistSearch, Issue39Item14EveryRankChoosesRankZerosWidths) {
  const Caches c;
  {
    SearchSetup s = make_setup();  // fills the cache with this machine's keys
    search::search(*s.model, Scheme(qint8), 1, s.loss, search_options(c.measured));
  }
  rewrite_cache(c.measured, c.slow_float, 100, 1);
  rewrite_cache(c.measured, c.slow_int8, 1, 100);
  // Alone, the two tables choose differently: the disagreement two ranks would act on.
  SearchSetup alone = make_setup();
  const search::SearchResult a = search::search(*alone.model, Scheme(qint8), 1, alone.loss, search_options(c.slow_float));
  const search::SearchResult b = search::search(*alone.model, Scheme(qint8), 1, alone.loss, search_options(c.slow_int8));
  ASSERT_NE(choice_of(a), choice_of(b));
  EXPECT_EQ(a.latency_measured + b.latency_measured, 0);  // every latency from the tables
  EXPECT_EQ(choice_of(b), "fc1=float;fc2=float;");
  // Rank 1 draws other Hessian probes (another seed): alone, its sensitivities differ from rank 0's.
  search::SearchOptions other_probes = search_options(c.slow_float);
  other_probes.hutchinson.seed = 1;
  const search::SearchResult a1 = search::search(*alone.model, Scheme(qint8), 1, alone.loss, other_probes);
  ASSERT_NE(a1.layers.at(0).candidates.at(0).sensitivity, a.layers.at(0).candidates.at(0).sensitivity);

  for (const bool rank1_times : {true, false}) {
    SCOPED_TRACE(rank1_times ? "rank 1 times with its own table" : "rank 1 times nothing");
    std::vector<search::SearchResult> results(2);
    run_ranks(2, [&](World& w) {
      SearchSetup s = make_setup();
      search::SearchOptions o = search_options(w.rank() == 0 ? c.slow_float : c.slow_int8);
      o.hutchinson.seed = static_cast<uint64_t>(w.rank());
      if (w.rank() != 0 && !rank1_times) {
        o.latency.time_kernels = false;
        o.latency.cache_path.clear();
      }
      o.from_rank0 = [&w](const std::function<std::string()>& table) {
        const std::string text = table();  // every rank's, so a rank other than 0 sending one is tested too
        const std::vector<uint8_t> got = w.broadcast_bytes(std::vector<uint8_t>(text.begin(), text.end()), 0);
        return std::string(got.begin(), got.end());
      };
      results[w.rank()] = search::search(*s.model, Scheme(qint8), 1, s.loss, o);
    });
    // Rank 0's table (float slow) keeps one layer float; rank 1's own would keep both.
    const std::string chosen = choice_of(results[0]);
    EXPECT_EQ(chosen.find("=float;"), chosen.rfind("=float;")) << chosen;
    EXPECT_NE(chosen.find("=float;"), std::string::npos) << chosen;
    EXPECT_EQ(choice_of(results[1]), choice_of(results[0]));
    EXPECT_EQ(results[1].latency_ms, results[0].latency_ms);
    EXPECT_EQ(results[1].predicted, results[0].predicted);
    for (size_t i = 0; i < results[0].layers.size(); ++i)
      for (size_t k = 0; k < results[0].layers[i].candidates.size(); ++k) {
        const search::CandidateCost &c0 = results[0].layers[i].candidates[k], &c1 = results[1].layers[i].candidates[k];
        EXPECT_EQ(c1.latency_ms, c0.latency_ms) << c0.candidate;
        EXPECT_EQ(c1.sensitivity, c0.sensitivity) << c0.candidate;  // rank 0's probes, not rank 1's own
        EXPECT_EQ(c0.sensitivity, a.layers[i].candidates[k].sensitivity) << c0.candidate;
      }
  }
}

TEST(DistSearch, BytesFromRankZeroReachEveryRank) {
  std::vector<std::vector<uint8_t>> got(3);
  run_ranks(3, [&](World& w) {
    const std::vector<uint8_t> mine(static_cast<size_t>(w.rank() * 5), static_cast<uint8_t>(w.rank() + 1));
    got[w.rank()] = w.broadcast_bytes(mine, 1);
    EXPECT_TRUE(w.broadcast_bytes({}, 0).empty());
  });
  for (const auto& g : got) EXPECT_EQ(g, std::vector<uint8_t>(5, 2));
}

TEST(DistSearch, NotTimingNeedsALatencySource) {
  SearchSetup s = make_setup();
  search::SearchOptions o = search_options("");
  o.latency.time_kernels = false;
  EXPECT_THROW(search::search(*s.model, Scheme(qint8), 1, s.loss, o), search::SearchError);
}

}  // namespace
}  // namespace qforge::dist
