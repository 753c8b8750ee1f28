// A process group for data-parallel calibration and QAT on PyTorch's c10d: Gloo over a TCPStore,
// configured from the environment torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or
// a single process when that environment is absent. Every collective throws qforge::Error naming
// this rank, the operation and the cause (a peer that died, or the timeout passing) instead of
// hanging. CPU tensors (Gloo).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace qforge::dist {

struct WorldOptions {
  // How long any rendezvous or collective waits for the other ranks before failing.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

enum class Reduce : uint8_t { kSum, kMin, kMax };

class World {
 public:
  // One process, no communication (every collective returns its input).
  World();
  ~World();
  World(World&&) noexcept;
  World& operator=(World&&) noexcept;

  // From torchrun's environment; a single-process world when WORLD_SIZE is unset or 1. Bad or
  // missing variables (WORLD_SIZE=2 without RANK, a port out of range) throw naming the variable.
  // QFORGE_DIST_TIMEOUT_S, when set, replaces options.timeout.
  static World from_env(const WorldOptions& options = {});
  // Rank `rank` of `size` meeting at addr:port. rank0_serves: rank 0 serves the TCPStore there
  // (false: one exists already, as torchrun's agent serves it: TORCHELASTIC_USE_AGENT_STORE).
  // With size > 1 it sets SIGPIPE to ignored when it has the default action (as Python does), so
  // a write to a dead peer's socket fails as an error naming that rank instead of killing this one.
  static World connect(int rank, int size, const std::string& addr, int port, const WorldOptions& options = {},
                       bool rank0_serves = true);

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool single() const { return size_ == 1; }
  // "rank 1/2" for log lines.
  std::string prefix() const;

  // In place over all ranks (float, double, int32 or int64 CPU tensors, contiguous).
  void all_reduce(at::Tensor& t, Reduce op) const;
  // Starts an all-reduce of t (as all_reduce) and returns at once; the returned wait() blocks
  // until t holds the result, throwing as all_reduce does. t must stay alive and untouched until
  // then. Every rank must start its collectives in the same order.
  std::function<void()> all_reduce_async(at::Tensor& t, Reduce op) const;
  // Every rank's bytes, in rank order (sizes may differ between ranks).
  std::vector<std::vector<uint8_t>> all_gather_bytes(const std::vector<uint8_t>& mine) const;
  // t from `root` on every rank (same shape and dtype everywhere).
  void broadcast(at::Tensor& t, int root) const;
  // `root`'s bytes on every rank (any size; what the others pass is replaced): how a decision
  // taken once, on one rank, reaches all of them.
  std::vector<uint8_t> broadcast_bytes(const std::vector<uint8_t>& mine, int root) const;
  void barrier() const;

  // Best effort, never throws: leaves `why` where the other ranks look when their collective
  // fails (qtrain calls it before a rank exits on an error), so their error names this rank and
  // its cause instead of only "a peer left". Then leaves the group (no collective works after
  // it), so the others fail at their next collective instead of waiting for the timeout; the rank
  // serving the store (rank 0 outside torchrun) keeps it until every other rank has read the
  // error or stopped, at most the timeout.
  void report_failure(const std::string& why) const noexcept;

 private:
  // After a failed collective: which ranks stopped (with the cause they reported) and which did
  // not answer (died or hung). Never throws.
  std::string diagnose() const noexcept;
  void wait_until_others_read() const;
  template <class Fn>
  void run_collective(const char* what, Fn&& fn) const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
};

// The examples of rank `rank` out of `size`: a permutation of [0, n) drawn from `seed` (the same
// on every rank; seed < 0 keeps the order), then every size-th element starting at `rank`, cut
// to floor(n / size) so every rank runs the same number of steps. Disjoint across ranks; the
// last n % size examples of the permutation are left out (at most size - 1).
std::vector<int64_t> shard_indices(int64_t n, int rank, int size, int64_t seed = -1);

}  // namespace qforge::dist
