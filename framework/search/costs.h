// Phases of the mixed-precision search that measure costs: the input each layer sees on
// calibration batch 0, and each layer's bytes and frozen latency per candidate, from a quantized
// and frozen float copy (the code freeze() and model_size() run). Internal to framework/search.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "framework/search/candidates.h"
#include "framework/search/latency.h"

namespace qforge::search {

// The input each layer with weights sees on calibration batch 0 (shapes for the latencies), and
// that batch's float loss.
struct CalibrationInputs {
  std::map<const QuantizableLayer*, at::Tensor> inputs;
  double loss0 = 0;
  at::Tensor of(const QuantizableLayer* layer) const;  // undefined when the forward never reached it
};

CalibrationInputs record_inputs(torch::nn::Module& model, const std::function<at::Tensor(int64_t)>& loss_of_batch);

// What one candidate costs a layer: its bytes after freeze() and its frozen forward's latency.
struct Priced {
  int64_t bytes = 0;
  double latency_ms = 0;
  std::string kernel;
};

// Prices copies of layers through one latency cache, counting the kernels it times.
class Pricer {
 public:
  Pricer(const LatencyOptions& options, int64_t* measured)
      : cache_(options.time_kernels ? options.cache_path : std::string()), options_(options), measured_(measured) {}
  // `ls` nullopt: the float layer. Static activation quantizers of the copy get scale 1 (bytes
  // and kernels do not depend on it). Latency 0 unless options.time_kernels.
  Priced price(const QuantizableLayer& layer, const std::string& path, const std::optional<LayerScheme>& ls,
               const std::string& candidate, const at::Tensor& input);
  LatencyCache& cache() { return cache_; }

 private:
  LatencyCache cache_;
  const LatencyOptions& options_;
  int64_t* measured_;
};

// What the layers the search leaves alone cost: their fixed quantizers' bytes (measured attached,
// then detached) and their frozen kernels' latency, quantized and all float.
struct FixedCosts {
  int64_t quantizer_bytes = 0;
  double latency_ms = 0;
  double float_latency_ms = 0;
};

// `priced` is called after each layer (the search's progress bar).
FixedCosts price_fixed(const std::vector<std::pair<std::string, QuantizableLayer*>>& fixed, const Scheme& base,
                       const CalibrationInputs& inputs, Pricer& pricer, const std::function<void()>& priced = {});

}  // namespace qforge::search
