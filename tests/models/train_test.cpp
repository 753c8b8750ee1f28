// framework/train: schedule, batch sources, and short training runs whose loss must fall.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include "framework/api/progress.h"
#include "framework/data/fashion_mnist.h"
#include "framework/data/text_corpus.h"
#include "framework/models/gpt2.h"
#include "framework/models/mlp.h"
#include "framework/train/lr_schedule.h"
#include "framework/train/trainer.h"

namespace qforge::train {
namespace {

double mean(const std::vector<double>& v, size_t from, size_t n) {
  return std::accumulate(v.begin() + from, v.begin() + from + n, 0.0) / n;
}

TEST(CosineSchedule, WarmsUpLinearlyThenDecaysToTheFloor) {
  CosineSchedule s{1.0, 10, 110, 0.1};
  EXPECT_DOUBLE_EQ(s.lr(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(9), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(10), 1.0);
  EXPECT_NEAR(s.lr(60), 0.55, 1e-12);
  EXPECT_NEAR(s.lr(110), 0.1, 1e-12);
  EXPECT_NEAR(s.lr(500), 0.1, 1e-12);
}

TEST(LmBatches, TargetsAreInputsShiftedByOne) {
  LmBatches b(at::arange(100, at::kLong), 8, 8);
  EXPECT_EQ(b.size(), (100 - 9) / 8 + 1);
  const Batch x = b.get(at::tensor({0, 3}, at::kLong));
  EXPECT_TRUE(at::equal(x.input[1], at::arange(24, 32, at::kLong)));
  EXPECT_TRUE(at::equal(x.target[1], at::arange(25, 33, at::kLong)));
  const Batch last = b.get(at::tensor({b.size() - 1}, at::kLong));
  EXPECT_LE(last.target.max().item<int64_t>(), 99);
}

TEST(TensorBatches, TrimsColumnsThatArePaddingInTheWholeBatch) {
  const at::Tensor ids = at::tensor({1, 2, 0, 0, 1, 0, 0, 0}, at::kLong).view({2, 4});
  TensorBatches b(ids, at::tensor({0, 1}, at::kLong), ids.ne(0).to(at::kLong));
  EXPECT_EQ(b.get(at::tensor({0, 1}, at::kLong)).input.size(1), 2);
  EXPECT_EQ(b.get(at::tensor({1}, at::kLong)).input.size(1), 1);
}

TEST(Train, MlpOnFashionMnistSubsetLossFallsAndAccuracyRises) {
  if (!std::filesystem::is_directory(data::kFashionMnistDir))
    GTEST_SKIP() << "Fashion-MNIST missing (apt-get install " << data::kFashionMnistPackage << ")";
  const data::FashionMnist d = data::load_fashion_mnist(1000, 3);
  const int64_t n = 4096;
  TensorBatches tr(d.train.images.narrow(0, 0, n), d.train.labels.narrow(0, 0, n));
  TensorBatches val(d.validation.images, d.validation.labels);
  at::manual_seed(3);
  models::Mlp m(models::MlpOptions{784, {64}, 10});
  auto fwd = [&](const Batch& b) { return m->forward(b.input); };
  TrainOptions o;
  o.epochs = 2, o.batch_size = 64, o.lr = 2e-3, o.progress = false, o.seed = 3;
  const TrainResult r = fit(*m, tr, fwd, o, &val);
  ASSERT_EQ(r.step_loss.size(), 2u * 64u);
  EXPECT_LT(mean(r.step_loss, r.step_loss.size() - 10, 10), 0.5 * mean(r.step_loss, 0, 10));
  ASSERT_EQ(r.validation.size(), 2u);
  EXPECT_GT(r.validation.back().accuracy, 0.7);
  EXPECT_EQ(r.validation.back().confusion.sum().item<int64_t>(), 1000);
  EXPECT_TRUE(m->is_training()) << "fit leaves the model in training mode";
  // Same seed, same run.
  at::manual_seed(3);
  models::Mlp m2(models::MlpOptions{784, {64}, 10});
  auto fwd2 = [&](const Batch& b) { return m2->forward(b.input); };
  o.max_steps = 5;
  const TrainResult r2 = fit(*m2, tr, fwd2, o);
  EXPECT_TRUE(r2.stopped_early);
  EXPECT_EQ(r2.steps, 5);
}

TEST(Train, TinyGpt2OnFortunesLossFallsAndPerplexityIsReported) {
  if (!std::filesystem::is_directory(data::kFortunesDir)) GTEST_SKIP() << "fortunes missing (apt-get install fortunes)";
  const data::TextCorpus c = data::load_fortunes();
  models::Gpt2Config cfg;
  cfg.vocab_size = 256, cfg.n_positions = 32, cfg.n_embd = 32, cfg.n_layer = 1, cfg.n_head = 2;
  at::manual_seed(0);
  models::Gpt2LMHeadModel m(cfg);
  LmBatches tr(c.train.narrow(0, 0, 200000), 32, 32);
  LmBatches val(c.validation.narrow(0, 0, 8192), 32, 32);
  auto fwd = [&](const Batch& b) { return m->forward(b.input); };
  TrainOptions o;
  o.epochs = 1, o.batch_size = 32, o.lr = 3e-3, o.max_steps = 60, o.progress = false;
  const TrainResult r = fit(*m, tr, fwd, o);
  EXPECT_LT(mean(r.step_loss, 50, 10), mean(r.step_loss, 0, 10) - 1.0);
  const Metrics v = evaluate(*m, val, fwd, 64, "val", false);
  EXPECT_NEAR(v.perplexity, std::exp(v.loss), 1e-9);
  EXPECT_LT(v.perplexity, 40.0);
  EXPECT_EQ(v.tokens, val.size() * 32);
  EXPECT_FALSE(v.confusion.defined()) << "no confusion matrix for language models";
}

// Issue 39 item 8: the epoch bar counts to the steps that run (max_steps cuts the epoch), and its
// lines carry the time left.
TEST(Train, Issue39Item8BarCountsToMaxStepsAndShowsTheTimeLeft) {
  at::manual_seed(0);
  const at::Tensor x = at::randn({400, 8});
  TensorBatches tr(x, x.sum(1).gt(0).to(at::kLong));
  models::Mlp m(models::MlpOptions{8, {8}, 2});
  auto fwd = [&](const Batch& b) { return m->forward(b.input); };
  TrainOptions o;
  o.epochs = 3, o.batch_size = 10, o.lr = 1e-3, o.max_steps = 50, o.progress = true, o.label = "bar";
  ::testing::internal::CaptureStderr();
  const TrainResult r = fit(*m, tr, fwd, o);
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.steps, 50);
  EXPECT_TRUE(r.stopped_early);
  // 40 steps per epoch: epoch 1 runs all 40, epoch 2 the 10 left, epoch 3 none (and has no bar).
  EXPECT_NE(out.find("bar epoch 1: 100% (40/40)"), std::string::npos) << out;
  EXPECT_NE(out.find("bar epoch 2: 100% (10/10)"), std::string::npos) << out;
  EXPECT_EQ(out.find("(10/40)"), std::string::npos) << out;
  EXPECT_EQ(out.find("bar epoch 3"), std::string::npos) << out;
  EXPECT_NE(out.find("bar epoch 1:  50% (20/40)"), std::string::npos) << out;
  EXPECT_NE(out.find("s eta "), std::string::npos) << out;  // before 100%: the time left
}

TEST(Progress, Issue39Item8EtaIsTheAverageStepTimeTimesTheStepsLeft) {
  EXPECT_EQ(format_eta(2.0, 0, 10), "");    // no step yet: unknown
  EXPECT_EQ(format_eta(2.0, 10, 10), "");   // done
  EXPECT_EQ(format_eta(1.0, 4, 10), "eta 1.5s");
  EXPECT_EQ(format_eta(10.0, 5, 10), "eta 10s");
  EXPECT_EQ(format_eta(30.0, 1, 10), "eta 4m30s");
  EXPECT_EQ(format_eta(3600.0, 1, 4), "eta 3h00m");
}

}  // namespace
}  // namespace qforge::train
