// qbench --load K: K busy-loop processes beside the benchmark, so the loaded rows of a shared
// machine (every core has another runnable process) are reproducible. The processes are forked
// once, held stopped (SIGSTOP) while a row is measured idle and continued (SIGCONT) while it is
// measured loaded; they are killed and reaped when the BusyLoad is destroyed, killed by qbench's
// handler on SIGINT/SIGTERM/SIGHUP/SIGABRT, and by the kernel (PR_SET_PDEATHSIG) if qbench dies
// any other way, so none outlives qbench.
#pragma once

#include <sys/types.h>

#include <vector>

namespace qforge::bench {

class BusyLoad {
 public:
  explicit BusyLoad(int processes);  // forks them stopped; throws std::runtime_error if fork fails
  ~BusyLoad();
  BusyLoad(const BusyLoad&) = delete;
  BusyLoad& operator=(const BusyLoad&) = delete;

  void resume();  // every process spinning (returns once each has been continued)
  void pause();   // every process stopped (returns once each has stopped)
  int processes() const { return static_cast<int>(pids_.size()); }

 private:
  void end();  // kill and reap every process

  std::vector<pid_t> pids_;
};

}  // namespace qforge::bench
