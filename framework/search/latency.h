// Latency of a layer's frozen kernel, measured on this machine at the input shape the layer
// really sees, in the regime a deployed model meets: its weights are not in the last-level cache
// between calls (each timed call follows a write over a buffer twice the LLC's size). Results are
// kept per machine in a small JSON file keyed by CPU model, thread count, kernel and shapes, so a
// second search on the same machine times nothing it has timed before.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "framework/nn/quantizable.h"

namespace qforge::search {

// "model name" of /proc/cpuinfo (or "unknown cpu").
const std::string& cpu_model_name();
// Bytes of the largest cache level (sysfs), or 0 when unknown.
int64_t last_level_cache_bytes();

struct LatencyOptions {
  std::string cache_path;  // JSON cache of measured latencies; empty: no file
  int repeats = 7;         // timed calls; the median is kept
  bool cold = true;        // evict the last-level cache before every timed call
  // false: this process times nothing and opens no cache; its latencies come from the process
  // that does (SearchOptions::from_rank0: rank 0 times, every rank uses rank 0's figures).
  bool time_kernels = true;
};

// The default cache file: $QFORGE_LATENCY_CACHE, else $XDG_CACHE_HOME/qforge/latency.json, else
// $HOME/.cache/qforge/latency.json (empty when none of them is set).
std::string default_latency_cache_path();

// Measured latencies (milliseconds) by key, loaded from and saved to one JSON file.
class LatencyCache {
 public:
  // Loads `path` when it exists. A file that is not a qforge latency cache is a qforge::Error
  // naming it (it is never overwritten silently).
  explicit LatencyCache(std::string path);
  std::optional<double> find(const std::string& key) const;
  void put(const std::string& key, double ms);
  // Writes the file atomically when something was added (creating its directory); no-op
  // without a path. A symbolic link is written through: its target is replaced, the link kept.
  // Returns "" or why the file could not be written (a cache is worth a warning, never a run).
  std::string save() const;
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::map<std::string, double> entries_;
  bool dirty_ = false;
  mutable int64_t hits_ = 0, misses_ = 0;
};

// "cpu|threads|isa|layer type|weight shape|input shape:dtype|candidate|kernel".
std::string latency_key(const QuantizableLayer& frozen_or_float, const std::vector<int64_t>& weight_shape,
                        const QuantizableLayer::InputRecord& input, const std::string& candidate);

// A random input of the recorded shape and dtype; integer inputs are indices in [0, index_limit).
at::Tensor synthetic_input(const QuantizableLayer::InputRecord& input, int64_t index_limit);

// Whether time_forward_ms can run the layer (Linear, Conv1d/2d, Embedding: one input).
bool timeable(const QuantizableLayer& layer);

// Median wall time (ms) of `fn` over options.repeats calls after one warm-up call; with `cold`,
// each timed call follows an eviction of the last-level cache.
double time_ms(const std::function<void()>& fn, const LatencyOptions& options);

// Median wall time (ms) of layer.module() forward on `input`, without autograd, after one
// warm-up call; with `cold`, each timed call follows an eviction of the last-level cache.
double time_forward_ms(QuantizableLayer& layer, const at::Tensor& input, const LatencyOptions& options);

}  // namespace qforge::search
