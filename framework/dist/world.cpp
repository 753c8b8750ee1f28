// World: c10d's ProcessGroupGloo over a TCPStore (see world.h).
#include "framework/dist/world.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>

#include "framework/core/error.h"

namespace qforge::dist {

struct World::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  bool serves_store = false;
  std::chrono::milliseconds timeout{0};
  std::vector<int> silent;  // ranks the last diagnose() found dead or hung: nobody to wait for
};

World::World() = default;
World::~World() = default;
World::World(World&&) noexcept = default;
World& World::operator=(World&&) noexcept = default;

namespace {

int env_int(const char* name, int lo, int hi, int fallback, bool required) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    QF_REQUIRE(!required, "dist: environment variable ", name, " is not set (torchrun sets RANK, WORLD_SIZE, "
               "MASTER_ADDR and MASTER_PORT)");
    return fallback;
  }
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  QF_REQUIRE(end != v && *end == '\0' && x >= lo && x <= hi, "dist: environment variable ", name, "='", v,
             "' is not an integer in [", lo, ", ", hi, "]");
  return static_cast<int>(x);
}

c10d::ReduceOp to_c10d(Reduce op) {
  switch (op) {
    case Reduce::kSum: return c10d::ReduceOp::SUM;
    case Reduce::kMin: return c10d::ReduceOp::MIN;
    case Reduce::kMax: return c10d::ReduceOp::MAX;
  }
  return c10d::ReduceOp::SUM;
}

// Every rank keeps a Gloo connection to each other rank, and the rank serving the store one more
// per rank: a group larger than this process may open would fail only after the store has
// accepted its connections one by one (minutes, whatever the timeout), so it is refused at once.
void require_open_file_room(int rank, int size, bool serves) {
  struct rlimit lim {};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return;
  constexpr int64_t kOtherFiles = 64;  // the process's own files, libraries, the store client
  const int64_t needed = int64_t{size} - 1 + (serves ? int64_t{size} : 0) + kOtherFiles;
  QF_REQUIRE(needed <= static_cast<int64_t>(lim.rlim_cur), "dist: rank ", rank, " of WORLD_SIZE=", size,
             " would need about ", needed, " open files (a connection to every other rank",
             serves ? ", and the store's to every rank" : "", ") but may open ", static_cast<int64_t>(lim.rlim_cur),
             " (ulimit -n): use fewer ranks or raise the limit");
}

// Runs fn; c10d and Gloo report a dead peer, a refused port or the timeout as exceptions: those
// become a qforge::Error with `context` and the exception's first line.
template <class Fn>
void rethrow_as_error(const std::string& context, Fn&& fn) {
  try {
    fn();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    const size_t nl = msg.find('\n');
    if (nl != std::string::npos) msg.resize(nl);
    throw Error(context + msg);
  }
}

// Gloo asserts deep inside when ranks disagree on the group's size: rank 0 publishes its size,
// every other rank compares before joining (a mismatched rank 0 then times out naming itself).
void check_world_size(c10d::Store& store, int rank, int size) {
  const std::string key = "world_size";
  if (rank == 0) {
    const std::string v = std::to_string(size);
    store.set(key, std::vector<uint8_t>(v.begin(), v.end()));
    return;
  }
  const std::vector<uint8_t> got = store.get(key);
  const std::string rank0(got.begin(), got.end());
  QF_REQUIRE(rank0 == std::to_string(size), "dist: WORLD_SIZE differs between ranks: rank 0 has WORLD_SIZE=", rank0,
             ", rank ", rank, " has WORLD_SIZE=", size, "; start every rank with the same WORLD_SIZE (torchrun sets it ",
             "from --nproc-per-node and --nnodes)");
}

}  // namespace

std::string World::prefix() const { return detail::str_cat("rank ", rank_, "/", size_); }

World World::from_env(const WorldOptions& options_in) {
  WorldOptions options = options_in;
  const int timeout_s = env_int("QFORGE_DIST_TIMEOUT_S", 1, 86400, 0, false);
  if (timeout_s > 0) options.timeout = std::chrono::seconds(timeout_s);
  const int size = env_int("WORLD_SIZE", 1, 1 << 20, 1, false);
  if (size == 1) return World();
  const int rank = env_int("RANK", 0, size - 1, 0, true);
  const char* addr = std::getenv("MASTER_ADDR");
  QF_REQUIRE(addr != nullptr && *addr != '\0', "dist: environment variable MASTER_ADDR is not set (WORLD_SIZE=", size,
             ")");
  const int port = env_int("MASTER_PORT", 1, 65535, 0, true);
  // Under torchrun the elastic agent already serves a TCPStore on MASTER_PORT (and says so);
  // every rank is then its client.
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool serve = agent_store == nullptr || std::string(agent_store) != "True";
  return connect(rank, size, addr, port, options, serve);
}

World World::connect(int rank, int size, const std::string& addr, int port, const WorldOptions& options,
                     bool rank0_serves) {
  QF_REQUIRE(size >= 1 && rank >= 0 && rank < size, "dist: rank ", rank, " is not in [0, ", size, ")");
  QF_REQUIRE(port >= 1 && port <= 65535, "dist: port ", port, " is not in [1, 65535]");
  World w;
  w.rank_ = rank;
  w.size_ = size;
  if (size == 1) return w;
  require_open_file_room(rank, size, rank == 0 && rank0_serves);
  // A peer that died leaves its sockets closed; a write to one raises SIGPIPE, which by default
  // kills this process before Gloo can report the error (and diagnose() name the rank). Ignore it
  // as Python (and so PyTorch's Gloo) does, unless the program installed its own handler.
  struct sigaction old_action {};
  if (sigaction(SIGPIPE, nullptr, &old_action) == 0 && old_action.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  w.impl_ = std::make_unique<Impl>();
  const std::string context = detail::str_cat("dist: rank ", rank, "/", size, " could not join the group at ", addr,
                                              ":", port, " (timeout ", options.timeout.count(), " ms): ");
  rethrow_as_error(context, [&] {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(port);
    so.isServer = rank == 0 && rank0_serves;
    so.numWorkers = static_cast<std::size_t>(size);
    so.waitWorkers = false;
    so.timeout = options.timeout;
    // qforge's keys under their own prefix (the agent's store holds torchrun's too).
    w.impl_->store = c10::make_intrusive<c10d::PrefixStore>("qforge", c10::make_intrusive<c10d::TCPStore>(addr, so));
    check_world_size(*w.impl_->store, rank, size);
    auto po = c10d::ProcessGroupGloo::Options::create(options.timeout);
    const bool loopback = addr == "127.0.0.1" || addr == "localhost";
    po->devices.push_back(loopback ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                   : c10d::ProcessGroupGloo::createDefaultDevice());
    po->threads = 1;
    w.impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(w.impl_->store, rank, size, po);
    w.impl_->serves_store = so.isServer;
    w.impl_->timeout = options.timeout;
  });
  return w;
}

// A failed collective: this rank says so under "down/<rank>", then gives the others a moment to
// say the same; a rank that stopped on its own error left it under "error/<rank>"
// (report_failure); the ranks that said neither died, hang or left without a word. With rank 0 serving the store, its
// death takes the store along, which names it too.
std::string World::diagnose() const noexcept {
  if (!impl_ || !impl_->store) return {};
  try {
    impl_->store->set(detail::str_cat("down/", rank_), std::vector<uint8_t>{1});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    std::string stopped, silent;
    for (;;) {
      stopped.clear();
      silent.clear();
      impl_->silent.clear();
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        const std::string err = detail::str_cat("error/", r);
        if (impl_->store->check({err})) {
          const std::vector<uint8_t> why = impl_->store->get(err);
          stopped += detail::str_cat(stopped.empty() ? "" : "; ", "rank ", r, " stopped: ",
                                     std::string(why.begin(), why.end()));
        } else if (!impl_->store->check({detail::str_cat("down/", r)})) {
          silent += detail::str_cat(silent.empty() ? "" : ", ", r);
          impl_->silent.push_back(r);
        }
      }
      if (silent.empty() || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::string out = stopped;
    if (!silent.empty())
      out += detail::str_cat(out.empty() ? "" : "; ", "rank(s) ", silent, " did not answer (died, hung or left)");
    return out;
  } catch (const std::exception&) {
    return rank_ == 0 ? std::string() : "rank 0 is gone (it served the group's store: died or left)";
  }
}

void World::report_failure(const std::string& why) const noexcept {
  if (!impl_ || !impl_->store) return;
  try {
    std::string first = why.substr(0, why.find('\n'));
    if (first.size() > 400) first = first.substr(0, 400) + "...";
    impl_->store->set(detail::str_cat("error/", rank_), std::vector<uint8_t>(first.begin(), first.end()));
    // Closing the connections makes every other rank's next (or current) collective fail now, not
    // after the timeout; their diagnose() then reads the error above.
    impl_->pg.reset();
    if (impl_->serves_store) wait_until_others_read();
  } catch (const std::exception&) {
    // the store is gone as well: nothing to tell
  }
}

// This rank's store dies with it: it stays until every other rank has said it is down (having
// read the errors), or the group's timeout passes (a rank that never reaches a collective).
void World::wait_until_others_read() const {
  const auto deadline = std::chrono::steady_clock::now() + impl_->timeout;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || std::count(impl_->silent.begin(), impl_->silent.end(), r) > 0) continue;
    const std::vector<std::string> keys{detail::str_cat("down/", r)};
    while (!impl_->store->check(keys) && !impl_->store->check({detail::str_cat("error/", r)})) {
      if (std::chrono::steady_clock::now() > deadline) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));  // a rank says down/ just before it reads
}

template <class Fn>
void World::run_collective(const char* what, Fn&& fn) const {
  QF_REQUIRE(impl_->pg, "dist: ", prefix(), ": ", what, " after this rank left the group (report_failure)");
  try {
    fn();
  } catch (const std::exception& e) {
    std::string msg = e.what();
    const size_t nl = msg.find('\n');
    if (nl != std::string::npos) msg.resize(nl);
    const std::string who = diagnose();
    throw Error(detail::str_cat("dist: ", prefix(), ": ", what, " failed (",
                                who.empty() ? std::string("another rank died, hung or left") : who, "): ", msg));
  }
}

void World::all_reduce(at::Tensor& t, Reduce op) const {
  QF_REQUIRE(t.is_cpu() && t.is_contiguous(), "dist: all_reduce needs a contiguous CPU tensor");
  if (single()) return;
  run_collective("all_reduce", [&] {
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    impl_->pg->allreduce(ts, o)->wait();
  });
}

std::function<void()> World::all_reduce_async(at::Tensor& t, Reduce op) const {
  QF_REQUIRE(t.is_cpu() && t.is_contiguous(), "dist: all_reduce needs a contiguous CPU tensor");
  if (single()) return [] {};
  c10::intrusive_ptr<c10d::Work> work;
  run_collective("all_reduce", [&] {
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    work = impl_->pg->allreduce(ts, o);
  });
  return [this, work] { run_collective("all_reduce", [&] { work->wait(); }); };
}

std::vector<std::vector<uint8_t>> World::all_gather_bytes(const std::vector<uint8_t>& mine) const {
  if (single()) return {mine};
  // Sizes first, then every rank's bytes padded to the largest.
  at::Tensor n = at::full({1}, static_cast<int64_t>(mine.size()), at::kLong);
  std::vector<at::Tensor> sizes(static_cast<size_t>(size_));
  for (auto& s : sizes) s = at::empty({1}, at::kLong);
  run_collective("all_gather (sizes)", [&] {
    std::vector<std::vector<at::Tensor>> out{sizes};
    std::vector<at::Tensor> in{n};
    impl_->pg->allgather(out, in)->wait();
    sizes = out[0];
  });
  int64_t longest = 0;
  for (const auto& s : sizes) longest = std::max(longest, s.item<int64_t>());
  at::Tensor buf = at::zeros({std::max<int64_t>(longest, 1)}, at::kByte);
  if (!mine.empty()) std::memcpy(buf.data_ptr<uint8_t>(), mine.data(), mine.size());
  std::vector<at::Tensor> parts(static_cast<size_t>(size_));
  for (auto& p : parts) p = at::empty_like(buf);
  run_collective("all_gather", [&] {
    std::vector<std::vector<at::Tensor>> out{parts};
    std::vector<at::Tensor> in{buf};
    impl_->pg->allgather(out, in)->wait();
    parts = out[0];
  });
  std::vector<std::vector<uint8_t>> result(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    const auto* p = parts[r].data_ptr<uint8_t>();
    result[r].assign(p, p + sizes[r].item<int64_t>());
  }
  return result;
}

void World::broadcast(at::Tensor& t, int root) const {
  QF_REQUIRE(t.is_cpu() && t.is_contiguous(), "dist: broadcast needs a contiguous CPU tensor");
  QF_REQUIRE(root >= 0 && root < size_, "dist: broadcast root ", root, " is not in [0, ", size_, ")");
  if (single()) return;
  run_collective("broadcast", [&] {
    std::vector<at::Tensor> ts{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    impl_->pg->broadcast(ts, o)->wait();
  });
}

std::vector<uint8_t> World::broadcast_bytes(const std::vector<uint8_t>& mine, int root) const {
  QF_REQUIRE(root >= 0 && root < size_, "dist: broadcast root ", root, " is not in [0, ", size_, ")");
  if (single()) return mine;
  // The size first, then the bytes (at least one, so every rank issues the same two collectives).
  at::Tensor n = at::full({1}, static_cast<int64_t>(mine.size()), at::kLong);
  broadcast(n, root);
  const int64_t bytes = n.item<int64_t>();
  at::Tensor buf = at::zeros({std::max<int64_t>(bytes, 1)}, at::kByte);
  if (rank_ == root && !mine.empty()) std::memcpy(buf.data_ptr<uint8_t>(), mine.data(), mine.size());
  broadcast(buf, root);
  const auto* p = buf.data_ptr<uint8_t>();
  return std::vector<uint8_t>(p, p + bytes);
}

void World::barrier() const {
  if (single()) return;
  run_collective("barrier", [&] { impl_->pg->barrier()->wait(); });
}

std::vector<int64_t> shard_indices(int64_t n, int rank, int size, int64_t seed) {
  QF_REQUIRE(n >= 0 && size >= 1 && rank >= 0 && rank < size, "dist: shard_indices(n=", n, ", rank=", rank,
             ", size=", size, ") is not a valid shard");
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (seed >= 0 && n > 1) {
    at::Generator g = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
    const at::Tensor perm = at::randperm(n, g, at::TensorOptions().dtype(at::kLong));
    std::memcpy(order.data(), perm.data_ptr<int64_t>(), sizeof(int64_t) * static_cast<size_t>(n));
  }
  const int64_t per_rank = n / size;
  std::vector<int64_t> mine(static_cast<size_t>(per_rank));
  for (int64_t i = 0; i < per_rank; ++i) mine[i] = order[static_cast<size_t>(i * size + rank)];
  return mine;
}

}  // namespace qforge::dist
