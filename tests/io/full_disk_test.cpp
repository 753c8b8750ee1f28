// A full disk: a save that cannot write everything throws, keeps the previous file and exits
// cleanly; a dataset whose data never reached the file is refused by every reader.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "framework/core/error.h"
#include "framework/format/hdf5.h"
#include "framework/io/calibration_dump.h"
#include "framework/io/checkpoint.h"
#include "tests/io/io_fixtures.h"
#include "tests/io/io_test_util.h"
#include "tests/paths.h"

namespace qforge::io {
namespace {

using testing::TempDir;

struct ToolRun {
  int status = 0;
  std::string output;
};

// Runs io_test_tool with `args` (a shell word list), capturing its output; `exec`, so that the
// status is the tool's own (a signal included), not the shell's.
ToolRun run_tool(const std::string& args) {
  ToolRun r;
  FILE* p = ::popen(("exec " + std::string(QFORGE_IO_TEST_TOOL) + " " + args + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  r.status = ::pclose(p);
  return r;
}

std::vector<std::string> directory_listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The child overwrites `path` (holding a good file) while writes past `limit` bytes fail. It must
// report the failure naming the file (and `lost`, what failed, when not empty), exit normally
// (HDF5's shutdown included), and leave the previous file byte for byte and no temporary behind.
// With the limit lifted, the child then saves again in the same process and reads that file back.
void expect_failed_save_keeps_previous(const std::string& kind, const TempDir& dir, const std::string& path,
                                       long limit, const std::string& lost) {
  const std::vector<char> before = testing::read_bytes(path);
  TempDir other;
  const std::string again = other.file("again.h5");
  const ToolRun r = run_tool("write-past-limit " + kind + " " + path + " " + std::to_string(limit) + " " + again);
  ASSERT_TRUE(WIFEXITED(r.status)) << kind << ": the writer died (signal " << WTERMSIG(r.status) << "): " << r.output;
  EXPECT_EQ(WEXITSTATUS(r.status), 0) << kind << ": the save claimed success or the second save failed: " << r.output;
  EXPECT_NE(r.output.find("framework/io: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(".tmp-"), std::string::npos) << "the message names the file: " << r.output;
  EXPECT_NE(r.output.find("File too large"), std::string::npos) << "the message keeps the system's reason: " << r.output;
  if (!lost.empty()) {
    EXPECT_NE(r.output.find(lost), std::string::npos) << "the message names what was lost: " << r.output;
  }
  EXPECT_NE(r.output.find("saved again and read back: " + again), std::string::npos) << r.output;
  EXPECT_EQ(testing::read_bytes(path), before) << kind;
  EXPECT_EQ(directory_listing(dir.path()), std::vector<std::string>{std::filesystem::path(path).filename().string()});
}

TEST(FullDisk, CheckpointSaveThrowsKeepsThePreviousFileAndExitsCleanly) {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  save_checkpoint(path, testing::checkpoint_v1());
  // 256 KiB: each tensor is one 256 KiB chunk plus headers, so the first one already does not
  // fit; its chunk sits in the chunk cache until the dataset is closed, and that close fails.
  expect_failed_save_keeps_previous("checkpoint", dir, path, 256 << 10,
                                    "cannot write dataset '/parameters/layer0/weight' when closing it");
  const CheckpointReader r(path);
  EXPECT_TRUE(testing::same_tensor(r.read_tensor("fc1.weight"), testing::checkpoint_v1().parameters.at("fc1.weight")));
}

TEST(FullDisk, CalibrationDumpSaveThrowsKeepsThePreviousFileAndExitsCleanly) {
  TempDir dir;
  const std::string path = dir.file("calibration.h5");
  save_calibration_dump(path, testing::calibration_v1());
  // The dump's metadata alone outgrows 64 KiB: the flush fails, not a dataset's close.
  expect_failed_save_keeps_previous("calibration", dir, path, 64 << 10, "");
  EXPECT_EQ(load_calibration_dump(path).size(), testing::calibration_v1().size());
}

// A checkpoint whose /parameters/fc1/weight (chunked) or /buffers/bn/num_batches_tracked
// (contiguous) has no stored data, as a save that lost it on a full disk left it.
std::string unwritten_checkpoint(const TempDir& dir, const std::string& dataset) {
  const std::string path = dir.file("unwritten.h5");
  save_checkpoint(path, testing::checkpoint_v1());
  const ToolRun r = run_tool("unwrite-dataset " + path + " " + dataset);
  EXPECT_EQ(r.status, 0) << r.output;
  return path;
}

TEST(FullDisk, DatasetsWithoutStoredDataAreRefusedNamingFileAndDataset) {
  TempDir dir;
  const struct {
    const char *section, *module, *leaf;
  } cases[] = {{"parameters", "fc1", "weight"}, {"buffers", "bn", "num_batches_tracked"}};
  for (const auto& c : cases) {
    const std::string dataset = std::string("/") + c.section + "/" + c.module + "/" + c.leaf;
    const std::string path = unwritten_checkpoint(dir, dataset);
    const h5::File f = h5::File::open(path);
    try {
      f.root().open_group(c.section).open_group(c.module).read_tensor(c.leaf);
      FAIL() << dataset << " without stored data was read";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find("dataset '" + dataset + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("never completely written"), std::string::npos) << msg;
    }
  }
}

TEST(FullDisk, CheckpointReaderRefusesUnwrittenDataAndLeavesTheTargetsUnchanged) {
  TempDir dir;
  const std::string path = unwritten_checkpoint(dir, "/parameters/fc1/weight");
  const CheckpointReader r(path);
  try {
    r.read_tensor("fc1.weight");
    FAIL() << "fc1.weight without stored data was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("never completely written"), std::string::npos) << e.what();
  }
  std::map<std::string, at::Tensor> params = {{"fc1.bias", at::full({8}, 7.0f)}, {"fc1.weight", at::full({8, 16}, 7.0f)}};
  LoadOptions lenient;
  lenient.strict = false;
  EXPECT_THROW(r.load_into(params, {}, lenient), Error);
  EXPECT_TRUE(at::equal(params["fc1.bias"], at::full({8}, 7.0f)));
  EXPECT_TRUE(at::equal(params["fc1.weight"], at::full({8, 16}, 7.0f)));
}

}  // namespace
}  // namespace qforge::io
