// qbench --load K (qbench_load.h): forked busy loops, stopped and continued around each row.
#include "apps/qbench_load.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/contention.h"

namespace qforge::bench {

namespace {

// The live load processes, for the signal handler (which may only read plain memory).
constexpr int kMaxLoadProcesses = 256;
pid_t g_pids[kMaxLoadProcesses];
std::atomic<int> g_count{0};

constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGABRT};

void kill_load_and_reraise(int sig) {
  const int n = g_count.load();
  for (int i = 0; i < n; ++i) kill(g_pids[i], SIGKILL);
  std::signal(sig, SIG_DFL);
  raise(sig);
}

[[noreturn]] void spin_forever(pid_t parent) {
  for (int sig : kHandledSignals) std::signal(sig, SIG_DFL);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0);  // qbench died before the line above took effect
  for (volatile unsigned long i = 0;; i = i + 1) {
  }
}

// Waits until `pid` reports the state change `options` asks for (stopped or continued).
void wait_state(pid_t pid, int options) {
  int status = 0;
  while (waitpid(pid, &status, options) < 0 && errno == EINTR) {
  }
}

}  // namespace

BusyLoad::BusyLoad(int processes) {
  if (processes > kMaxLoadProcesses)
    throw std::runtime_error("qbench --load: at most " + std::to_string(kMaxLoadProcesses) + " processes");
  for (int sig : kHandledSignals) std::signal(sig, kill_load_and_reraise);
  const pid_t parent = getpid();
  for (int i = 0; i < processes; ++i) {
    const pid_t pid = fork();
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      end();
      throw std::runtime_error("qbench --load: fork failed: " + why);
    }
    if (pid == 0) spin_forever(parent);
    pids_.push_back(pid);
    g_pids[i] = pid;
    g_count.store(i + 1);
  }
  pause();
}

BusyLoad::~BusyLoad() { end(); }

void BusyLoad::end() {
  g_count.store(0);
  for (pid_t pid : pids_) kill(pid, SIGKILL);
  for (pid_t pid : pids_) wait_state(pid, 0);
  pids_.clear();
}

// Each regime starts from a fresh stall guard (kernels/cpu/contention.h): a back-off the loaded
// timing started would otherwise keep the idle timing after it on one thread for up to
// kMaxBackoffMillis, and the loaded timing pays its own first stall in its warm-up.
void BusyLoad::resume() {
  for (pid_t pid : pids_) kill(pid, SIGCONT);
  for (pid_t pid : pids_) wait_state(pid, WCONTINUED);
  kernels::reset_contention_backoff();
}

void BusyLoad::pause() {
  for (pid_t pid : pids_) kill(pid, SIGSTOP);
  for (pid_t pid : pids_) wait_state(pid, WUNTRACED);
  kernels::reset_contention_backoff();
}

}  // namespace qforge::bench
