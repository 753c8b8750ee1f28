// The preallocated key/value stores of a decoding cache (kv_cache.h).
#include "framework/models/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "framework/core/error.h"

namespace qforge::models {

namespace {

constexpr const char* kKvCache = "models/kv_cache";

// Whether `cached` is the first positions of `store`: a view append may write after in place.
bool is_prefix_of(const at::Tensor& cached, const at::Tensor& store) {
  if (!store.defined() || !cached.defined() || cached.dim() != 4 || cached.data_ptr() != store.data_ptr()) return false;
  for (int64_t d : {0, 1, 3})
    if (cached.size(d) != store.size(d)) return false;
  return cached.size(2) <= store.size(2) && cached.strides() == store.strides();
}

// store[:, :, past : past + T] = x. A float CPU x of a few positions (a decode step) is copied row by
// row from wherever it lies (GPT-2's keys are a strided view of its fused projection): the same
// floats as copy_, without its dispatch and iterator set-up.
void write_positions(const at::Tensor& store, int64_t past, const at::Tensor& x) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  if (T > 4 || x.scalar_type() != at::kFloat || !x.device().is_cpu() || store.scalar_type() != at::kFloat ||
      x.stride(3) != 1 || !store.is_contiguous()) {
    store.narrow(2, past, T).copy_(x);
    return;
  }
  const float* src = x.data_ptr<float>();
  float* dst = store.data_ptr<float>();
  const int64_t cap = store.size(2);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(dst + ((b * H + h) * cap + past + t) * D, src + b * x.stride(0) + h * x.stride(1) + t * x.stride(2),
                    static_cast<size_t>(D) * sizeof(float));
}

// Appends `x` to one side of a layer: the store grows (doubling) when `x` does not fit.
at::Tensor append_side(at::Tensor& store, const at::Tensor& cached, const at::Tensor& x, int64_t reserve) {
  const int64_t past = cached.defined() ? cached.size(2) : 0, need = past + x.size(2);
  // A view assigned from outside (or a store a copy did not bring) is adopted by copying it once.
  const bool owned = is_prefix_of(cached, store);
  if (!owned || store.size(2) < need) {
    const int64_t grown = store.defined() && owned ? 2 * store.size(2) : reserve > 0 ? reserve : KvCache::kMinCapacity;
    store = new_kv_store(x, std::max(grown, need), cached, past);
  }
  write_positions(store, past, x);
  // store.narrow(2, 0, need) as one strided view (narrow dispatches slice, then as_strided).
  return store.as_strided({store.size(0), store.size(1), need, store.size(3)}, store.strides(), store.storage_offset());
}

}  // namespace

KvCache::KvCache(const KvCache& other) { *this = other; }

KvCache& KvCache::operator=(const KvCache& other) {
  if (this == &other) return *this;
  clear();
  reserve_ = other.reserve_;
  scheme_ = other.scheme_;
  attend_on_codes = other.attend_on_codes;
  dequantized_ = other.dequantized_;
  resize(std::max(other.keys.size(), other.quant_keys_.size()));  // keys is public: its size may differ
  for (size_t l = 0; l < other.quant_keys_.size(); ++l) {
    quant_keys_[l] = other.quant_keys_[l].clone();
    quant_values_[l] = other.quant_values_[l].clone();
  }
  for (size_t l = 0; l < other.keys.size(); ++l) {
    const at::Tensor& k = other.keys[l];
    if (!k.defined()) continue;
    const int64_t capacity = std::max(other.capacity(l), k.size(2));
    key_store_[l] = new_kv_store(k, capacity, k, k.size(2));
    value_store_[l] = new_kv_store(other.values[l], capacity, other.values[l], other.values[l].size(2));
    keys[l] = key_store_[l].narrow(2, 0, k.size(2));
    values[l] = value_store_[l].narrow(2, 0, k.size(2));
  }
  return *this;
}

void KvCache::resize(size_t layers) {
  for (auto* v : {&keys, &values, &key_store_, &value_store_}) v->resize(layers);
  quant_keys_.resize(layers), quant_values_.resize(layers);
}

void KvCache::clear() {
  keys.clear(), values.clear(), key_store_.clear(), value_store_.clear();
  quant_keys_.clear(), quant_values_.clear();
  dequantized_ = 0;
}

int64_t KvCache::length() const {
  if (scheme_.quantized()) return quant_keys_.empty() ? 0 : quant_keys_[0].length();
  return keys.empty() || !keys[0].defined() ? 0 : keys[0].size(2);
}

void KvCache::set_scheme(const KvCacheScheme& scheme) {
  if (scheme == scheme_) return;
  QF_REQUIRE(length() == 0, kKvCache, ": the cache holds ", length(), " positions as ", scheme_.to_string(),
             "; it cannot switch to ", scheme.to_string(), " (truncate(0) or clear() first)");
  const size_t layers = keys.size();
  clear();
  resize(layers);
  scheme_ = scheme;
}

int64_t KvCache::capacity(size_t layer) const {
  if (scheme_.quantized()) return layer < quant_keys_.size() ? quant_keys_[layer].capacity() : 0;
  return layer < key_store_.size() && key_store_[layer].defined() ? key_store_[layer].size(2) : 0;
}

std::pair<at::Tensor, at::Tensor> KvCache::append(size_t layer, const at::Tensor& k, const at::Tensor& v) {
  resize(std::max(keys.size(), layer + 1));  // also sizes the stores of views assigned from outside
  if (scheme_.quantized()) return append_quantized(layer, k, v, true);
  QF_REQUIRE(k.dim() == 4 && v.sizes() == k.sizes(), kKvCache, ": keys ", k.sizes(), " and values ", v.sizes(),
             " must be the same [batch, kv_heads, T, head_dim]");
  const at::Tensor past = keys[layer];  // a handle: keys[layer] is reassigned below
  QF_REQUIRE(!past.defined() || (past.size(0) == k.size(0) && past.size(1) == k.size(1) && past.size(3) == k.size(3) &&
                                 values[layer].defined() && values[layer].sizes() == past.sizes()),
             kKvCache, ": cached keys ", past.defined() ? past.sizes() : at::IntArrayRef{}, " do not match new keys ",
             k.sizes());
  QF_REQUIRE(v.scalar_type() == k.scalar_type() && v.device() == k.device() &&
                 (!past.defined() || (past.scalar_type() == k.scalar_type() && past.device() == k.device())),
             kKvCache, ": keys ", k.scalar_type(), " on ", k.device(), ", values ", v.scalar_type(), " on ", v.device(),
             " and the cached ", past.defined() ? past.scalar_type() : k.scalar_type(), " on ",
             past.defined() ? past.device() : k.device(), " must share dtype and device");
  if (at::GradMode::is_enabled() && (k.requires_grad() || v.requires_grad() || (past.defined() && past.requires_grad()))) {
    // Autograd saves the cached views; writing into their store would break its backward.
    keys[layer] = past.defined() ? at::cat({past, k}, 2) : k;
    values[layer] = past.defined() ? at::cat({values[layer], v}, 2) : v;
    key_store_[layer] = value_store_[layer] = at::Tensor();
    return {keys[layer], values[layer]};
  }
  keys[layer] = append_side(key_store_[layer], past, k, reserve_);
  values[layer] = append_side(value_store_[layer], values[layer], v, reserve_);
  return {keys[layer], values[layer]};
}

void KvCache::append_codes(size_t layer, const at::Tensor& k, const at::Tensor& v) {
  QF_REQUIRE(scheme_.quantized(), kKvCache, ": append_codes needs a quantized cache; this one is float");
  resize(std::max(keys.size(), layer + 1));
  append_quantized(layer, k, v, false);
}

std::pair<at::Tensor, at::Tensor> KvCache::append_quantized(size_t layer, const at::Tensor& k, const at::Tensor& v,
                                                            bool dequantize) {
  QF_REQUIRE(k.dim() == 4 && v.sizes() == k.sizes() && v.scalar_type() == k.scalar_type() && v.device() == k.device(),
             kKvCache, ": keys ", k.sizes(), " ", k.scalar_type(), " and values ", v.sizes(), " ", v.scalar_type(),
             " must be the same [batch, kv_heads, T, head_dim], dtype and device");
  QF_REQUIRE(!at::GradMode::is_enabled() || !(k.requires_grad() || v.requires_grad()), kKvCache,
             ": a quantized cache (", scheme_.to_string(), ") stores integer codes, which carry no gradient; "
             "append under torch::NoGradGuard or use a float cache");
  const int64_t first = reserve_ > 0 ? reserve_ : kMinCapacity;
  const auto l = static_cast<int64_t>(layer);
  const KvSideScales *kf = kv_static_side(scheme_, l, false, kKvCache), *vf = kv_static_side(scheme_, l, true, kKvCache);
  if (!dequantize) {
    quant_keys_[layer].push(k, scheme_, first, kf);
    quant_values_[layer].push(v, scheme_, first, vf);
    return {};
  }
  at::Tensor ks = quant_keys_[layer].append(k, scheme_, first, kf), vs = quant_values_[layer].append(v, scheme_, first, vf);
  dequantized_ += ks.size(2) + vs.size(2);
  return {std::move(ks), std::move(vs)};
}

KvCodes KvCache::codes(size_t layer, bool values) const {
  const auto& side = values ? quant_values_ : quant_keys_;
  return layer < side.size() ? side[layer].codes() : KvCodes{};
}

void KvCache::truncate(int64_t n) {
  QF_REQUIRE(n >= 0 && n <= length(), kKvCache, ": cannot truncate ", length(), " cached positions to ", n);
  // Every store is checked before any changes, so a refused truncate leaves the cache whole.
  for (const auto* side : {&quant_keys_, &quant_values_})
    for (const KvQuantStore& s : *side)
      QF_REQUIRE(s.length() == 0 || n <= s.length(), kKvCache, ": cannot truncate a layer of ", s.length(),
                 " cached positions to ", n);
  for (auto* side : {&quant_keys_, &quant_values_})
    for (KvQuantStore& s : *side)
      if (s.length() > 0) s.truncate(n);
  for (auto* side : {&keys, &values})
    for (at::Tensor& t : *side)
      if (t.defined()) t = t.narrow(2, 0, n);  // a prefix view of its store (or of a concatenation)
}

int64_t KvCache::capacity_bytes() const {
  int64_t n = 0;
  for (const auto* side : {&quant_keys_, &quant_values_})
    for (const KvQuantStore& s : *side) n += s.capacity_bytes();
  for (size_t l = 0; l < keys.size(); ++l) {
    const at::Tensor& store = capacity(l) > 0 ? key_store_[l] : keys[l];
    if (store.defined()) n += 2 * store.numel() * static_cast<int64_t>(store.element_size());
  }
  return n;
}

int64_t KvCache::bytes() const {
  int64_t n = 0;
  for (const auto* side : {&quant_keys_, &quant_values_})
    for (const KvQuantStore& s : *side) n += s.bytes();
  for (const auto* side : {&keys, &values})
    for (const at::Tensor& t : *side)
      if (t.defined()) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

}  // namespace qforge::models
