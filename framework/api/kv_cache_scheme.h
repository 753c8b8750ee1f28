// How a decoder keeps the keys and values of its KV cache: float (the default) or integer codes
// with one scale (and zero point when asymmetric) per token, key/value head and group of head_dim
// (docs/kv_cache.md). The models that own a cache (GPT-2, Llama) derive from KvCacheModel, so
// quantize-time code and describe() reach the setting without knowing the model family.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "framework/core/qparams.h"
#include "framework/core/qtype.h"

namespace qforge {

struct KvCacheScheme {
  std::optional<QType> qtype;  // qint8 or qint4; none: a float cache
  bool symmetric = true;       // zero point 0; asymmetric stores one int8 zero point per scale
  int64_t group_size = 0;      // head_dim elements per scale; 0: the whole head_dim

  bool quantized() const { return qtype.has_value(); }
  // Elements per scale for heads of head_dim elements (group_size, or head_dim when 0).
  int64_t group(int64_t head_dim) const { return group_size > 0 ? group_size : head_dim; }
  // The per-group QSpec of one [..., head_dim] tensor (quantized schemes only).
  QSpec spec(int64_t head_dim) const;
  // Throws qforge::Error unless the qtype is qint8 / qint4 and the group divides head_dim (and,
  // for qint4, has an even size so a group's codes fill whole bytes). `who` prefixes the message.
  void validate(int64_t head_dim, const std::string& who) const;
  // Bytes one cached position takes per key/value head and side (codes, scales, zero points);
  // float caches: head_dim * float_bytes.
  int64_t bytes_per_head(int64_t head_dim, int64_t float_bytes) const;
  // "float", or e.g. "qint4 asymmetric per token and head, groups of 32".
  std::string to_string() const;
  friend bool operator==(const KvCacheScheme& a, const KvCacheScheme& b) {
    return a.qtype.has_value() == b.qtype.has_value() && (!a.qtype || *a.qtype == *b.qtype) &&
           (!a.qtype || (a.symmetric == b.symmetric && a.group_size == b.group_size));
  }
  friend bool operator!=(const KvCacheScheme& a, const KvCacheScheme& b) { return !(a == b); }
};

// A scheme as JSON, {"qtype": "qint8" | "qint4", "symmetric": bool, "group_size": int}, null for
// float: config.json's "qforge_kv_cache" and a checkpoint's /model attribute "kv_cache", both
// written only for a quantized cache (a file without them: float).
nlohmann::json kv_cache_scheme_json(const KvCacheScheme& scheme);
// Unknown keys and wrong types are refused, naming `who` and the key.
KvCacheScheme kv_cache_scheme_from_json(const nlohmann::json& j, const char* who);

// The qtypes a KV cache takes ("qint8", "qint4") and the recipe's names for them ("int8", "int4").
std::vector<std::string> kv_cache_qtype_names();
// An unknown name is refused, naming `who` (the file or key it came from).
QType kv_cache_qtype_from_name(const std::string& name, const char* who = "kv_cache");

// A decoder whose attention keeps a KV cache (GPT-2, Llama): its cache scheme is set here once
// for every attention layer, and reported per cached position.
class KvCacheModel {
 public:
  virtual ~KvCacheModel() = default;
  virtual const KvCacheScheme& kv_cache_scheme() const = 0;
  // The elements of one cached key or value head (what a scheme's groups divide).
  virtual int64_t kv_cache_head_dim() const = 0;
  // Validates against the model's head_dim, then sets every attention layer's scheme.
  virtual void set_kv_cache_scheme(const KvCacheScheme& scheme) = 0;
  // Bytes one position takes in a cache of `scheme` over all layers, keys and values (float32
  // when float).
  virtual int64_t kv_cache_bytes_per_token(const KvCacheScheme& scheme) const = 0;
};

// The cache-keeping modules of `model` (itself included), by module path ("" for the root).
std::vector<std::pair<std::string, KvCacheModel*>> kv_cache_models(torch::nn::Module& model);
std::vector<std::pair<std::string, const KvCacheModel*>> kv_cache_models(const torch::nn::Module& model);
// Sets `scheme` on every cache-keeping module of `model` and returns how many there were.
int set_kv_cache_scheme(torch::nn::Module& model, const KvCacheScheme& scheme);
// describe()'s line for a model with a quantized cache: "KvCacheQuant: <scheme>, N bytes per
// cached token (float32: M)" per cache-keeping module; empty for float caches.
std::string describe_kv_cache(const torch::nn::Module& model);

}  // namespace qforge
