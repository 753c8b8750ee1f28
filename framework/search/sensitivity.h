// Phase 2 of the mixed-precision search: how much each layer's candidates hurt, one strategy per
// method (hessian, loss, histogram) chosen from one table by Method. A new method is one class
// in sensitivity.cpp and one row of that table (and its name in search.cpp's kMethodNames).
// Internal to framework/search.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/search/candidates.h"
#include "observers/histogram_observer.h"

namespace qforge {
class Progress;
}

namespace qforge::search {

// Input histogram observers restored from the calibration dump, once per layer.
using HistogramObservers = std::map<std::string, std::unique_ptr<Observer>>;

// What a strategy measures with.
struct SensitivityContext {
  const std::vector<Searched>& layers;
  int64_t batches;
  const std::function<at::Tensor(int64_t)>& loss_of_batch;
  const SearchOptions& options;
  HistogramObservers& observers;
  Progress* progress = nullptr;  // advanced once per unit of SensitivityMethod::steps()
};

struct Sensitivities {
  std::vector<std::vector<double>> values;  // [layer][candidate], as Searched::cands
  std::vector<double> traces;               // average Hessian trace Tr(H)/n per layer (hessian)
  int64_t hutchinson_probes = 0;            // per batch, the largest (hessian)
};

class SensitivityMethod {
 public:
  virtual ~SensitivityMethod() = default;
  virtual Method method() const = 0;
  // Whether candidates may search activations (Candidate::activations).
  virtual bool searches_activations() const { return false; }
  // Options this method needs beyond the common ones; `measuring` false in dry runs, before any
  // calibration exists. Throws SearchError.
  virtual void check(const SearchOptions& /*options*/, bool /*measuring*/) const {}
  // The method's settings and data beyond the common key (sensitivity_key), "" when none.
  virtual std::string key_suffix(const SearchOptions& options) const = 0;
  virtual Sensitivities measure(const SensitivityContext& context) const = 0;
  // How many units of work measure() reports to context.progress (batches, layers).
  virtual int64_t steps(const SensitivityContext& context) const { return static_cast<int64_t>(context.layers.size()); }
  // Method-specific facts recorded for a layer's report (the histogram's activation errors).
  virtual void describe(LayerChoice& /*layer*/, const SensitivityContext& /*context*/) const {}
};

// The strategy of `method`, from the one table.
const SensitivityMethod& sensitivity_method(Method method);

// What the sensitivities depend on: method and its settings, the base scheme (symmetry, grids),
// the searched weights (FNV-1a of their bytes) and the calibration data (batch 0's float loss).
std::string sensitivity_key(const std::vector<Searched>& layers, const Scheme& base, int64_t batches, double loss0,
                            const SearchOptions& options);

// The stored sensitivities of options.reuse when they cover every layer and candidate under
// `key`; otherwise nullopt and `note` says why (empty when no reuse was asked for).
std::optional<Sensitivities> reused_sensitivities(const std::vector<Searched>& layers, const SearchOptions& options,
                                                  const std::string& key, std::string* note);

}  // namespace qforge::search
