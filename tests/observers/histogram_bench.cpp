// observers_bench: histogram update speed against at::histc on the same data, single thread
// and with all threads. Not a test: run by hand (`observers_bench [n]`) and read the ratio.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "observers/histogram.h"
#include "observers/histogram_observer.h"

namespace {
template <typename F>
double best_ms(F&& f, int reps = 7) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return best;
}
}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (int64_t{16} << 20);
  at::manual_seed(0);
  const at::Tensor x = at::randn({n});
  const float lo = x.min().item<float>(), hi = x.max().item<float>();
  std::vector<float> counts(qforge::kHistogramBins);
  const int all = at::get_num_threads();
  std::vector<int> thread_counts = {1};
  if (all > 1) thread_counts.push_back(all);
  for (int threads : thread_counts) {
    at::set_num_threads(threads);
    const double torch_ms = best_ms([&] { at::histc(x, qforge::kHistogramBins, lo, hi); });
    const double fast_ms = best_ms([&] { qforge::histc_fast(x.data_ptr<float>(), n, lo, hi, qforge::kHistogramBins, counts.data()); });
    const double ref_ms = best_ms([&] { qforge::histc_reference(x.data_ptr<float>(), n, lo, hi, qforge::kHistogramBins, counts.data()); }, 3);
    qforge::HistogramObserver obs;
    obs.update(x);
    // Data inside the running range: one fused pass (finite min/max + binning).
    const double update_ms = best_ms([&] { obs.update(x); });
    // First batch of a fresh observer: a statistics pass, then binning on the new range.
    const double first_ms = best_ms([&] {
      qforge::HistogramObserver fresh;
      fresh.update(x);
    });
    std::printf("%lld floats, %d thread(s): at::histc %.2f ms | qforge histc_fast %.2f ms (%.2fx) | "
                "histc_reference %.2f ms (%.2fx)\n"
                "  HistogramObserver::update in range %.2f ms (%.2fx vs at::histc) | first batch %.2f ms (%.2fx)\n",
                static_cast<long long>(n), threads, torch_ms, fast_ms, torch_ms / fast_ms, ref_ms, torch_ms / ref_ms,
                update_ms, torch_ms / update_ms, first_ms, torch_ms / first_ms);
  }
  return 0;
}
