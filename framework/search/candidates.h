// Phase 1 of the mixed-precision search: which layers are searched and which candidates each may
// take under the base scheme, min_bits and the layer's own check_scheme. Internal to
// framework/search (search.cpp, costs.cpp, sensitivity.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "framework/nn/quantizable.h"
#include "framework/search/search.h"

namespace qforge::search {

// A searched layer: its candidates and the scheme each puts in force for it (nullopt: float).
struct Searched {
  std::string path;
  QuantizableLayer* layer;
  std::vector<Candidate> cands;
  std::vector<std::optional<LayerScheme>> schemes;
  int64_t float_bytes;
};

struct Collected {
  std::vector<Searched> layers;
  std::vector<std::pair<std::string, QuantizableLayer*>> fixed;  // quantizable, not searched
  std::vector<std::string> skipped;  // "<candidate> on <path>: why"
};

// The searched layers and the candidates each may take; throws SearchError when a layer can take
// none or a candidate fits no layer.
Collected collect(torch::nn::Module& model, const Scheme& base, const SearchOptions& options);

// The rule that gives `path` candidate `c`: the recipe's own first rule for the path (so its
// other settings, e.g. activations, still apply) with the exact path as pattern and the
// candidate's weights.
LayerRule rule_for(const Scheme& base, const std::string& path, const Candidate& c);

// The float weight parameter of a layer that has one.
at::Tensor float_weight_of(const QuantizableLayer& layer);

// Quantizers attached for a measurement, removed again on scope exit (also when it throws), so
// the model stays float.
class ScopedAttach {
 public:
  ScopedAttach(QuantizableLayer& layer, const std::string& path, const LayerScheme& scheme) : layer_(layer) {
    layer_.attach(path, scheme);
  }
  ~ScopedAttach() { layer_.detach(); }
  ScopedAttach(const ScopedAttach&) = delete;
  ScopedAttach& operator=(const ScopedAttach&) = delete;

 private:
  QuantizableLayer& layer_;
};

}  // namespace qforge::search
