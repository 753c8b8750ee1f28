// The preallocated key/value stores of a decoding cache (kv_cache.h).
#include "framework/models/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "framework/core/error.h"

namespace qforge::models {

namespace {

constexpr const char* kKvCache = "models/kv_cache";

// A store of `capacity` positions holding `cached` (when defined) in its first positions.
at::Tensor new_store(const at::Tensor& like, int64_t capacity, const at::Tensor& cached) {
  at::Tensor store = at::empty({like.size(0), like.size(1), capacity, like.size(3)}, like.options());
  if (cached.defined()) store.narrow(2, 0, cached.size(2)).copy_(cached);
  return store;
}

// Appends `x` to one side of a layer: the store grows (doubling) when `x` does not fit.
at::Tensor append_side(at::Tensor& store, const at::Tensor& cached, const at::Tensor& x, int64_t reserve) {
  const int64_t past = cached.defined() ? cached.size(2) : 0, need = past + x.size(2);
  // A view assigned from outside (or a store a copy did not bring) is adopted by copying it once.
  const bool owned = store.defined() && cached.defined() && cached.is_alias_of(store);
  if (!owned || store.size(2) < need) {
    const int64_t grown = store.defined() && owned ? 2 * store.size(2) : reserve > 0 ? reserve : KvCache::kMinCapacity;
    store = new_store(x, std::max(grown, need), cached);
  }
  store.narrow(2, past, x.size(2)).copy_(x);
  return store.narrow(2, 0, need);
}

}  // namespace

KvCache::KvCache(const KvCache& other) { *this = other; }

KvCache& KvCache::operator=(const KvCache& other) {
  if (this == &other) return *this;
  clear();
  reserve_ = other.reserve_;
  resize(other.keys.size());
  for (size_t l = 0; l < other.keys.size(); ++l) {
    const at::Tensor& k = other.keys[l];
    if (!k.defined()) continue;
    const int64_t capacity = std::max(other.capacity(l), k.size(2));
    key_store_[l] = new_store(k, capacity, k);
    value_store_[l] = new_store(other.values[l], capacity, other.values[l]);
    keys[l] = key_store_[l].narrow(2, 0, k.size(2));
    values[l] = value_store_[l].narrow(2, 0, k.size(2));
  }
  return *this;
}

void KvCache::resize(size_t layers) {
  for (auto* v : {&keys, &values, &key_store_, &value_store_}) v->resize(layers);
}

int64_t KvCache::capacity(size_t layer) const {
  return layer < key_store_.size() && key_store_[layer].defined() ? key_store_[layer].size(2) : 0;
}

void KvCache::append(size_t layer, const at::Tensor& k, const at::Tensor& v) {
  resize(std::max(keys.size(), layer + 1));  // also sizes the stores of views assigned from outside
  QF_REQUIRE(k.dim() == 4 && v.sizes() == k.sizes(), kKvCache, ": keys ", k.sizes(), " and values ", v.sizes(),
             " must be the same [batch, kv_heads, T, head_dim]");
  const at::Tensor past = keys[layer];  // a handle: keys[layer] is reassigned below
  QF_REQUIRE(!past.defined() || (past.size(0) == k.size(0) && past.size(1) == k.size(1) && past.size(3) == k.size(3) &&
                                 values[layer].defined() && values[layer].sizes() == past.sizes()),
             kKvCache, ": cached keys ", past.defined() ? past.sizes() : at::IntArrayRef{}, " do not match new keys ",
             k.sizes());
  if (at::GradMode::is_enabled() && (k.requires_grad() || v.requires_grad() || (past.defined() && past.requires_grad()))) {
    // Autograd saves the cached views; writing into their store would break its backward.
    keys[layer] = past.defined() ? at::cat({past, k}, 2) : k;
    values[layer] = past.defined() ? at::cat({values[layer], v}, 2) : v;
    key_store_[layer] = value_store_[layer] = at::Tensor();
    return;
  }
  keys[layer] = append_side(key_store_[layer], past, k, reserve_);
  values[layer] = append_side(value_store_[layer], values[layer], v, reserve_);
}

int64_t KvCache::bytes() const {
  int64_t n = 0;
  for (const auto* side : {&keys, &values})
    for (const at::Tensor& t : *side)
      if (t.defined()) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

}  // namespace qforge::models
