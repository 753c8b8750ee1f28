// qbench --load K: loaded rows carry a "load" field, the busy-loop processes never outlive qbench
// (normal exit, SIGTERM), --interleave gives the same rows timed in turn, and (slow tier) qforge's
// kernels at 2 threads stay within 1.25x their 1-thread time while every core has another runnable
// process.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/paths.h"

namespace {

// Live (not zombie) processes whose parent is this test. With the test as child subreaper, any
// process qbench left behind is re-parented here.
std::vector<pid_t> live_children() {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == getpid() && state != 'Z') out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// Reaps whatever has exited, then fails (and kills) any process still running.
void expect_no_process_left() {
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  const std::vector<pid_t> left = live_children();
  EXPECT_TRUE(left.empty()) << left.size() << " busy-loop process(es) outlived qbench";
  for (pid_t pid : left) kill(pid, SIGKILL);
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
};

Child start_qbench(const std::vector<std::string>& args) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv{const_cast<char*>(QBENCH_BIN)};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(QBENCH_BIN, argv.data());
    _exit(127);
  }
  close(fds[1]);
  return Child{pid, fdopen(fds[0], "r")};
}

std::string read_line(FILE* f) {
  std::string line;
  for (int c; (c = std::fgetc(f)) != EOF && c != '\n';) line.push_back(static_cast<char>(c));
  return line;
}

// Runs qbench to the end: its JSON rows and exit status.
std::vector<nlohmann::json> run_qbench(const std::vector<std::string>& args, int* status) {
  Child c = start_qbench(args);
  std::vector<nlohmann::json> rows;
  for (std::string line; !(line = read_line(c.out)).empty();) rows.push_back(nlohmann::json::parse(line));
  std::fclose(c.out);
  waitpid(c.pid, status, 0);
  return rows;
}

class QbenchLoad : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0); }
};

TEST_F(QbenchLoad, RowsCarryIdleAndLoadedFiguresAndNoProcessOutlivesTheRun) {
  int status = 0;
  const auto rows = run_qbench({"--json", "--load", "2", "--threads", "1", "--reps", "1", "--filter",
                                "linear_w8a8dyn_vs_fp32"},
                               &status);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  std::map<int, int> by_load;
  for (const auto& r : rows) {
    ASSERT_TRUE(r.contains("load")) << r.dump();
    ASSERT_GT(r.at("ms").get<double>(), 0.0) << r.dump();
    by_load[r.at("load").get<int>()]++;
  }
  EXPECT_GT(by_load[0], 0);
  EXPECT_EQ(by_load[0], by_load[2]) << "each idle row has its loaded twin";
  expect_no_process_left();
}

TEST_F(QbenchLoad, RowsWithoutLoadSayLoadZero) {
  int status = 0;
  const auto rows = run_qbench({"--json", "--threads", "1", "--reps", "1", "--filter", "linear_w8a8dyn_vs_fp32"}, &status);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_FALSE(rows.empty());
  for (const auto& r : rows) EXPECT_EQ(r.at("load").get<int>(), 0) << r.dump();
}

// --interleave: the same rows (every impl of every case, idle and loaded twins), marked, each from
// the medians of rounds that time one run of every impl in turn.
TEST_F(QbenchLoad, InterleavedRowsAreTheSameRowsMarkedAsSuch) {
  int status = 0;
  const auto plain = run_qbench({"--json", "--threads", "1", "--reps", "1", "--filter", "linear_w8a8dyn_vs_fp32"}, &status);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const auto turns = run_qbench({"--json", "--interleave", "--load", "1", "--threads", "1", "--reps", "3", "--filter",
                                 "linear_w8a8dyn_vs_fp32"},
                                &status);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  auto keys = [](const std::vector<nlohmann::json>& rows, int load) {
    std::vector<std::string> k;
    for (const auto& r : rows)
      if (r.at("load").get<int>() == load)
        k.push_back(r.at("shape").get<std::string>() + "/" + r.at("impl").get<std::string>());
    return k;
  };
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(keys(turns, 0), keys(plain, 0));
  EXPECT_EQ(keys(turns, 1), keys(plain, 0)) << "each idle row has its loaded twin";
  for (const auto& r : turns) {
    EXPECT_TRUE(r.at("interleaved").get<bool>()) << r.dump();
    EXPECT_GT(r.at("ms").get<double>(), 0.0) << r.dump();
  }
  for (const auto& r : plain) EXPECT_FALSE(r.at("interleaved").get<bool>()) << r.dump();
  expect_no_process_left();
}

TEST_F(QbenchLoad, SigtermEndsTheLoadProcessesToo) {
  Child c = start_qbench({"--json", "--load", "2", "--threads", "1", "--reps", "50", "--filter", "linear_w8a8dyn_vs_fp32"});
  EXPECT_FALSE(read_line(c.out).empty());  // the load processes exist once a row is printed
  kill(c.pid, SIGTERM);
  int status = 0;
  waitpid(c.pid, &status, 0);
  std::fclose(c.out);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status;
  expect_no_process_left();
}

// Slow tier, on qforge's pool (--parallel pool; the default OpenMP loop collapses here). The issue's
// bound is 1.25x; the 0.05 ms allowance is for timer and scheduler noise on a sub-millisecond row
// (the collapse it guards against costs a whole scheduler slice, ~8 ms). It can fail on the 2-vCPU
// VM as measured (docs/performance.md): 1x4096x4096 int8 once took 0.294 -> 0.425 ms (1.45x).
constexpr double kBound = 1.25;
constexpr double kNoiseMs = 0.05;

TEST(QbenchLoadBound, TwoThreadsUnderLoadStayWithinBoundOfOneThread) {
  struct Row {
    const char* bench;
    const char* shape;
  };
  const Row checked[] = {{"linear_w8a8dyn_vs_fp32", "1x4096x4096"},
                         {"linear_w8a8dyn_vs_fp32", "128x768x3072"},
                         {"linear_w4a8dyn_g128_vs_fp32", "1x4096x4096"}};
  std::map<std::string, std::map<int, double>> loaded;  // bench/shape -> threads -> ms
  for (const char* bench : {"linear_w8a8dyn_vs_fp32", "linear_w4a8dyn_g128_vs_fp32"}) {
    int status = 0;
    const auto rows = run_qbench(
        {"--json", "--parallel", "pool", "--load", "2", "--threads", "1", "2", "--reps", "9", "--filter", bench}, &status);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    for (const auto& r : rows)
      if (r.at("impl") == "qforge" && r.at("load").get<int>() == 2 && r.at("bench") == bench)
        loaded[r.at("bench").get<std::string>() + "/" + r.at("shape").get<std::string>()][r.at("threads").get<int>()] =
            r.at("ms").get<double>();
  }
  for (const Row& row : checked) {
    const std::string key = std::string(row.bench) + "/" + row.shape;
    ASSERT_EQ(loaded[key].count(1) + loaded[key].count(2), 2u) << key;
    const double t1 = loaded[key][1], t2 = loaded[key][2];
    EXPECT_LE(t2, kBound * t1 + kNoiseMs) << key << ": 1 thread " << t1 << " ms, 2 threads " << t2 << " ms under --load 2";
  }
}

}  // namespace
