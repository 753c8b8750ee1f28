// Data-parallel calibration and QAT over c10d: two and three ranks as threads of this process,
// each with its own TCPStore client and Gloo process group on 127.0.0.1 (a free port per test).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "framework/core/error.h"
#include "framework/dist/sync.h"
#include "framework/dist/world.h"
#include "framework/nn/batch_norm.h"
#include "framework/nn/linear.h"
#include "framework/api/quantize.h"
#include "framework/train/trainer.h"
#include "tests/dist/ranks.h"

namespace qforge::dist {
namespace {

TEST(Dist, ShardsAreDisjointEqualAndSeedDeterministic) {
  for (const int size : {1, 2, 3}) {
    std::set<int64_t> seen;
    for (int r = 0; r < size; ++r) {
      const auto s = shard_indices(100, r, size, 7);
      EXPECT_EQ(static_cast<int64_t>(s.size()), 100 / size);
      EXPECT_EQ(s, shard_indices(100, r, size, 7));  // same seed, same shard
      for (const int64_t i : s) EXPECT_TRUE(seen.insert(i).second) << "index " << i << " in two shards";
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), (100 / size) * size);
  }
  EXPECT_EQ(shard_indices(5, 1, 2), (std::vector<int64_t>{1, 3}));  // no seed: strided order
  EXPECT_NE(shard_indices(100, 0, 2, 1), shard_indices(100, 0, 2, 2));
  EXPECT_THROW(shard_indices(10, 2, 2), Error);
}

TEST(Dist, CollectivesOnThreeRanks) {
  run_ranks(3, [](World& w) {
    at::Tensor t = at::full({4}, static_cast<float>(w.rank() + 1));
    w.all_reduce(t, Reduce::kSum);
    EXPECT_TRUE(at::equal(t, at::full({4}, 6.0f)));
    at::Tensor m = at::full({1}, static_cast<int64_t>(w.rank()), at::kLong);
    w.all_reduce(m, Reduce::kMax);
    EXPECT_EQ(m.item<int64_t>(), 2);
    const auto all = w.all_gather_bytes(std::vector<uint8_t>(static_cast<size_t>(w.rank()), uint8_t(w.rank())));
    ASSERT_EQ(all.size(), 3u);
    for (int r = 0; r < 3; ++r) EXPECT_EQ(all[r], std::vector<uint8_t>(static_cast<size_t>(r), uint8_t(r)));
    at::Tensor b = w.rank() == 1 ? at::arange(5, at::kFloat) : at::zeros({5});
    w.broadcast(b, 1);
    EXPECT_TRUE(at::equal(b, at::arange(5, at::kFloat)));
    w.barrier();
  });
}

Scheme static_scheme(const std::string& observer) {
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.observer = observer;
  return s;
}

// The input quantizer's scale and zero point after calibrating on `batches`.
std::pair<at::Tensor, at::Tensor> calibrate(const std::vector<at::Tensor>& batches, const std::string& observer,
                                            const World* w) {
  std::unique_lock<std::mutex> lock(g_init_mutex);
  torch::manual_seed(3);
  nn::Linear lin(16, 8);
  quantize(lin, static_scheme(observer));
  lock.unlock();
  Calibration c(lin);
  for (const auto& b : batches) lin->forward(b);
  if (w != nullptr) {
    EXPECT_EQ(sync_observers(*lin, *w), 1);
  }
  c.finish();
  const QParams qp = lin->input_quantizer()->qparams();
  return {qp.scale.clone(), qp.zero_point.clone()};
}

TEST(Dist, MinMaxCalibrationOverRanksEqualsOneProcessBitForBit) {
  torch::manual_seed(4);
  std::vector<at::Tensor> data;
  for (int i = 0; i < 12; ++i) data.push_back(at::randn({4, 16}) * (1 + i % 5));
  const auto [s1, z1] = calibrate(data, "minmax", nullptr);
  for (const int size : {2, 3}) {
    SCOPED_TRACE(size);
    run_ranks(size, [&](World& w) {
      std::vector<at::Tensor> mine;
      for (const int64_t i : shard_indices(static_cast<int64_t>(data.size()), w.rank(), w.size(), 11))
        mine.push_back(data[static_cast<size_t>(i)]);
      const auto [s, z] = calibrate(mine, "minmax", &w);
      EXPECT_TRUE(at::equal(s, s1)) << w.prefix() << ": " << s << " vs " << s1;
      EXPECT_TRUE(at::equal(z, z1));
    });
  }
}

TEST(Dist, HistogramCalibrationGivesEveryRankTheSameQParams) {
  torch::manual_seed(5);
  std::vector<at::Tensor> data;
  for (int i = 0; i < 6; ++i) data.push_back(at::randn({32, 16}) * (1 + i));
  std::vector<std::vector<float>> scales(2);
  run_ranks(2, [&](World& w) {
    std::vector<at::Tensor> mine;
    for (const int64_t i : shard_indices(6, w.rank(), 2)) mine.push_back(data[static_cast<size_t>(i)]);
    scales[w.rank()] = {calibrate(mine, "histogram", &w).first.item<float>()};
  });
  EXPECT_EQ(scales[0], scales[1]);
}

TEST(Dist, AveragedGradientsEqualTheWholeBatchGradient) {
  torch::manual_seed(6);
  const at::Tensor x = at::randn({12, 16}), target = at::randn({12, 8});
  auto make = [] {
    const std::lock_guard<std::mutex> lock(g_init_mutex);
    torch::manual_seed(9);
    nn::Linear lin(16, 8);
    Scheme s(qint8);  // QAT on int8 weights
    s.weight_lsq = true;
    quantize(lin, s);
    return lin;
  };
  nn::Linear one = make();
  at::mse_loss(one->forward(x), target).backward();
  std::vector<at::Tensor> want;
  // A parameter the loss does not reach has no gradient; average_gradients gives it zeros.
  for (const auto& p : one->parameters()) want.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
  for (const int size : {2, 3}) {
    SCOPED_TRACE(size);
    run_ranks(size, [&](World& w) {
      nn::Linear lin = make();
      // LSQ scales are created by the first forward; every rank must hold the same ones.
      const auto idx = shard_indices(12, w.rank(), w.size());
      const at::Tensor ix = at::tensor(idx, at::kLong);
      at::mse_loss(lin->forward(x.index_select(0, ix)), target.index_select(0, ix)).backward();
      check_replicas(*lin, w, "before the step");
      average_gradients(*lin, w, /*bucket_bytes=*/256);  // several buckets
      const auto params = lin->parameters();
      ASSERT_EQ(params.size(), want.size());
      for (size_t i = 0; i < params.size(); ++i) {
        const at::Tensor g = params[i].grad().defined() ? params[i].grad() : at::zeros_like(params[i]);
        EXPECT_LT((g - want[i]).abs().max().item<float>(), 1e-6f) << w.prefix() << " parameter " << i;
      }
      // The same through hooks during backward, three steps with one averager (it resets).
      GradientAverager overlap(*lin, w, /*bucket_bytes=*/256);
      for (int step = 0; step < 3; ++step) {
        for (auto& p : lin->parameters())
          if (p.grad().defined()) p.mutable_grad().zero_();
        at::mse_loss(lin->forward(x.index_select(0, ix)), target.index_select(0, ix)).backward();
        overlap.finish();
        for (size_t i = 0; i < params.size(); ++i) {
          const at::Tensor g = params[i].grad().defined() ? params[i].grad() : at::zeros_like(params[i]);
          EXPECT_LT((g - want[i]).abs().max().item<float>(), 1e-6f) << w.prefix() << " step " << step << " parameter " << i;
        }
      }
      // With buckets of 256 bytes the weight's gradient (512 bytes) is a bucket of its own; the
      // ones backward produces before the unreached parameter's bucket started during backward.
      EXPECT_GE(overlap.last_overlapped_buckets(), 1) << w.prefix();
    });
  }
}

TEST(Dist, EvaluationOverRanksEqualsOneProcess) {
  auto make = [] {
    const std::lock_guard<std::mutex> lock(g_init_mutex);
    torch::manual_seed(12);
    return nn::Linear(6, 5);
  };
  nn::Linear lin = make();
  for (const int64_t n : {103, 15}) {  // 11 batches over 3 ranks; 2 batches (rank 2 has none)
    SCOPED_TRACE(n);
    const train::TensorBatches data(at::randn({n, 6}), at::randint(0, 5, {n}, at::kLong));
    const train::Metrics one =
        train::evaluate(*lin, data, [&](const train::Batch& b) { return lin->forward(b.input); }, 10, "eval", false);
    for (const int size : {2, 3}) {
      run_ranks(size, [&](World& w) {
        nn::Linear mine = make();
        const auto forward = [&](const train::Batch& b) { return mine->forward(b.input); };
        train::EvalSplit split;
        split.rank = w.rank();
        split.world_size = w.size();
        split.all_reduce_sum = [&w](at::Tensor& t) { w.all_reduce(t, Reduce::kSum); };
        const train::Metrics m = train::evaluate(*mine, data, forward, 10, "eval", false, split);
        EXPECT_EQ(m.examples, one.examples) << w.prefix();
        EXPECT_EQ(m.tokens, one.tokens);
        EXPECT_EQ(m.accuracy, one.accuracy);
        EXPECT_NEAR(m.loss, one.loss, 1e-12);
        ASSERT_TRUE(m.confusion.defined());
        EXPECT_TRUE(m.confusion.equal(one.confusion)) << w.prefix();
      });
    }
  }
}

TEST(Dist, SyncBatchNormEqualsOneProcessOnTheConcatenatedBatch) {
  torch::manual_seed(14);
  const at::Tensor x = at::randn({8, 3, 4, 4}) * 2 + 1, weight = at::randn({8, 3, 4, 4});
  auto make = [] {
    torch::nn::BatchNorm2d bn(3);
    torch::NoGradGuard g;
    bn->weight.copy_(at::tensor({0.5f, 1.5f, -1.0f}));
    bn->bias.copy_(at::tensor({0.1f, -0.2f, 0.3f}));
    return bn;
  };
  // One process: the whole batch, loss = mean(y * weight).
  torch::nn::BatchNorm2d one = make();
  const at::Tensor x1 = x.clone().requires_grad_(true);
  const at::Tensor y1 = one->forward(x1);
  (y1 * weight).mean().backward();
  for (const int size : {2, 4}) {
    SCOPED_TRACE(size);
    run_ranks(size, [&](World& w) {
      torch::nn::BatchNorm2d bn = make();
      const int64_t per = 8 / w.size();
      const at::Tensor xr = x.narrow(0, w.rank() * per, per).clone().requires_grad_(true);
      nn::SyncBatchNormScope scope([&w](at::Tensor& t) { w.all_reduce(t, Reduce::kSum); });
      const at::Tensor y = nn::batch_norm(*bn, xr);
      (y * weight.narrow(0, w.rank() * per, per)).mean().backward();
      average_gradients(*bn, w);
      EXPECT_LT((y - y1.narrow(0, w.rank() * per, per)).abs().max().item<float>(), 1e-5f) << w.prefix();
      // Each rank's mean loss is size x its share of the whole batch's: so is its input gradient.
      const at::Tensor want = x1.grad().narrow(0, w.rank() * per, per) * static_cast<float>(w.size());
      EXPECT_LT((xr.grad() - want).abs().max().item<float>(), 1e-5f) << w.prefix();
      EXPECT_LT((bn->weight.grad() - one->weight.grad()).abs().max().item<float>(), 1e-5f);
      EXPECT_LT((bn->bias.grad() - one->bias.grad()).abs().max().item<float>(), 1e-5f);
      EXPECT_LT((bn->running_mean - one->running_mean).abs().max().item<float>(), 1e-5f);
      EXPECT_LT((bn->running_var - one->running_var).abs().max().item<float>(), 1e-5f);
      EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 1);
      // In eval mode, or outside a scope, it is the module's own forward.
      bn->eval();
      EXPECT_TRUE(nn::batch_norm(*bn, xr.detach()).equal(bn->forward(xr.detach())));
    });
  }
  torch::nn::BatchNorm2d lone = make();
  EXPECT_TRUE(nn::batch_norm(*lone, x).equal(make()->forward(x)));
}

TEST(Dist, DisagreementIsNamedOnEveryRank) {
  std::vector<std::string> errors(3);
  run_ranks(3, [&](World& w) {
    check_agreement(w, "the recipe", "abc");  // all agree
    try {
      check_agreement(w, "the recipe", w.rank() == 2 ? "xyz" : "abc");
    } catch (const Error& e) {
      errors[w.rank()] = e.what();
    }
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("the recipe differs between ranks: rank 0 has abc; rank 2 has xyz"), std::string::npos) << e;
  // Long values: the first line that differs.
  run_ranks(2, [&](World& w) {
    try {
      check_agreement(w, "the recipe", w.rank() == 1 ? "seed: 0\nlr: 0.003\nend\n" : "seed: 0\nlr: 0.002\nend\n");
      ADD_FAILURE() << "different recipes agreed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("line 2: rank 0 has 'lr: 0.002'; rank 1 has 'lr: 0.003'"), std::string::npos)
          << e.what();
    }
  });
}

TEST(Dist, AFailedRankIsNamedWithItsError) {
  try {
    run_ranks(
        3,
        [](World& w) {
          w.barrier();
          if (w.rank() == 1) {
            w.report_failure("stage 'float' failed: out of memory\nsecond line");
            return;
          }
          at::Tensor t = at::ones({8});
          for (int i = 0; i < 50; ++i) w.all_reduce(t, Reduce::kSum);
        },
        std::chrono::milliseconds(3000));
    ADD_FAILURE() << "all_reduce with a failed rank did not fail";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank 1 stopped: stage 'float' failed: out of memory"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("second line"), std::string::npos) << msg;
  }
}

// Issue 39 item 14: a failing rank 0 took the store (which it serves outside torchrun) with it,
// so the others said only "rank 0 is gone". It now leaves the group at once and keeps the store
// until the others have read its error: they name it within seconds, well under the timeout.
TEST(Dist, Issue39Item14AFailedRankZeroIsNamedWithItsError) {
  const auto start = std::chrono::steady_clock::now();
  std::string msg;
  try {
    run_ranks(
        2,
        [](World& w) {
          w.barrier();
          if (w.rank() == 0) {
            w.report_failure("stage 'search' failed: latency cache /x.json is not valid JSON");
            return;
          }
          at::Tensor t = at::ones({8});
          for (int i = 0; i < 50; ++i) w.all_reduce(t, Reduce::kSum);
        },
        std::chrono::seconds(60));
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("rank 1/2: all_reduce failed (rank 0 stopped: stage 'search' failed: latency cache /x.json is "
                     "not valid JSON)"),
            std::string::npos)
      << msg;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

TEST(Dist, DataParallelFitEqualsOneProcessOnTheGlobalBatch) {
  torch::manual_seed(8);
  const train::TensorBatches data(at::randn({48, 16}), at::randint(0, 4, {48}, at::kLong));
  auto make = [] {
    const std::lock_guard<std::mutex> lock(g_init_mutex);
    torch::manual_seed(10);
    torch::nn::Sequential seq(nn::Linear(16, 32), torch::nn::ReLU(), nn::Linear(32, 4));
    quantize(seq, Scheme(qint8));  // QAT: fake-quant int8 weights
    return seq;
  };
  train::TrainOptions o;
  o.epochs = 2;
  o.lr = 1e-2;
  o.seed = 3;
  o.progress = false;
  o.batch_size = 12;
  torch::nn::Sequential one = make();
  const train::TrainResult r1 = train::fit(*one, data, [&](const train::Batch& b) { return one->forward(b.input); }, o);
  for (const int size : {2, 3}) {
    SCOPED_TRACE(size);
    run_ranks(size, [&](World& w) {
      torch::nn::Sequential m = make();
      // fit() seeds the default generator (dropout): no rank may start before all are built.
      w.barrier();
      check_replicas(*m, w, "before training");
      train::TrainOptions d = o;
      d.batch_size = 12 / w.size();  // the same global batch of 12
      d.rank = w.rank();
      d.world_size = w.size();
      // 2 ranks: average_gradients after backward; 3: the averager overlapping backward.
      auto overlap = w.size() == 3 ? std::make_shared<GradientAverager>(*m, w) : nullptr;
      d.after_backward = [&](torch::nn::Module& mod) { overlap ? overlap->finish() : average_gradients(mod, w); };
      const train::TrainResult r = train::fit(*m, data, [&](const train::Batch& b) { return m->forward(b.input); }, d);
      EXPECT_EQ(r.steps, r1.steps);
      check_replicas(*m, w, "after training");
      // The first step starts from the same weights: the ranks' mean loss is the global batch's.
      at::Tensor first = at::full({1}, r.step_loss.front(), at::kDouble);
      w.all_reduce(first, Reduce::kSum);
      EXPECT_NEAR(first.item<double>() / w.size(), r1.step_loss.front(), 1e-6);
      // After 8 AdamW steps the weights agree to float rounding, which AdamW's normalisation
      // amplifies where a gradient is near zero (seen: 1e-3 at most on one weight).
      const auto want = one->parameters(), got = m->parameters();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        const double rel = (got[i] - want[i]).norm().item<double>() / want[i].norm().item<double>();
        EXPECT_LT(rel, 1e-3) << w.prefix() << " parameter " << i;
      }
    });
  }
}

TEST(Dist, DivergedReplicasAreNamed) {
  EXPECT_THROW(
      {
        try {
          run_ranks(3, [](World& w) {
            std::unique_lock<std::mutex> lock(g_init_mutex);
            torch::manual_seed(w.rank() == 2 ? 1 : 0);  // rank 2 initialises differently
            nn::Linear lin(4, 4);
            lock.unlock();
            check_replicas(*lin, w, "at start");
          });
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("rank(s) 2 hold other values than rank 0"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
}

// Issue 39 item 14: the replica check compared parameters and buffers only, so ranks whose
// quantizers differ (another width, another observer state) passed it. Every rank now names the
// first differing layer and field, at once.
TEST(Dist, Issue39Item14ReplicaCheckComparesTheQuantizationState) {
  auto build = [](const Scheme& s) {
    const std::lock_guard<std::mutex> lock(g_init_mutex);
    torch::manual_seed(12);
    torch::nn::Sequential seq(nn::Linear(16, 16), torch::nn::ReLU(), nn::Linear(16, 4));
    quantize(seq, s);
    return seq;
  };
  // Another weight width on rank 1: equal parameters and buffers, so the old hash agreed.
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  run_ranks(2, [&](World& w) {
    torch::nn::Sequential m = build(Scheme(w.rank() == 1 ? qint4 : qint8));
    try {
      check_replicas(*m, w, "after search");
    } catch (const Error& e) {
      errors[w.rank()] = e.what();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("the model differs between ranks after search: rank(s) 1 hold other values than rank 0: "
                     "rank 1 first differs at 0, scheme: rank 0 has 'weights qint8"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("rank 1 has 'weights qint4"), std::string::npos) << e;
  }
  // Calibrated on different data without merging the observers: only their state differs.
  errors.assign(2, "");
  run_ranks(2, [&](World& w) {
    torch::nn::Sequential m = build(static_scheme("minmax"));
    Calibration c(*m);
    m->forward(at::full({2, 16}, w.rank() == 1 ? 3.0 : 1.0));
    try {
      check_replicas(*m, w, "after calibration");
    } catch (const Error& e) {
      errors[w.rank()] = e.what();
    }
    broadcast_observers(*m, w);  // rank 0's observers everywhere (as QAT's epochs end)
    check_replicas(*m, w, "after broadcast_observers");
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("rank 1 first differs at 0, activation quantizer observer state: rank 0 has 'hash "),
              std::string::npos)
        << e;
  // Alike, quantized and calibrated or frozen: no error; the fields name every quantizer.
  run_ranks(2, [&](World& w) {
    torch::nn::Sequential m = build(static_scheme("minmax"));
    Calibration c(*m);
    m->forward(at::ones({2, 16}));
    c.finish();
    check_replicas(*m, w, "after calibration");
    freeze(*m);
    check_replicas(*m, w, "after freeze");
  });
  torch::nn::Sequential frozen = build(static_scheme("minmax"));
  Calibration c(*frozen);
  frozen->forward(at::ones({2, 16}));
  c.finish();
  freeze(*frozen);
  std::set<std::string> what;
  for (const ReplicaField& f : replica_fields(*frozen)) what.insert(f.what);
  for (const char* field : {"scheme", "kernel", "weight quantizer settings", "activation quantizer settings",
                            "activation quantizer observer state", "frozen weight", "frozen bias"})
    EXPECT_EQ(what.count(field), 1u) << field;
  EXPECT_GT(what.count("parameter") + what.count("buffer"), 0u);
}

TEST(Dist, AMissingRankFailsWithinTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  try {
    WorldOptions o;
    o.timeout = std::chrono::milliseconds(1500);
    World w = World::connect(0, 2, "127.0.0.1", free_port(), o);  // rank 1 never comes
    ADD_FAILURE() << "joined a group whose other rank never came";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0/2 could not join"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(Dist, ARankThatLeavesStopsTheOthersWithAnError) {
  try {
    run_ranks(
        2,
        [](World& w) {
          w.barrier();                // both joined
          if (w.rank() == 1) return;  // leaves: its process group is destroyed
          at::Tensor t = at::ones({8});
          for (int i = 0; i < 50; ++i) w.all_reduce(t, Reduce::kSum);
        },
        std::chrono::milliseconds(2000));
    ADD_FAILURE() << "all_reduce with a rank gone did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0/2: all_reduce failed (rank(s) 1 did not answer"), std::string::npos)
        << e.what();
  }
}

// Issue 39 item 21: WORLD_SIZE=1048576 took minutes to fail with "Too many open files" whatever
// the timeout; a group larger than the open-file limit allows is refused before any connection.
TEST(Dist, Issue39Item21HugeWorldSizeIsRefusedAtOnce) {
  // A finite limit of its own: under `ulimit -n unlimited` the check has nothing to compare with.
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  struct rlimit lim = saved;
  lim.rlim_cur = saved.rlim_max == RLIM_INFINITY ? 4096 : std::min<rlim_t>(saved.rlim_max, 4096);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lim), 0);
  const auto start = std::chrono::steady_clock::now();
  try {
    WorldOptions o;
    o.timeout = std::chrono::milliseconds(1500);
    World w = World::connect(0, 1 << 20, "127.0.0.1", free_port(), o);
    ADD_FAILURE() << "a group of 2^20 ranks was joined";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("WORLD_SIZE=1048576 would need about"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(ulimit -n)"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  ::setrlimit(RLIMIT_NOFILE, &saved);
}

// Issue 39 item 22: ranks started with different WORLD_SIZE got a raw Gloo assertion; the rank
// that disagrees with rank 0 now names both sizes before joining.
TEST(Dist, Issue39Item22WorldSizeMismatchIsNamed) {
  const int port = free_port();
  std::string rank1_error;
  std::thread rank1([&] {
    WorldOptions o;
    o.timeout = std::chrono::milliseconds(3000);
    try {
      World w = World::connect(1, 2, "127.0.0.1", port, o);
    } catch (const Error& e) {
      rank1_error = e.what();
    }
  });
  try {
    WorldOptions o;
    o.timeout = std::chrono::milliseconds(1500);
    World w = World::connect(0, 3, "127.0.0.1", port, o);  // rank 1 leaves, rank 2 never comes
    ADD_FAILURE() << "rank 0 joined a group whose ranks disagree on its size";
  } catch (const Error&) {
  }
  rank1.join();
  EXPECT_NE(rank1_error.find("WORLD_SIZE differs between ranks: rank 0 has WORLD_SIZE=3, rank 1 has WORLD_SIZE=2"),
            std::string::npos)
      << rank1_error;
}

TEST(Dist, SingleProcessFromAnEmptyEnvironment) {
  ::unsetenv("WORLD_SIZE");
  const World w = World::from_env();
  EXPECT_TRUE(w.single());
  EXPECT_EQ(w.rank(), 0);
  ::setenv("WORLD_SIZE", "2", 1);
  ::unsetenv("RANK");
  EXPECT_THROW(World::from_env(), Error);
  ::setenv("RANK", "0", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "99999", 1);
  try {
    World::from_env();
    ADD_FAILURE() << "a port out of range was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_PORT='99999'"), std::string::npos) << e.what();
  }
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("RANK");
  ::unsetenv("MASTER_ADDR");
  ::unsetenv("MASTER_PORT");
}

}  // namespace
}  // namespace qforge::dist
