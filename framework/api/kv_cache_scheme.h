// How a decoder keeps the keys and values of its KV cache: float (the default) or integer codes
// with one scale (and zero point when asymmetric) per token, key/value head and group of head_dim,
// computed per token when appended (dynamic) or calibrated once per layer, head and group (static,
// kv_static_scales.h) (docs/kv_cache.md). The models that own a cache (GPT-2, Llama) derive from
// KvCacheModel, so quantize-time code and describe() reach the setting without knowing the model family.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "framework/core/qparams.h"
#include "framework/core/qtype.h"

namespace qforge {

struct KvStaticScales;
class KvRangeObserver;

// Where a quantized cache's scales come from. Dynamic: each appended position's own values.
// Static: calibrated once (a Calibration's forwards) per layer, side (keys, values), key/value head
// and group (kStaticHead), or per layer and side over every head and group (kStaticTensor, one
// scale, as llm-compressor's kv_cache_scheme `strategy: tensor`); values beyond the calibrated
// range saturate.
enum class KvScales { kDynamic, kStaticHead, kStaticTensor };
// "dynamic", "static_head", "static_tensor": the recipe's and the files' names.
const char* kv_scales_name(KvScales s);
KvScales kv_scales_from_name(const std::string& name, const char* who);

struct KvCacheScheme {
  std::optional<QType> qtype;  // qint8 or qint4; none: a float cache
  bool symmetric = true;       // zero point 0; asymmetric stores one int8 zero point per scale
  int64_t group_size = 0;      // head_dim elements per scale; 0: the whole head_dim
  KvScales scales = KvScales::kDynamic;
  // The range a scale covers is min(x, 0) · clip_ratio .. max(x, 0) · clip_ratio (QuaRot clips its
  // cache at 0.95): values beyond it saturate, the rest get a finer step. 1: no clipping. In (0, 1].
  float clip_ratio = 1.0f;
  // Static schemes: the calibrated scales of every layer (null until a Calibration finishes; a
  // forward refuses an uncalibrated static scheme). Shared, immutable: copies of the scheme on
  // every attention layer hold the same object.
  std::shared_ptr<const KvStaticScales> calibrated;
  // Static schemes inside a Calibration: the observer the attention layers feed (they then attend
  // to the float keys and values). Null otherwise.
  std::shared_ptr<KvRangeObserver> observer;

  bool quantized() const { return qtype.has_value(); }
  bool is_static() const { return quantized() && scales != KvScales::kDynamic; }
  // Elements per scale for heads of head_dim elements (group_size, or head_dim when 0).
  int64_t group(int64_t head_dim) const { return group_size > 0 ? group_size : head_dim; }
  // The per-group QSpec of one [..., head_dim] tensor (quantized schemes only).
  QSpec spec(int64_t head_dim) const;
  // Throws qforge::Error unless the qtype is qint8 / qint4 and the group divides head_dim (and,
  // for qint4, has an even size so a group's codes fill whole bytes). `who` prefixes the message.
  void validate(int64_t head_dim, const std::string& who) const;
  // validate(), and calibrated static scales covering `layers` layers of `kv_heads` heads.
  void validate(int64_t layers, int64_t kv_heads, int64_t head_dim, const std::string& who) const;
  // Bytes one cached position takes per key/value head and side (codes, scales, zero points);
  // float caches: head_dim * float_bytes.
  int64_t bytes_per_head(int64_t head_dim, int64_t float_bytes) const;
  // "float", or e.g. "qint4 asymmetric per token and head, groups of 32", "qint8 symmetric static
  // per head (calibrated)" ("(calibrating)" inside a Calibration).
  std::string to_string() const;
  // The same grid, and for static schemes the same calibrated values (or both uncalibrated) and
  // the same observer.
  friend bool operator==(const KvCacheScheme& a, const KvCacheScheme& b);
  friend bool operator!=(const KvCacheScheme& a, const KvCacheScheme& b) { return !(a == b); }
};

// A scheme as JSON, {"qtype": "qint8" | "qint4", "symmetric": bool, "group_size": int} (static
// schemes add "scales": "static_head" | "static_tensor" and, once calibrated, "static_scales":
// kv_static_scales_json), null for float: config.json's "qforge_kv_cache" and a checkpoint's
// /model attribute "kv_cache", both written only for a quantized cache (a file without them: float).
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
  // The elements of one cached key or value head (what a scheme's groups divide), the key/value
  // heads of a layer and the attention layers (what static scales cover).
  virtual int64_t kv_cache_head_dim() const = 0;
  virtual int64_t kv_cache_heads() const = 0;
  virtual int64_t kv_cache_layers() const = 0;
  // Throws qforge::Error (prefixed by `who`) unless `scheme` fits the model: its groups divide
  // head_dim and calibrated static scales cover every layer, key/value head and group.
  void check_kv_cache_scheme(const KvCacheScheme& scheme, const std::string& who) const;
  // Checks (check_kv_cache_scheme), then sets every attention layer's scheme.
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
// Throws qforge::Error unless no cache-keeping module of `model` holds calibrated static scales:
// `who` (a transform that changes the keys or values it caches: ptq::rotate's per-head turns,
// AWQ's v_proj scales) would leave them measuring other values. Apply it first, then calibrate.
void require_no_calibrated_kv_scales(const torch::nn::Module& model, const std::string& who);
// describe()'s line for a model with a quantized cache: "KvCacheQuant: <scheme>, N bytes per
// cached token (float32: M)" per cache-keeping module; empty for float caches.
std::string describe_kv_cache(const torch::nn::Module& model);

}  // namespace qforge
