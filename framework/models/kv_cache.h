// Keys and values of the positions a decoder has already seen, one pair per layer, for
// token-by-token decoding (GPT-2, Llama): each forward with a cache attends to the cached positions
// plus its own, then appends its keys and values. Tensors are [B, kv_heads, T_past, head_dim].
// Each layer's positions live in a preallocated store [B, kv_heads, capacity, head_dim] that a
// forward appends into in place (no concatenation per token); keys / values are views of its
// first T_past positions. A full store grows to twice its capacity (one copy). Copies of a cache
// are deep, so two decodes started from one prefilled cache never write into each other.
// A quantized scheme (kv_quant.h) keeps integer codes and scales instead of floats: keys / values
// then stay empty, and append() returns the dequantized positions attention reads (or, at decode
// sizes, attention reads the codes themselves: append_codes()).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "framework/api/kv_cache_scheme.h"
#include "framework/models/kv_quant.h"

namespace qforge::models {

struct KvCache {
  // Positions a store holds when the first append does not say more (reserve() overrides it).
  static constexpr int64_t kMinCapacity = 64;

  std::vector<at::Tensor> keys, values;

  KvCache() = default;
  KvCache(const KvCache& other);
  KvCache& operator=(const KvCache& other);
  KvCache(KvCache&&) = default;
  KvCache& operator=(KvCache&&) = default;

  int64_t length() const;
  void clear();
  // Float (the default) or quantized stores; switching needs an empty cache (length() 0), and
  // drops the stores. The models set their scheme (LlamaConfig / Gpt2Config kv_cache) on every forward.
  void set_scheme(const KvCacheScheme& scheme);
  const KvCacheScheme& scheme() const { return scheme_; }
  // Sizes the cache for `layers` layers (the models call it; existing layers keep their positions).
  void resize(size_t layers);
  // Positions the first store of each layer holds (a generation knows prompt + new tokens).
  void reserve(int64_t positions) { reserve_ = positions; }
  // Positions layer `layer`'s store holds before it grows (0 before its first append).
  int64_t capacity(size_t layer) const;
  // Appends k and v ([B, kv_heads, T, head_dim], same dtype and device as the cached ones) after
  // layer `layer`'s cached positions and returns the keys and values of all of them: float, the
  // views keys / values also hold; quantized, their dequantized values (kv_quant.h).
  // Under autograd with tensors that require grad a float cache concatenates instead (no store);
  // a quantized one refuses them (its codes carry no gradient).
  std::pair<at::Tensor, at::Tensor> append(size_t layer, const at::Tensor& k, const at::Tensor& v);
  // A quantized cache only: appends k and v as codes without dequantizing any position, for
  // attention on the codes (models::fused_decode_attention_on_codes reads codes(layer, ...)).
  void append_codes(size_t layer, const at::Tensor& k, const at::Tensor& v);
  // Whether the models' decode-size forwards attend on a quantized cache's codes where the kernel
  // takes them (true, the default), or dequantize every cached position through append() for the
  // float attention (false: what qforge did before the codes kernel; for comparisons).
  bool attend_on_codes = true;
  // Cached positions dequantized for attention so far, keys and values of every layer counted
  // (append() on a quantized cache; 0 while every call attended on the codes). clear() resets it.
  int64_t dequantized_positions() const { return dequantized_; }
  // The codes, scales and zero points of layer `layer`'s cached keys (or values), views of its
  // stores; empty for a float cache or a layer not appended to.
  KvCodes codes(size_t layer, bool values) const;
  // Keeps the first n cached positions of every layer (views of the same stores, no copy), so a
  // decode restarts from a prefilled prefix without copying the cache. Requires n <= length().
  void truncate(int64_t n);
  // Bytes held by the cached keys and values (the filled positions, not the spare capacity):
  // quantized, their codes, scales and zero points.
  int64_t bytes() const;
  // Bytes the stores hold, spare capacity included (what the cache occupies in memory).
  int64_t capacity_bytes() const;

 private:
  std::pair<at::Tensor, at::Tensor> append_quantized(size_t layer, const at::Tensor& k, const at::Tensor& v,
                                                     bool dequantize);
  std::vector<at::Tensor> key_store_, value_store_;
  std::vector<KvQuantStore> quant_keys_, quant_values_;  // quantized schemes only
  KvCacheScheme scheme_;
  int64_t reserve_ = 0;
  int64_t dequantized_ = 0;
};

}  // namespace qforge::models
