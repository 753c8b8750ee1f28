// Mixed-precision search: per-layer weight widths chosen under a size budget.
//
//  1. Candidates per layer: the recipe's list (qint8, qint4 per_group(128), qint2, float, ...)
//     less those a layer cannot take (its check_scheme) or a min_bits constraint forbids.
//  2. Sensitivity of each layer and candidate, on the float model and calibration batches:
//       hessian: Ω = (Tr(H_W) / n) · ‖Q_c(W) − W‖²  (HAWQ-V2), Tr(H_W) by Hutchinson's estimator
//       loss:    L(model with only this layer's weights quantized by c) − L(float model)
//     with Q_c the weight fake-quantization freeze() will pack (min/max qparams of the candidate).
//  3. Cost of each layer and candidate, exact: the layer's bytes as model_size() counts them
//     after freeze(), measured by quantizing and freezing a float copy of the layer; and its
//     weight bits (bits × elements, float = 32) for avg_bits budgets.
//  4. The multiple-choice knapsack (knapsack.h) picks one candidate per layer (per tie group)
//     minimising the summed sensitivity under the budget.
//  5. The picks come back as explicit LayerRules, placed before the scheme's own rules, so a
//     rerun reproduces the model without searching.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "framework/scheme.h"
#include "framework/search/hessian.h"

namespace qforge::search {

struct Candidate {
  std::optional<QType> qtype;  // nullopt: float weights
  Granularity granularity = Granularity::kPerChannel;
  int64_t group_size = 0;      // per_group only
  std::string name() const;    // "qint4 per_group(128)", "qint8 per_channel", "float"
  int bits() const { return qtype ? qtype->bits : 32; }
};

enum class Method { kHessian, kLoss };
const char* to_string(Method m);
Method method_from_name(const std::string& name);
std::vector<std::string> method_names();

// One budget; exactly one field is set.
struct Budget {
  std::optional<double> size_mb;     // total model bytes after freeze / 1e6
  std::optional<double> size_ratio;  // total bytes after freeze / float model bytes
  std::optional<double> avg_bits;    // mean weight bits over the searched layers
  std::string to_string() const;     // "size_mb: 1.5"
};

struct MinBits {
  std::string pattern;  // shell-style, as in rules
  int bits = 8;         // layers matching keep at least this many bits (float counts as 32)
};

struct SearchOptions {
  Method method = Method::kHessian;
  std::vector<Candidate> candidates;
  Budget budget;
  std::vector<MinBits> min_bits;
  std::vector<std::vector<std::string>> ties;  // each: patterns whose layers share one width
  HutchinsonOptions hutchinson;
};

struct CandidateCost {
  std::string candidate;
  int64_t bytes = 0;        // the layer after freeze, as model_size counts it
  double bits = 0;          // weight bits: bits × elements
  double sensitivity = 0;
};

struct LayerChoice {
  std::string path;
  std::string type;
  int64_t weight_elements = 0;
  std::vector<CandidateCost> candidates;  // the ones this layer may take
  int chosen = -1;                        // index into candidates
  double hessian_trace = 0;               // average trace Tr(H)/n (hessian method)
};

struct ParetoPoint {
  int64_t bytes = 0;
  double predicted = 0;  // total sensitivity
};

struct SearchResult {
  Method method = Method::kHessian;
  Budget budget;
  std::vector<LayerChoice> layers;
  int64_t bytes = 0;              // predicted total bytes of the frozen model
  int64_t float_bytes = 0;        // the float model's bytes
  double predicted = 0;           // total sensitivity of the choice
  double seconds = 0;             // sensitivities + costs + solve
  int64_t hutchinson_probes = 0;  // per batch, the largest (hessian)
  std::vector<ParetoPoint> pareto;
  std::vector<LayerRule> rules;   // one explicit rule per searched layer, in model order
};

// `model` must be float (not quantized). `base` gives everything but the searched weights: the
// activation mode and grid, symmetry, observer, and which layers are searched at all (those it
// quantizes). `loss_of_batch(i)` returns the loss of calibration batch i (0 <= i < batches) with
// a graph that supports double backward. Throws qforge::Error for budgets no choice meets (naming
// the smallest reachable), candidates no layer can take, and bad options.
SearchResult search(torch::nn::Module& model, const Scheme& base, int64_t batches,
                    const std::function<at::Tensor(int64_t)>& loss_of_batch, const SearchOptions& options);

// The base scheme with the search's rules placed before its own.
Scheme apply(const Scheme& base, const SearchResult& result);

}  // namespace qforge::search
