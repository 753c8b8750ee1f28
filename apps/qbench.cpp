// qbench: side-by-side benchmarks of qforge and LibTorch for the same work in the same run.
// `qbench --json` prints one JSON object per line:
//   {"bench", "impl": "qforge"|"libtorch"|"limit", "shape", "threads", "load", "ms", "GBps"}
// Without --json it prints a table with the qforge/LibTorch speed ratio of each row.
// `--load K` measures every row twice, idle ("load": 0) then beside K busy-loop processes
// ("load": K), and the table gains the loaded columns.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <dlfcn.h>
#include <malloc.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "apps/qbench_load.h"
#include "apps/qbench_registry.h"
#include "kernels/cpu/contention.h"
#include "kernels/cpu/thread_pool.h"

namespace qforge::bench {

namespace {

// ATen's thread setting does not reach a pthreads OpenBLAS; the fp32 baseline must use the same
// number of threads as everything else in the row.
void set_blas_threads(int t) {
  using Fn = void (*)(int);
  if (auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(t);
}

struct Timing {
  double ms = 0;
  double loaded_ms = 0;  // beside the load; 0 without --load
};

// Impls timed in turn: every impl warmed up once (page faults, allocator, caches), then `reps`
// rounds of one timed run of each, the medians of those runs; idle, then (with a load) beside the
// load processes. One impl: its repetitions back to back (qbench's default, an impl at a time).
// A case's impls together (--interleave): a machine whose speed drifts over seconds (a shared VM)
// then moves every impl of the case alike, so their ratios hold where back-to-back medians would
// each catch another phase of the drift.
std::vector<Timing> time_in_turn(const std::vector<Impl>& impls, int reps, BusyLoad* load) {
  auto medians = [&] {
    for (const Impl& impl : impls) impl.run();  // warm-ups
    std::vector<std::vector<double>> ms(impls.size());
    for (int r = 0; r < reps; ++r) {
      for (size_t i = 0; i < impls.size(); ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        impls[i].run();
        ms[i].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    std::vector<double> out;
    for (std::vector<double>& m : ms) {
      std::sort(m.begin(), m.end());
      out.push_back(m[m.size() / 2]);
    }
    return out;
  };
  std::vector<Timing> t(impls.size());
  const std::vector<double> idle = medians();
  for (size_t i = 0; i < impls.size(); ++i) t[i].ms = idle[i];
  if (load != nullptr) {
    load->resume();
    std::vector<double> loaded;
    try {
      loaded = medians();
    } catch (...) {
      load->pause();
      throw;
    }
    load->pause();
    for (size_t i = 0; i < impls.size(); ++i) t[i].loaded_ms = loaded[i];
  }
  return t;
}

std::string torch_ratio(const Impl& impl, const std::map<std::string, double>& ms_by_impl, double ms) {
  const auto torch_ms = ms_by_impl.find("libtorch");
  char ratio[32] = "";
  if (impl.name != "libtorch" && torch_ms != ms_by_impl.end() && ms > 0)
    std::snprintf(ratio, sizeof ratio, "%.2fx", torch_ms->second / ms);
  return ratio;
}

}  // namespace

std::vector<Bench>& registry() {
  static std::vector<Bench> r;
  return r;
}

}  // namespace qforge::bench

static int run_qbench(int argc, char** argv) {
  using namespace qforge::bench;
  CLI::App app{"qbench: qforge vs LibTorch, same work, same run"};
  bool json = false;
  int reps = 7;
  std::string filter;
  std::vector<int> threads;
  app.add_flag("--json", json, "one JSON object per line");
  app.add_option("--reps", reps, "timed repetitions per case (median is reported)")->check(CLI::Range(1, 1000));
  app.add_option("--filter", filter, "only benches whose name contains this");
  app.add_option("--threads", threads, "thread counts (default: 1 and all cores)");
  int load = 0;
  app.add_option("--load", load,
                 "K busy-loop processes beside the run: every row is timed idle, then with the K processes spinning")
      ->check(CLI::Range(0, 256));
  std::string parallel;
  app.add_option("--parallel", parallel,
                 "loop under qforge's CPU kernels: openmp (default, or QFORGE_PARALLEL) or pool (opt-in, docs/performance.md)")
      ->check(CLI::IsMember({"openmp", "pool"}));
  bool interleave = false;
  app.add_flag("--interleave", interleave,
               "time a case's impls in turn, one repetition of each a round (medians of the same rounds), so a "
               "machine whose speed drifts moves them alike; default: each impl's repetitions back to back");
  bool fresh_pages = false;
  app.add_flag("--fresh-pages", fresh_pages,
               "let glibc map every large buffer afresh (first-touch page faults in every call)");
  CLI11_PARSE(app, argc, argv);
  if (!parallel.empty()) qforge::kernels::set_parallel_backend(qforge::kernels::parse_parallel_backend(parallel));
  qforge::kernels::parallel_backend();  // a bad QFORGE_PARALLEL fails here, before any row
  if (!fresh_pages) {
    // Keep freed 64 MiB buffers in the heap so both sides reuse warm pages, as a caching
    // allocator would; otherwise page faults dominate both implementations equally.
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  if (threads.empty()) {
    threads.push_back(1);
    const int all = static_cast<int>(std::thread::hardware_concurrency());
    if (all > 1) threads.push_back(all);
  }

  std::unique_ptr<BusyLoad> busy;
  if (load > 0) busy = std::make_unique<BusyLoad>(load);
  std::stable_sort(registry().begin(), registry().end(),
                   [](const Bench& a, const Bench& b) { return a.order < b.order; });
  if (!json) {
    std::printf("%-28s %-22s %-9s %3s %10s %9s %8s", "bench", "shape", "impl", "thr", "ms", "GB/s", "x torch");
    if (busy) std::printf(" %10s %8s %8s", ("ms load" + std::to_string(load)).c_str(), "x torch", "/ idle");
    std::printf("\n");
  }
  for (int t : threads) {
    qforge::kernels::reset_contention_backoff();  // a back-off of the last count's rows must not outlive it
    at::set_num_threads(t);
    set_blas_threads(t);
    for (const Bench& b : registry()) {
      if (!filter.empty() && b.name.find(filter) == std::string::npos) continue;
      for (const Case& c : b.make_cases()) {
        std::map<std::string, double> ms_by_impl, loaded_by_impl;
        const std::vector<Timing> in_turn = interleave ? time_in_turn(c.impls, reps, busy.get()) : std::vector<Timing>{};
        for (size_t i = 0; i < c.impls.size(); ++i) {
          const Impl& impl = c.impls[i];
          const Timing tm = interleave ? in_turn[i] : time_in_turn({impl}, reps, busy.get()).front();
          ms_by_impl[impl.name] = tm.ms;
          loaded_by_impl[impl.name] = tm.loaded_ms;
          const double gbps = c.bytes > 0 ? c.bytes / (tm.ms * 1e6) : 0.0;
          if (json) {
            nlohmann::json row = {{"bench", b.name}, {"impl", impl.name}, {"shape", c.shape}, {"threads", t},
                                  {"load", 0},       {"ms", tm.ms},       {"GBps", gbps}, {"interleaved", interleave}};
            std::printf("%s\n", row.dump().c_str());
            if (busy) {
              row["load"] = load;
              row["ms"] = tm.loaded_ms;
              row["GBps"] = c.bytes > 0 ? c.bytes / (tm.loaded_ms * 1e6) : 0.0;
              std::printf("%s\n", row.dump().c_str());
            }
          } else {
            std::printf("%-28s %-22s %-9s %3d %10.3f %9.2f %8s", b.name.c_str(), c.shape.c_str(), impl.name.c_str(), t,
                        tm.ms, gbps, torch_ratio(impl, ms_by_impl, tm.ms).c_str());
            if (busy)
              std::printf(" %10.3f %8s %7.2fx", tm.loaded_ms, torch_ratio(impl, loaded_by_impl, tm.loaded_ms).c_str(),
                          tm.loaded_ms / tm.ms);
            std::printf("\n");
          }
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}

// Errors end the run through main's return, so the load processes are reaped by BusyLoad's destructor.
int main(int argc, char** argv) {
  try {
    return run_qbench(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qbench: %s\n", e.what());
    return 1;
  }
}
