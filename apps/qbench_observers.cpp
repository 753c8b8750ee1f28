// qbench case for observers: HistogramObserver update (2048 bins, 16M floats) vs at::histc over
// the same range. After the first batch the observer's range covers the data, the steady state of
// calibration.
#include <ATen/ATen.h>

#include "apps/qbench_registry.h"
#include "observers/histogram_observer.h"

namespace qforge::bench {
namespace {

const Register kHistogram(20, "histogram_observer_update", [] {
  const at::Tensor x = at::randn({kStreamElements});
  const double lo = x.min().item<double>(), hi = x.max().item<double>();
  auto obs = std::make_shared<HistogramObserver>();
  obs->update(x);
  return std::vector<Case>{{"16M/2048bins", 1.0 * kStreamElements * 4,
                            {{"libtorch", [=] { at::histc(x, kHistogramBins, lo, hi); }},
                             {"qforge", [=] { obs->update(x); }}}}};
});

}  // namespace
}  // namespace qforge::bench
