// Phase 1 of the mixed-precision search: the searched layers and the candidates each may take.
#include "framework/search/candidates.h"

#include "framework/core/enum_names.h"
#include "framework/core/error.h"
#include "framework/api/quantize.h"

namespace qforge::search {

namespace {

// What the layer is asked to do under `base` with candidate `c` in force for it.
std::optional<LayerScheme> scheme_with(const Scheme& base, const std::string& path, const QuantizableLayer& layer,
                                       const Candidate& c, std::string* note) {
  Scheme s = base;
  s.rules.insert(s.rules.begin(), rule_for(base, path, c));
  int rule = -1;
  return s.resolve(path, layer, &rule, note);
}

// Why `layer` cannot take `cand` with scheme `cls`, or an empty string when it can.
std::string refusal(const std::string& path, QuantizableLayer& layer, const Candidate& cand,
                    const std::optional<LayerScheme>& cls, const std::string& note) {
  if (cls && cand.qtype && cls->weights && cls->weights->spec.granularity != cand.granularity) {
    // The scheme would quietly give this layer another grid (e.g. per_channel for a group
    // size that does not divide it): the candidate is not what it says here.
    return cand.name() + " on " + path + ": " + note;
  }
  if (cls && cand.activations && cls->activations != *cand.activations) {
    // e.g. static inputs for an Embedding (its input is indices): not what the name says.
    return cand.name() + " on " + path + ": the layer takes " + qforge::to_string(cls->activations) +
           " activations here";
  }
  if (cls) {
    try {
      layer.check_scheme(*cls);
    } catch (const Error& e) {
      return cand.name() + " on " + path + ": " + e.what();
    }
  }
  return {};
}

bool allowed_by_min_bits(const SearchOptions& o, const std::string& path, const Candidate& cand) {
  for (const MinBits& m : o.min_bits)
    if (pattern_matches(m.pattern, path) && cand.bits() < m.bits) return false;
  return true;
}

// A candidate no searched layer took: the error names it (and its index, for the recipe line).
[[noreturn]] void throw_unused(const SearchOptions& o, size_t c, const std::vector<std::string>& refusals) {
  std::string why;
  for (const std::string& r : refusals)
    if (r.rfind(o.candidates[c].name() + " on ", 0) == 0) why = r;
  throw SearchError("candidate '" + o.candidates[c].name() + "' fits no searched layer" +
                        (why.empty() ? std::string(" (min_bits excludes it everywhere)") : " (e.g. " + why + ")"),
                    static_cast<int>(c));
}

}  // namespace

LayerRule rule_for(const Scheme& base, const std::string& path, const Candidate& c) {
  LayerRule r;
  for (const LayerRule& b : base.rules)
    if (pattern_matches(b.pattern, path)) {
      r = b;
      break;
    }
  r.pattern = path;
  r.keep_float = false;
  r.weights.reset();
  r.weight_granularity.reset();
  r.group_size.reset();
  if (!c.qtype) {
    r.keep_float = true;
    return r;
  }
  r.weights = *c.qtype;
  r.weight_granularity = c.granularity;
  if (c.granularity == Granularity::kPerGroup) r.group_size = c.group_size;
  if (c.activations) r.activations = *c.activations;
  return r;
}

at::Tensor float_weight_of(const QuantizableLayer& layer) {
  const auto params = layer.module().named_parameters(/*recurse=*/false);
  QF_CHECK(params.contains("weight"));
  return params["weight"];
}

Collected collect(torch::nn::Module& model, const Scheme& base, const SearchOptions& o) {
  Collected out;
  std::vector<bool> candidate_used(o.candidates.size(), false);
  std::vector<std::string> refusals;
  for (const auto& [path, layer] : quantizable_layers(model)) {
    if (layer->quantized())
      throw SearchError("search: '" + path + "' is quantized already; the search starts from the float model");
    int rule = -1;
    std::string note;
    const std::optional<LayerScheme> ls = base.resolve(path, *layer, &rule, &note);
    // Layers whose weights the scheme leaves float are not searched.
    if (!ls || !ls->weights || !layer->module().named_parameters(false).contains("weight")) {
      out.fixed.emplace_back(path, layer);
      continue;
    }
    Searched s{path, layer, {}, {}, layer->storage_bytes()};
    for (size_t c = 0; c < o.candidates.size(); ++c) {
      const Candidate& cand = o.candidates[c];
      if (!allowed_by_min_bits(o, path, cand)) continue;
      std::string cnote, why;
      std::optional<LayerScheme> cls;
      try {
        cls = scheme_with(base, path, *layer, cand, &cnote);
        why = refusal(path, *layer, cand, cls, cnote);
      } catch (const Error& e) {  // a grid the layer's shape cannot take (mxfp4 blocks of 32)
        why = cand.name() + " on " + path + ": " + e.what();
      }
      if (!why.empty()) {
        refusals.push_back(why);
        out.skipped.push_back(std::move(why));
        continue;
      }
      candidate_used[c] = true;
      s.cands.push_back(cand);
      s.schemes.push_back(cls);
    }
    if (s.cands.empty())
      throw SearchError("search: '" + path + "' can take none of the candidates (min_bits or its shape)");
    out.layers.push_back(std::move(s));
  }
  if (out.layers.empty()) throw SearchError("search: the scheme quantizes no layer's weights; nothing to search");
  for (size_t c = 0; c < o.candidates.size(); ++c)
    if (!candidate_used[c]) throw_unused(o, c, refusals);
  return out;
}

}  // namespace qforge::search
