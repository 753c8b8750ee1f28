// Checkpoints: round trips, partial and lazy reads, load_into that never half-applies, background
// saves of snapshots, SIGKILL in the middle of a save, truncated/corrupted/foreign files.
#include "framework/io/checkpoint.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "framework/core/error.h"
#include "framework/format/atomic_file.h"
#include "framework/io/format.h"
#include "framework/format/hdf5.h"
#include "tests/io/io_fixtures.h"
#include "tests/io/io_test_util.h"
#include "tests/paths.h"

namespace qforge::io {
namespace {

using testing::same_tensor;
using testing::TempDir;

void expect_same_quantized(const QuantizedTensor& a, const QuantizedTensor& b, const std::string& k) {
  EXPECT_EQ(a.spec.qtype, b.spec.qtype) << k;
  EXPECT_STREQ(a.spec.qtype.name, b.spec.qtype.name) << k;
  EXPECT_EQ(a.spec.granularity, b.spec.granularity) << k;
  EXPECT_EQ(a.spec.axis, b.spec.axis) << k;
  EXPECT_EQ(a.spec.group_size, b.spec.group_size) << k;
  EXPECT_EQ(a.shape, b.shape) << k;
  EXPECT_TRUE(same_tensor(a.data, b.data)) << k;
  EXPECT_TRUE(same_tensor(a.scale, b.scale)) << k;
  EXPECT_TRUE(same_tensor(a.zero_point, b.zero_point)) << k;
}

void expect_same_map(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, t] : a) {
    ASSERT_TRUE(b.count(k)) << k;
    EXPECT_TRUE(same_tensor(t, b.at(k))) << k;
  }
}

void expect_same_checkpoint(const CheckpointData& a, const CheckpointData& b) {
  expect_same_map(a.parameters, b.parameters);
  expect_same_map(a.buffers, b.buffers);
  expect_same_map(a.optimizer, b.optimizer);
  ASSERT_EQ(a.quantized.size(), b.quantized.size());
  for (const auto& [k, q] : a.quantized) {
    ASSERT_TRUE(b.quantized.count(k)) << k;
    expect_same_quantized(q, b.quantized.at(k), k);
  }
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.recipe, b.recipe);
  EXPECT_EQ(a.optimizer_kind, b.optimizer_kind);
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Checkpoint, RoundTripKeepsEveryEntryBitForBit) {
  TempDir dir;
  const CheckpointData d = testing::checkpoint_v1();
  save_checkpoint(dir.file("c.h5"), d);
  const CheckpointReader r(dir.file("c.h5"));
  EXPECT_EQ(r.format_version(), kCheckpointFormatVersion);
  EXPECT_EQ(r.qforge_version(), qforge_version());
  expect_same_checkpoint(d, r.read());
}

TEST(Checkpoint, QuantizedEntriesOfEveryQtypeAndGranularityRoundTrip) {
  TempDir dir;
  CheckpointData d;
  int i = 0;
  for (const QType& qt : {qint8, quint8, qint4, quint4, qint2}) {
    for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{5, 8}, {3, 2, 16}, {33, 64}}) {
      const std::string m = "layer" + std::to_string(i++);
      d.quantized[m + ".t.weight"] = testing::fixture_quantized(qt, Granularity::kPerTensor, 0, 0, shape);
      d.quantized[m + ".c.weight"] = testing::fixture_quantized(qt, Granularity::kPerChannel, 0, 0, shape);
      d.quantized[m + ".c1.weight"] = testing::fixture_quantized(qt, Granularity::kPerChannel, 1, 0, shape);
      d.quantized[m + ".g.weight"] = testing::fixture_quantized(qt, Granularity::kPerGroup, 0, 8, shape);
    }
  }
  save_checkpoint(dir.file("q.h5"), d);
  const CheckpointReader r(dir.file("q.h5"));
  const CheckpointData back = r.read();
  expect_same_checkpoint(d, back);
  for (const auto& [k, q] : d.quantized) {
    EXPECT_TRUE(same_tensor(r.read_tensor(k, Section::kParameters, /*dequantize=*/true), q.dequantize())) << k;
    EXPECT_TRUE(r.info(k).quantized);
    EXPECT_EQ(r.info(k).qtype, q.spec.qtype.name);
  }
}

TEST(Checkpoint, GroupsMirrorModulePaths) {
  TempDir dir;
  save_checkpoint(dir.file("c.h5"), testing::checkpoint_v1());
  const h5::File f = h5::File::open(dir.file("c.h5"));
  const h5::Group params = f.root().open_group("parameters");
  EXPECT_EQ(params.child_type("fc1"), h5::ObjectType::kGroup);
  EXPECT_EQ(params.open_group("fc1").child_type("weight"), h5::ObjectType::kDataset);
  EXPECT_EQ(params.child_type("temperature"), h5::ObjectType::kDataset);
  const h5::Group q = params.open_group("enc.layer.1.q4").open_group("weight");
  EXPECT_EQ(q.attr_string("encoding"), "quantized");
  EXPECT_EQ(q.attr_string("qtype"), "qint4");
  EXPECT_EQ(q.attr_int("bits"), 4);
  EXPECT_EQ(q.attr_string("granularity"), "per_group");
  EXPECT_EQ(q.attr_int("group_size"), 8);
  EXPECT_EQ(q.attr_ints("shape"), (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(q.attr_string("packing"), kPackingLowBitsFirst);
  EXPECT_EQ(f.root().open_group("optimizer").child_type("state.0.exp_avg"), h5::ObjectType::kDataset);
  EXPECT_EQ(f.root().attr_int("step"), 1234);
}

TEST(Checkpoint, PrefixAndParametersOnlyReadOnlyTheSubtree) {
  TempDir dir;
  CheckpointData d = testing::checkpoint_v1();
  d.parameters["enc.layer.10.weight"] = testing::pattern({2});
  d.buffers["enc.layer.1.running_mean"] = testing::pattern({3});
  save_checkpoint(dir.file("c.h5"), d);
  const CheckpointReader r(dir.file("c.h5"));
  const CheckpointData sub = r.read(ReadOptions::parameters_only("enc.layer.1"));
  EXPECT_TRUE(sub.parameters.empty());  // enc.layer.10 is not below enc.layer.1
  EXPECT_EQ(sub.quantized.size(), 2u);
  EXPECT_TRUE(sub.quantized.count("enc.layer.1.q4.weight"));
  EXPECT_TRUE(sub.buffers.empty());
  EXPECT_TRUE(sub.optimizer.empty());
  EXPECT_EQ(r.datasets_read(), 6);  // two quantized entries: data, scale, zero_point each
  ReadOptions with_buffers;
  with_buffers.prefix = "enc.layer.1";
  with_buffers.optimizer = false;
  EXPECT_EQ(r.read(with_buffers).buffers.size(), 1u);
  EXPECT_TRUE(key_matches_prefix("a.b", "a"));
  EXPECT_TRUE(key_matches_prefix("a", "a"));
  EXPECT_FALSE(key_matches_prefix("ab.c", "a"));
}

TEST(Checkpoint, ReaderIsLazy) {
  TempDir dir;
  save_checkpoint(dir.file("c.h5"), testing::checkpoint_v1());
  const CheckpointReader r(dir.file("c.h5"));
  EXPECT_EQ(r.datasets_read(), 0);  // opening reads metadata only
  const std::vector<EntryInfo> all = r.entries();
  EXPECT_EQ(all.size(), 17u);
  EXPECT_EQ(r.datasets_read(), 0);
  EXPECT_EQ(r.info("fc1.weight").shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(r.info("fc1.weight").dataset_path, "/parameters/fc1/weight");
  EXPECT_EQ(r.info("mask", Section::kBuffers).dtype, at::kBool);
  EXPECT_TRUE(same_tensor(r.read_tensor("fc1.bias"), testing::pattern({8}, 5, 1, 17)));
  EXPECT_EQ(r.datasets_read(), 1);
}

struct Model {
  std::map<std::string, at::Tensor> params, buffers;
  Model() {
    params["fc1.weight"] = at::zeros({8, 16}).requires_grad_();
    params["fc1.bias"] = at::zeros({8}).requires_grad_();
    params["temperature"] = at::zeros({});
    params["emb.weight"] = at::zeros({4, 6});
    params["proj.weight"] = at::zeros({3, 4});
    buffers["bn.running_mean"] = at::zeros({8});
    buffers["bn.running_var"] = at::zeros({8});
    buffers["bn.num_batches_tracked"] = at::zeros({}, at::kLong);
    buffers["mask"] = at::zeros({5}, at::kBool);
    buffers["codes"] = at::zeros({2, 3}, at::kChar);
  }
  std::map<std::string, at::Tensor> copy() const {
    std::map<std::string, at::Tensor> c;
    for (const auto& [k, t] : params) c["p." + k] = t.detach().clone();
    for (const auto& [k, t] : buffers) c["b." + k] = t.clone();
    return c;
  }
  bool equals(const std::map<std::string, at::Tensor>& c) const {
    for (const auto& [k, t] : params) if (!same_tensor(t.detach(), c.at("p." + k))) return false;
    for (const auto& [k, t] : buffers) if (!same_tensor(t, c.at("b." + k))) return false;
    return true;
  }
};

TEST(Checkpoint, LoadIntoFillsAFreshModel) {
  TempDir dir;
  const CheckpointData d = testing::checkpoint_v1();
  save_checkpoint(dir.file("c.h5"), d);
  const CheckpointReader r(dir.file("c.h5"));
  Model m;
  LoadOptions opts;
  opts.strict = false;  // the quantized entries have no float counterpart in this model
  r.load_into(m.params, m.buffers, opts);
  EXPECT_TRUE(same_tensor(m.params["fc1.weight"].detach(), d.parameters.at("fc1.weight")));
  EXPECT_TRUE(m.params["fc1.weight"].requires_grad());
  EXPECT_TRUE(at::equal(m.params["emb.weight"], d.parameters.at("emb.weight").to(at::kFloat)));
  EXPECT_TRUE(same_tensor(m.buffers["mask"], d.buffers.at("mask")));
  EXPECT_TRUE(same_tensor(m.buffers["bn.num_batches_tracked"], d.buffers.at("bn.num_batches_tracked")));
  // Quantized entries fill float targets with their dequantized values when asked.
  std::map<std::string, at::Tensor> qtargets = {{"enc.layer.1.q4.weight", at::zeros({4, 16})}};
  LoadOptions deq = opts;
  deq.dequantize = true;
  deq.buffers = false;
  r.load_into(qtargets, {}, deq);
  EXPECT_TRUE(same_tensor(qtargets["enc.layer.1.q4.weight"], d.quantized.at("enc.layer.1.q4.weight").dequantize()));
}

TEST(Checkpoint, FailedLoadNamesTheDatasetAndLeavesTheModelUnchanged) {
  TempDir dir;
  save_checkpoint(dir.file("c.h5"), testing::checkpoint_v1());
  const CheckpointReader r(dir.file("c.h5"));
  LoadOptions lenient;
  lenient.strict = false;
  auto check = [&](Model& m, const LoadOptions& o, const std::string& needle) {
    // Fill the targets with something recognisable first.
    for (auto& [k, t] : m.params) t.detach().fill_(7);
    const auto before = m.copy();
    const std::string msg = error_of([&] { r.load_into(m.params, m.buffers, o); });
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_TRUE(m.equals(before)) << needle;
  };
  {  // shape mismatch (on the last target, after others were read)
    Model m;
    m.buffers["codes"] = at::zeros({3, 2}, at::kChar);
    check(m, lenient, "dataset '/buffers/codes' has shape [2, 3], model expects [3, 2]");
  }
  {  // missing key
    Model m;
    m.params["fc2.weight"] = at::zeros({2});
    check(m, lenient, "missing dataset '/parameters/fc2/weight'");
  }
  {  // dtype mismatch
    Model m;
    m.buffers["bn.num_batches_tracked"] = at::zeros({}, at::kInt);
    check(m, lenient, "dataset '/buffers/bn/num_batches_tracked' has dtype Long, model expects Int");
  }
  {  // quantized entry into a float target without dequantize
    Model m;
    m.params["enc.layer.1.q4.weight"] = at::zeros({4, 16});
    check(m, lenient, "is quantized (qint4)");
  }
  {  // strict: the checkpoint has entries the model lacks
    Model m;
    check(m, LoadOptions{}, "has no counterpart in the model (strict load)");
  }
}

TEST(Checkpoint, PartialLoadIntoTouchesOnlyThePrefix) {
  TempDir dir;
  const CheckpointData d = testing::checkpoint_v1();
  save_checkpoint(dir.file("c.h5"), d);
  const CheckpointReader r(dir.file("c.h5"));
  Model m;
  LoadOptions o;
  o.prefix = "fc1";
  o.buffers = false;
  r.load_into(m.params, m.buffers, o);
  EXPECT_TRUE(same_tensor(m.params["fc1.bias"].detach(), d.parameters.at("fc1.bias")));
  EXPECT_EQ(m.params["proj.weight"].abs().sum().item<double>(), 0.0);
  EXPECT_EQ(m.buffers["bn.running_mean"].abs().sum().item<double>(), 0.0);
  EXPECT_EQ(r.datasets_read(), 2);
}

TEST(Checkpoint, BadInputIsRejectedBeforeTheOldFileIsTouched) {
  TempDir dir;
  save_checkpoint(dir.file("c.h5"), testing::checkpoint_v1());
  const std::vector<char> before = testing::read_bytes(dir.file("c.h5"));
  CheckpointData bad = testing::checkpoint_v1();
  bad.parameters["enc.layer.1.q4.weight"] = at::ones({1});
  EXPECT_NE(error_of([&] { save_checkpoint(dir.file("c.h5"), bad); }).find("both a float and a quantized"),
            std::string::npos);
  bad = testing::checkpoint_v1();
  bad.parameters["a/b"] = at::ones({1});
  EXPECT_THROW(save_checkpoint(dir.file("c.h5"), bad), Error);
  bad = testing::checkpoint_v1();
  bad.parameters["fc1"] = at::ones({1});  // clashes with module group fc1
  EXPECT_NE(error_of([&] { save_checkpoint(dir.file("c.h5"), bad); }).find("clashes"), std::string::npos);
  EXPECT_EQ(testing::read_bytes(dir.file("c.h5")), before);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);  // no temp left
}

TEST(Checkpoint, AsyncSaveWritesTheSnapshotWhileTrainingMutatesTensors) {
  TempDir dir;
  CheckpointData d;
  at::Tensor w = at::full({256, 1024}, 1.0f);
  at::Tensor adam = at::full({256, 1024}, 10.0f);
  d.parameters["layer.weight"] = w;
  d.optimizer["state.0.exp_avg"] = adam;
  std::vector<SaveHandle> handles;
  for (int step = 1; step <= 4; ++step) {
    d.step = step;
    handles.push_back(save_checkpoint_async(dir.file("s" + std::to_string(step) + ".h5"), d));
    // Training continues: tensors change right after save_checkpoint_async returns.
    for (int i = 0; i < 3; ++i) {
      w.add_(1.0f);
      adam.mul_(2.0f);
    }
  }
  for (SaveHandle& h : handles) h.wait();
  for (int step = 1; step <= 4; ++step) {
    const CheckpointReader r(dir.file("s" + std::to_string(step) + ".h5"));
    EXPECT_EQ(r.step(), step);
    const float wv = 1.0f + 3.0f * (step - 1);
    const float av = 10.0f * std::pow(8.0f, step - 1);
    EXPECT_TRUE(at::equal(r.read_tensor("layer.weight"), at::full({256, 1024}, wv))) << step;
    EXPECT_TRUE(at::equal(r.read_tensor("state.0.exp_avg", Section::kOptimizer), at::full({256, 1024}, av)))
        << step;
  }
}

TEST(Checkpoint, AsyncSaveErrorsSurfaceOnWait) {
  TempDir dir;
  CheckpointData d;
  d.parameters["w"] = at::ones({4});
  SaveHandle h = save_checkpoint_async(dir.file("no_such_dir/c.h5"), d);
  const std::string msg = error_of([&] { h.wait(); });
  EXPECT_NE(msg.find("no_such_dir"), std::string::npos) << msg;
  EXPECT_TRUE(h.done());
}

// The child (io_test_tool save-loop) saves checkpoints whose every tensor holds the step number;
// it is killed with SIGKILL at varying points. The file must then always load, consistently.
TEST(Checkpoint, SigkillDuringSaveLeavesThePreviousCheckpointLoadable) {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  constexpr int64_t kElems = 4 << 20;  // 16 MiB of float32: a save takes long enough to interrupt
  int mid_save_kills = 0;
  const int delays_us[] = {0, 2000, 5000, 10000, 20000, 40000};
  for (int trial = 0; trial < 6; ++trial) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      const std::string elems = std::to_string(kElems);
      ::execl(QFORGE_IO_TEST_TOOL, QFORGE_IO_TEST_TOOL, "save-loop", path.c_str(), elems.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[1]);
    // Let the child finish one save (trial 0: kill during the very first one), then start another.
    const int wanted_starts = trial == 0 ? 1 : 2;
    int starts = 0;
    char c;
    while (starts < wanted_starts && ::read(fds[0], &c, 1) == 1) {
      if (c == 'S') ++starts;
    }
    ASSERT_EQ(starts, wanted_starts) << "child exited early";
    std::this_thread::sleep_for(std::chrono::microseconds(delays_us[trial]));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(fds[0]);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    bool temp_left = false;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
      if (entry.path().filename().string().rfind(".ckpt.h5.tmp-", 0) == 0) {
        temp_left = true;
        std::filesystem::remove(entry.path());
      }
    }
    mid_save_kills += temp_left;
    if (!std::filesystem::exists(path)) {
      // Only possible when killed during the very first save: nothing was ever committed.
      EXPECT_EQ(trial, 0);
      continue;
    }
    const CheckpointReader r(path);
    const int64_t step = r.step();
    ASSERT_GE(step, 1);
    EXPECT_TRUE(at::equal(r.read_tensor("big.weight"), at::full({kElems}, static_cast<float>(step))));
    EXPECT_TRUE(at::equal(r.read_tensor("small.bias"), at::full({7}, static_cast<float>(step))));
    EXPECT_EQ(r.read_tensor("counter", Section::kBuffers).item<int64_t>(), step);
  }
  // The point of the test: at least one kill landed in the middle of a save.
  EXPECT_GE(mid_save_kills, 1);
}

TEST(Checkpoint, TruncatedFilesThrowNamingTheFile) {
  TempDir dir;
  save_checkpoint(dir.file("c.h5"), testing::checkpoint_v1());
  const std::vector<char> bytes = testing::read_bytes(dir.file("c.h5"));
  for (size_t keep : {size_t{0}, size_t{7}, size_t{100}, bytes.size() / 3, bytes.size() / 2, bytes.size() - 1}) {
    std::vector<char> cut(bytes.begin(), bytes.begin() + keep);
    testing::write_bytes(dir.file("t.h5"), cut);
    const std::string msg = error_of([&] {
      const CheckpointReader r(dir.file("t.h5"));
      r.read();
    });
    EXPECT_NE(msg.find(dir.file("t.h5")), std::string::npos) << keep << ": " << msg;
  }
}

TEST(Checkpoint, CorruptedDataIsDetectedAndTheModelIsUnchanged) {
  TempDir dir;
  CheckpointData d = testing::checkpoint_v1();
  const float marker = 12345.678f;
  d.parameters["fc1.weight"].view(-1)[77] = marker;
  save_checkpoint(dir.file("c.h5"), d);
  std::vector<char> bytes = testing::read_bytes(dir.file("c.h5"));
  char pattern[4];
  std::memcpy(pattern, &marker, 4);
  auto it = std::search(bytes.begin(), bytes.end(), pattern, pattern + 4);
  ASSERT_NE(it, bytes.end());
  *(it + 1) ^= 0x10;  // one flipped bit in the raw data
  testing::write_bytes(dir.file("bad.h5"), bytes);
  const CheckpointReader r(dir.file("bad.h5"));  // metadata is intact
  Model m;
  const auto before = m.copy();
  LoadOptions o;
  o.strict = false;
  const std::string msg = error_of([&] { r.load_into(m.params, m.buffers, o); });
  EXPECT_NE(msg.find("dataset '/parameters/fc1/weight'"), std::string::npos) << msg;
  EXPECT_TRUE(m.equals(before));
}

TEST(Checkpoint, RandomByteCorruptionNeverCrashes) {
  TempDir dir;
  save_checkpoint(dir.file("c.h5"), testing::checkpoint_v1());
  const std::vector<char> bytes = testing::read_bytes(dir.file("c.h5"));
  int errors = 0, loads = 0;
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  // QFORGE_IO_FUZZ_TRIALS=N runs a longer campaign by hand.
  const char* env = std::getenv("QFORGE_IO_FUZZ_TRIALS");
  const int trials = env ? std::atoi(env) : 150;
  for (int trial = 0; trial < trials; ++trial) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    std::vector<char> bad = bytes;
    const size_t pos = (rng >> 20) % bad.size();
    bad[pos] = static_cast<char>(bad[pos] ^ (1 + (rng >> 8) % 255));
    testing::write_bytes(dir.file("bad.h5"), bad);
    try {
      const CheckpointReader r(dir.file("bad.h5"));
      r.read();
      ++loads;  // e.g. a flipped bit in padding or an unused field
    } catch (const Error& e) {
      ++errors;
      EXPECT_NE(std::string(e.what()).find("bad.h5"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(errors, 0);
  std::printf("[ info ] %d corruptions: %d detected, %d harmless\n", trials, errors, loads);
}

TEST(Checkpoint, ForeignAndNewerFilesGiveClearErrors) {
  TempDir dir;
  save_calibration_dump(dir.file("calib.h5"), testing::calibration_v1());
  EXPECT_NE(error_of([&] { CheckpointReader r(dir.file("calib.h5")); })
                .find("is a 'qforge.calibration' file, expected 'qforge.checkpoint'"),
            std::string::npos);
  {
    h5::File f = h5::File::create(dir.file("newer.h5"));
    write_format(f.root(), kCheckpointFormat, 99);
    f.close();
  }
  EXPECT_NE(error_of([&] { CheckpointReader r(dir.file("newer.h5")); }).find("format_version 99 was written by a newer qforge"),
            std::string::npos);
  testing::write_bytes(dir.file("junk.h5"), std::vector<char>(1000, 'x'));
  EXPECT_NE(error_of([&] { CheckpointReader r(dir.file("junk.h5")); }).find("not an HDF5 file"),
            std::string::npos);
}

TEST(Checkpoint, AWriteThatFailsLateGoesToTheFallbackPathAndSaysWhy) {
  TempDir dir;
  const std::string target = dir.file("gone/model.h5");  // its directory does not exist
  std::string reason;
  const std::string written = write_with_fallback(
      target, [](const std::string& p) { save_checkpoint(p, testing::checkpoint_v1()); }, &reason);
  EXPECT_NE(written, target);
  EXPECT_EQ(written, fallback_path(target));
  EXPECT_NE(written.find("qforge-fallback-"), std::string::npos) << written;
  EXPECT_NE(reason.find(dir.file("gone/")), std::string::npos) << reason;
  // The fallback holds the whole checkpoint.
  const CheckpointData back = CheckpointReader(written).read();
  EXPECT_TRUE(at::equal(back.parameters.at("fc1.weight"), testing::checkpoint_v1().parameters.at("fc1.weight")));
  std::filesystem::remove(written);
  // A write that succeeds stays where it was asked to go; one that fails twice names both.
  EXPECT_EQ(write_with_fallback(dir.file("ok.h5"), [](const std::string& p) { save_checkpoint(p, testing::checkpoint_v1()); },
                                &reason),
            dir.file("ok.h5"));
  try {
    write_with_fallback(target, [](const std::string& p) -> void { throw Error("cannot write " + p); }, &reason);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the fallback " + fallback_path(target) + " failed too"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace qforge::io
