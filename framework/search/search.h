// Mixed-precision search: per-layer weight widths chosen under size, bits and latency budgets.
//
//  1. Candidates per layer: the recipe's list (qint8, qint4 per_group(128), qint2, float, ...)
//     less those a layer cannot take (its check_scheme) or a min_bits constraint forbids.
//  2. Sensitivity of each layer and candidate, on the float model and calibration batches:
//       hessian: Ω = (Tr(H_W) / n) · ‖Q_c(W) − W‖²  (HAWQ-V2), Tr(H_W) by Hutchinson's estimator
//       loss:    L(model with only this layer's weights quantized by c) − L(float model)
//       histogram: ‖Q_c(W) − W‖² / ‖W‖² + E[(Q_a(x) − x)²] / E[x²], the weight's and the input's
//                relative quantization error, the latter read off the calibration histogram
//                (no forward or backward pass beyond calibration); activations searchable
//     with Q_c the weight fake-quantization freeze() will pack (min/max qparams of the candidate).
//  3. Cost of each layer and candidate, exact: the layer's bytes as model_size() counts them
//     after freeze(), measured by quantizing and freezing a float copy of the layer; and its
//     weight bits (bits × elements, float = 32) for avg_bits budgets; and its latency, the
//     frozen copy's forward timed on this machine at the input shape the layer saw on
//     calibration batch 0, last-level cache evicted before each call (latency.h, cached per
//     machine).
//  4. The multiple-choice knapsack (knapsack.h) picks one candidate per layer (per tie group)
//     minimising the summed sensitivity under every budget given.
//  5. The picks come back as explicit LayerRules, placed before the scheme's own rules, so a
//     rerun reproduces the model without searching.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "framework/api/kv_cache_scheme.h"
#include "framework/core/error.h"
#include "framework/io/calibration_dump.h"
#include "framework/api/scheme.h"
#include "framework/search/hessian.h"
#include "framework/search/latency.h"

namespace qforge::search {

struct Candidate {
  std::optional<QType> qtype;  // nullopt: float weights (and activations: the layer is kept float)
  Granularity granularity = Granularity::kPerChannel;
  int64_t group_size = 0;      // per_group only
  // Searched activations: unset keeps the scheme's mode; kStatic the scheme's static grid;
  // kNone float activations (a weight-only kernel). Histogram method only.
  std::optional<ActivationMode> activations;
  std::string name() const;    // "qint4 per_group(128)", "qint8 per_channel / a:float", "float"
  int bits() const { return qtype ? qtype->bits : 32; }
};

enum class Method { kHessian, kLoss, kHistogram };
const char* to_string(Method m);
Method method_from_name(const std::string& name);
std::vector<std::string> method_names();

// The budgets; at least one is set, at most one of size_mb and size_ratio. All given hold at once.
struct Budget {
  std::optional<double> size_mb;     // total model bytes after freeze / 1e6 (+ a priced KV cache's)
  std::optional<double> size_ratio;  // total bytes after freeze / float model bytes (each + a priced KV cache's)
  std::optional<double> avg_bits;    // mean weight bits over the searched layers
  std::optional<double> latency_ms;  // summed measured latency of the qforge layers with weights
  std::string to_string() const;     // "size_mb: 1.5, latency_ms: 2"
};

// A budget's field or a candidate the search cannot use; `candidate` is the index into
// SearchOptions::candidates when the problem is one candidate (qtrain points at the recipe line).
class SearchError : public Error {
 public:
  SearchError(const std::string& what, int candidate = -1) : Error(what), candidate_(candidate) {}
  int candidate() const { return candidate_; }

 private:
  int candidate_;
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
  LatencyOptions latency;
  // The base scheme's calibration (io::calibration_dump of the model quantized with `base` and
  // calibrated): the histogram method reads each layer's input histogram from it.
  const io::CalibrationDump* calibration = nullptr;
  // Sensitivities of an earlier search (from a calibration dump): used instead of measuring when
  // their key matches this search's (same method and settings, weights, calibration batches).
  const io::SearchSensitivities* reuse = nullptr;
  // The KV cache priced into the size budgets (size_mb, size_ratio: the cache's bytes at this many
  // cached positions, one sequence, under `kv_cache`, a float32 cache when unquantized; size_ratio
  // then compares with the float model plus a float32 cache). 0: the budgets hold the model alone.
  // Needs a model that keeps a cache (GPT-2, Llama: kv_cache_models) and a size budget.
  int64_t kv_cache_context = 0;
  KvCacheScheme kv_cache;
  // Progress bars on stderr while sensitivities are measured and layers priced (layers done,
  // kernels timed, time left); qtrain turns them on.
  bool progress = false;
  // Several processes (data-parallel ranks): every one must choose the same widths. Set, it
  // returns rank 0's text on every rank (a broadcast), calling `table` (this process's table,
  // serialized) on rank 0 only; after pricing, rank 0's table (sensitivities, latencies, bytes,
  // the unsearched layers' costs) replaces this process's, so the knapsack solves one problem
  // everywhere. Ranks other than 0 set latency.time_kernels = false: they time nothing. A rank
  // whose layers or candidates differ from rank 0's throws.
  std::function<std::string(const std::function<std::string()>& table)> from_rank0;
};

struct CandidateCost {
  std::string candidate;
  int64_t bytes = 0;        // the layer after freeze, as model_size counts it
  double bits = 0;          // weight bits: bits × elements
  double sensitivity = 0;
  double latency_ms = 0;    // measured frozen forward at the layer's input shape
  std::string kernel;       // what the frozen layer runs ("float" for float)
};

struct LayerChoice {
  std::string path;
  std::string type;
  int64_t weight_elements = 0;
  std::vector<CandidateCost> candidates;  // the ones this layer may take
  int chosen = -1;                        // index into candidates
  double hessian_trace = 0;               // average trace Tr(H)/n (hessian method)
  std::vector<int64_t> input_shape;       // what the latency was measured at
  // histogram method: E[(Q(x) − x)²] / E[x²] of the layer's input for each integer grid width,
  // read off its calibration histogram with the range the observer picks for that width.
  std::map<std::string, double> activation_error;
};

struct ParetoPoint {
  int64_t bytes = 0;
  double latency_ms = 0;
  double predicted = 0;             // total sensitivity
  std::vector<LayerRule> rules;     // the assignment, as the chosen one's rules
  std::optional<double> accuracy;   // measured by the caller (qtrain evaluates a few points)
  bool chosen = false;              // the assignment the search picked
};

struct SearchResult {
  Method method = Method::kHessian;
  Budget budget;
  std::vector<LayerChoice> layers;
  int64_t bytes = 0;              // predicted total bytes of the frozen model
  int64_t float_bytes = 0;        // the float model's bytes
  // SearchOptions::kv_cache_context and the cache's bytes there (0 when not priced): as scheduled
  // and as a float32 cache; the size budgets held bytes + kv_cache_bytes.
  int64_t kv_cache_context = 0, kv_cache_bytes = 0, float_kv_cache_bytes = 0;
  std::string kv_cache_scheme;    // KvCacheScheme::to_string of the priced cache
  double latency_ms = 0;          // predicted: summed latency of the qforge layers with weights
  double float_latency_ms = 0;    // the same layers all float
  std::string pareto_axis;        // "bytes" or "latency_ms": the front's cost axis
  std::string cpu;                // where the latencies were measured
  int64_t latency_measured = 0;   // kernels timed now
  int64_t latency_cached = 0;     // read from the cache file
  std::string latency_cache_warning;  // why the cache file could not be written ("" when it was)
  double predicted = 0;           // total sensitivity of the choice
  double seconds = 0;             // sensitivities + costs + solve
  int64_t hutchinson_probes = 0;  // per batch, the largest (hessian)
  std::vector<ParetoPoint> pareto;
  std::vector<LayerRule> rules;   // one explicit rule per searched layer, in model order
  std::vector<std::string> skipped;  // candidates a layer cannot take: "<candidate> on <path>: why"
  io::SearchSensitivities sensitivities;  // what was measured (or reused), for the calibration dump
  bool reused = false;                    // sensitivities came from SearchOptions::reuse
  std::string reuse_note;                 // why a given `reuse` was not used (empty when it was)
};

// `model` must be float (not quantized). `base` gives everything but the searched weights: the
// activation mode and grid, symmetry, observer, and which layers are searched at all (those it
// quantizes). `loss_of_batch(i)` returns the loss of calibration batch i (0 <= i < batches) with
// a graph that supports double backward (only batch 0 is run for the latency shapes by the loss
// method's callers too). Throws SearchError for budgets no choice meets (naming the smallest
// reachable), candidates no layer can take, and bad options.
SearchResult search(torch::nn::Module& model, const Scheme& base, int64_t batches,
                    const std::function<at::Tensor(int64_t)>& loss_of_batch, const SearchOptions& options);

// The checks search() makes before any measurement (budgets, candidates each layer may take, a
// candidate no layer can take): throws SearchError. For dry runs.
void check_search(torch::nn::Module& model, const Scheme& base, const SearchOptions& options);

// The base scheme with the search's rules placed before its own.
Scheme apply(const Scheme& base, const SearchResult& result);
Scheme apply(const Scheme& base, const std::vector<LayerRule>& rules);

}  // namespace qforge::search
