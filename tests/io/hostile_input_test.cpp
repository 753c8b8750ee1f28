// Hostile inputs of issue 39: non-regular files as inputs (item 21), the fallback directory
// (item 20) and crafted HDF5 files (item 24).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>

#include "framework/core/error.h"
#include "framework/format/atomic_file.h"
#include "framework/format/hdf5.h"
#include "framework/format/input_file.h"
#include "framework/format/safetensors.h"
#include "framework/io/calibration_dump.h"
#include "framework/io/checkpoint.h"
#include "tests/error_of.h"
#include "tests/io/io_test_util.h"
#include "tests/paths.h"

namespace qforge::io {
namespace {

namespace fs = std::filesystem;
using qforge::testing::error_of;
using testing::TempDir;

// Item 21: a FIFO given as a checkpoint, dump or safetensors file blocked the reader forever
// (nothing ever writes into it); each reader now refuses it at once, naming the path.
TEST(HostileInput, Issue39Item21FifoInputsAreRefusedNotWaitedOn) {
  TempDir dir;
  const std::string fifo = dir.file("model.h5");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& e : {error_of([&] { CheckpointReader r(fifo); }),
                               error_of([&] { (void)load_calibration_dump(fifo); }),
                               error_of([&] { (void)h5::File::open(fifo); }),
                               error_of([&] { (void)read_safetensors(fifo); })}) {
    EXPECT_NE(e.find(fifo + " is a FIFO, not a regular file"), std::string::npos) << e;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(error_of([&] { require_regular_file(dir.path(), "model.checkpoint"); })
                .find("model.checkpoint " + dir.path() + " is a directory, not a regular file"),
            std::string::npos);
  // A missing file is each reader's own message; a regular file passes.
  EXPECT_NO_THROW(require_regular_file(dir.file("absent.h5"), "x"));
  testing::write_bytes(dir.file("plain"), {'x'});
  EXPECT_NO_THROW(require_regular_file(dir.file("plain"), "x"));
}

// Item 20: the fallback directory had the predictable name qforge-fallback-<pid> and was used
// even when another user had made it (a planted symbolic link received the reports).
TEST(HostileInput, Issue39Item20FallbackDirectoryIsPrivateAndUnpredictable) {
  std::error_code ec;
  const fs::path planted = fs::temp_directory_path() / ("qforge-fallback-" + std::to_string(::getpid()));
  TempDir elsewhere;
  const bool made_link = !fs::exists(planted) && (fs::create_directory_symlink(elsewhere.path(), planted, ec), !ec);
  const std::string path = fallback_path("/no/such/dir/report.json");
  const fs::path dir = fs::path(path).parent_path();
  EXPECT_EQ(fs::path(path).filename(), "report.json");
  EXPECT_NE(dir, planted);
  EXPECT_EQ(dir.filename().string().rfind("qforge-fallback-", 0), 0u) << dir;
  struct stat st {};
  ASSERT_EQ(::lstat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_TRUE(fs::is_empty(elsewhere.path()));
  if (made_link) fs::remove(planted, ec);
  // Opened to others (or replaced by someone else's), it is refused, not written into.
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  const std::string e = error_of([] { (void)fallback_path("report.json"); });
  EXPECT_NE(e.find("fallback directory " + dir.string() + " has mode 0777"), std::string::npos) << e;
  ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);
  EXPECT_EQ(fallback_path("report.md"), (dir / "report.md").string());
  // Removed (a temporary-file cleaner), it is made again, privately.
  fs::remove_all(dir);
  const fs::path again = fs::path(fallback_path("report.md")).parent_path();
  ASSERT_EQ(::lstat(again.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  fs::remove_all(again, ec);
}

// Item 24: calibration_dump_fuzz found a heap-buffer-overflow inside libhdf5 1.10.8 (H5Aexists
// from io::check_format) on a mutation of the earliest-format seed. Files in HDF5's earliest
// formats (no metadata checksums), which qforge never writes, are refused before the HDF5 library
// sees them. crashes/calibration_dump/crash-2b27f2… is such a mutation (7 bytes of the seed) on
// which ASan reports that overflow in H5Aexists (tests/fuzz/hdf5_attr_mutate.c found it);
// crashes/checkpoint/crash-401351… made libhdf5 ask malloc for 16 EiB.
TEST(HostileInput, Issue39Item24EarliestFormatFilesNeverReachTheHdf5Library) {
  const std::string root = QFORGE_SOURCE_DIR;
  for (const std::string& file : {root + "/tests/fuzz/corpus/calibration_dump/earliest_format.h5",
                                  root + "/tests/fuzz/corpus/checkpoint/earliest_format.h5",
                                  root + "/tests/fuzz/crashes/calibration_dump/crash-2b27f2b25f45893e5965f5e6b25fc1d5cd6a2f4f",
                                  root + "/tests/fuzz/crashes/checkpoint/crash-4013515d199e291565b545c7bbc8c62e24ea33be"}) {
    for (const std::string& e : {error_of([&] { (void)load_calibration_dump(file); }),
                                 error_of([&] { CheckpointReader r(file); })}) {
      EXPECT_NE(e.find(file + ": HDF5 superblock version 0 (HDF5's earliest file format"), std::string::npos) << e;
      EXPECT_NE(e.find("refused before the HDF5 library parses it"), std::string::npos) << e;
      EXPECT_NE(e.find("re-save it with h5py.File(path, 'w', libver=('v110', 'v110'))"), std::string::npos) << e;
    }
  }
  // qforge's own files pass the same check (their superblock checksums are recomputed).
  for (const char* f : {"calibration_v1.h5", "checkpoint_v1.h5", "model_v1.h5"})
    EXPECT_NO_THROW((void)h5::File::open(root + "/tests/fixtures/" + f)) << f;
}

TEST(HostileInput, Issue39Item24ACorruptedSuperblockIsRefusedByItsChecksum) {
  TempDir dir;
  std::vector<char> bytes = testing::read_bytes(std::string(QFORGE_SOURCE_DIR) + "/tests/fixtures/calibration_v1.h5");
  bytes[40] ^= 0x01;  // the root group's address
  testing::write_bytes(dir.file("bad.h5"), bytes);
  std::string e = error_of([&] { (void)load_calibration_dump(dir.file("bad.h5")); });
  EXPECT_NE(e.find("bad.h5: HDF5 superblock checksum mismatch"), std::string::npos) << e;
  bytes[40] ^= 0x01;
  bytes[9] = 4;  // 4-byte offsets, with the checksum left as it was
  testing::write_bytes(dir.file("small.h5"), bytes);
  e = error_of([&] { (void)h5::File::open(dir.file("small.h5")); });
  EXPECT_NE(e.find("HDF5 offsets of 4 and lengths of 8 bytes, qforge writes 8"), std::string::npos) << e;
  // A user block (HDF5 finds the superblock at 512, 1024, ...) is named as such.
  bytes[9] = 8;
  std::vector<char> with_block(1024 + bytes.size(), ' ');
  std::copy(bytes.begin(), bytes.end(), with_block.begin() + 1024);
  testing::write_bytes(dir.file("ub.h5"), with_block);
  e = error_of([&] { (void)h5::File::open(dir.file("ub.h5")); });
  EXPECT_NE(e.find("ub.h5: an HDF5 file with a user block of 1024 bytes before its superblock"), std::string::npos) << e;
  testing::write_bytes(dir.file("text.h5"), std::vector<char>(3000, 'x'));
  e = error_of([&] { (void)h5::File::open(dir.file("text.h5")); });
  EXPECT_NE(e.find("text.h5: not an HDF5 file (no HDF5 signature at the start)"), std::string::npos) << e;
}

// What no layout check can refuse (a crafted file with valid checksums) meets run_isolated: a
// crash while reading ends a child process and becomes an error naming the file.
TEST(HostileInput, Issue39Item24ACrashWhileReadingIsAnErrorNotTheEndOfTheProcess) {
  const std::string e = error_of([] {
    h5::run_isolated("crafted.h5", []() -> int {
      std::raise(SIGSEGV);
      return 0;
    });
  });
  EXPECT_NE(e.find("reading crafted.h5 crashed the HDF5 library (the reading process was killed by SIGSEGV (signal 11))"),
            std::string::npos) << e;
  EXPECT_EQ(h5::run_isolated("x", [] { return 7; }), 7);
  EXPECT_EQ(error_of([] { h5::run_isolated("x", []() -> int { throw Error("x.h5: bad attribute"); }); }),
            "x.h5: bad attribute");
  // A child of a child is not forked again (qdump runs its whole command in one).
  const pid_t parent = ::getpid();
  EXPECT_EQ(h5::run_isolated("x", [&] {
              const pid_t child = ::getpid();
              return child != parent && h5::run_isolated("y", [&] { return ::getpid() == child ? 1 : 0; }) ? 1 : 0;
            }),
            1);
  // HDF5 still works in the child and afterwards in this process.
  const std::string fixture = std::string(QFORGE_SOURCE_DIR) + "/tests/fixtures/calibration_v1.h5";
  EXPECT_EQ(h5::run_isolated(fixture, [&] { return static_cast<int>(load_calibration_dump(fixture).size()); }),
            static_cast<int>(load_calibration_dump(fixture).size()));
}

// Only a crash signal calls the file corrupted or crafted: a child stopped by the user (or a closed
// pipe) ends this process by the same signal, one killed by SIGKILL is named so, and a child that
// hangs is killed after the timeout.
TEST(HostileInput, Issue39Item24OnlyACrashOfTheReaderCallsTheFileCrafted) {
  for (const int sig : {SIGTERM, SIGHUP, SIGINT})
    EXPECT_EXIT(h5::run_isolated("x.h5", [sig]() -> int {
                  std::raise(sig);
                  return 0;
                }),
                ::testing::KilledBySignal(sig), "")
        << sig;
  const std::string killed = error_of([] {
    h5::run_isolated("big.h5", []() -> int {
      std::raise(SIGKILL);
      return 0;
    });
  });
  EXPECT_NE(killed.find("reading big.h5: the reading process was killed (SIGKILL: out of memory?)"), std::string::npos)
      << killed;
  EXPECT_EQ(killed.find("crafted"), std::string::npos) << killed;
  const auto start = std::chrono::steady_clock::now();
  const std::string slow = error_of([] {
    h5::run_isolated(
        "slow.h5",
        []() -> int {
          ::pause();
          return 0;
        },
        std::chrono::milliseconds(300));
  });
  EXPECT_NE(slow.find("reading slow.h5 took longer than 0.3 s; the reading process was killed"), std::string::npos)
      << slow;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  const std::string silent = error_of([] { h5::run_isolated("x.h5", []() -> int { ::_exit(3); }); });
  EXPECT_NE(silent.find("reading x.h5: the reading process stopped with exit status 3 without a result"),
            std::string::npos) << silent;
  EXPECT_EQ(h5::run_isolated("x", [] { return -2147483647 - 1; }), -2147483647 - 1);
}

// Every untrusted reader survives a crash of the library while it reads (QFORGE_TEST_CRASH_READING
// makes opening that one file crash, as a libhdf5 fault would): removing the child process from
// any of them ends this test binary instead.
TEST(HostileInput, Issue39Item24EveryDumpReaderSurvivesACrashOfTheLibrary) {
  TempDir dir;
  const std::string dump = dir.file("dump.h5");
  fs::copy_file(std::string(QFORGE_SOURCE_DIR) + "/tests/fixtures/calibration_v1.h5", dump);
  ASSERT_EQ(::setenv("QFORGE_TEST_CRASH_READING", dump.c_str(), 1), 0);
  for (const std::string& e : {error_of([&] { (void)load_calibration_dump(dump); }),
                               error_of([&] { (void)load_search_sensitivities(dump); }),
                               error_of([&] { (void)load_layer_errors(dump); })})
    EXPECT_NE(e.find("reading " + dump + " crashed the HDF5 library (the reading process was killed by SIGSEGV"),
              std::string::npos) << e;
  ::unsetenv("QFORGE_TEST_CRASH_READING");
  EXPECT_FALSE(load_calibration_dump(dump).empty());
}

// The dump is read in the child, then again here: a file that changed in between is refused (the
// child vouched for other bytes). Inside a reading child (qdump's) it is read once.
TEST(HostileInput, Issue39Item24ADumpChangedBetweenItsTwoReadsIsRefused) {
  TempDir dir;
  const std::string dump = dir.file("dump.h5");
  fs::copy_file(std::string(QFORGE_SOURCE_DIR) + "/tests/fixtures/calibration_v1.h5", dump);
  const pid_t parent = ::getpid();
  const std::string e = error_of([&] {
    (void)h5::read_untrusted(dump, [&] {
      if (::getpid() != parent) std::ofstream(dump, std::ios::app) << 'x';  // a writer, while the child reads
      return load_calibration_dump(dump).size();
    });
  });
  EXPECT_NE(e.find(dump + " changed while it was read"), std::string::npos) << e;
  EXPECT_EQ(h5::run_isolated("x", [&] {
              int reads = 0;
              (void)h5::read_untrusted(dump, [&] { return ++reads; });
              return reads;
            }),
            1);
}

}  // namespace
}  // namespace qforge::io
