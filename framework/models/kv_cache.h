// Keys and values of the positions a decoder has already seen, one pair per layer, for
// token-by-token decoding (GPT-2, Llama): each forward with a cache attends to the cached positions
// plus its own, then appends its keys and values. Tensors are [B, kv_heads, T_past, head_dim].
// Each layer's positions live in a preallocated store [B, kv_heads, capacity, head_dim] that a
// forward appends into in place (no concatenation per token); keys / values are views of its
// first T_past positions. A full store grows to twice its capacity (one copy). Copies of a cache
// are deep, so two decodes started from one prefilled cache never write into each other.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

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

  int64_t length() const { return keys.empty() || !keys[0].defined() ? 0 : keys[0].size(2); }
  void clear() { keys.clear(), values.clear(), key_store_.clear(), value_store_.clear(); }
  // Sizes the cache for `layers` layers (the models call it; existing layers keep their positions).
  void resize(size_t layers);
  // Positions the first store of each layer holds (a generation knows prompt + new tokens).
  void reserve(int64_t positions) { reserve_ = positions; }
  // Positions layer `layer`'s store holds before it grows (0 before its first append).
  int64_t capacity(size_t layer) const;
  // Appends k and v ([B, kv_heads, T, head_dim], same dtype and device as the cached ones) after
  // layer `layer`'s cached positions and returns through keys / values the views of all of them.
  // Under autograd with tensors that require grad it concatenates instead (no store).
  void append(size_t layer, const at::Tensor& k, const at::Tensor& v);
  // Keeps the first n cached positions of every layer (views of the same stores, no copy), so a
  // decode restarts from a prefilled prefix without copying the cache. Requires n <= length().
  void truncate(int64_t n);
  // Bytes held by the cached keys and values (the filled positions, not the spare capacity).
  int64_t bytes() const;
  // Bytes the stores hold, spare capacity included (what the cache occupies in memory).
  int64_t capacity_bytes() const;

 private:
  std::vector<at::Tensor> key_store_, value_store_;
  int64_t reserve_ = 0;
};

}  // namespace qforge::models
