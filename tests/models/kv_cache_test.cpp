// models::KvCache: appends in place into preallocated stores, growth by doubling at the capacity
// boundary (contents equal to concatenation), deep copies, truncation to a prefix without a copy,
// foreign views adopted by a copy, the autograd path, mismatched appends refused.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "framework/core/error.h"
#include "framework/models/kv_cache.h"

namespace qforge::models {
namespace {

TEST(KvCache, GrowsByDoublingAtTheCapacityBoundaryAndKeepsItsPositions) {
  at::manual_seed(1);
  KvCache cache;
  cache.reserve(4);
  std::vector<at::Tensor> ks, vs;
  auto step = [&](int64_t T) {
    ks.push_back(at::randn({2, 3, T, 5})), vs.push_back(at::randn({2, 3, T, 5}));
    cache.append(1, ks.back(), vs.back());
  };
  step(3);
  EXPECT_EQ(cache.capacity(1), 4);
  EXPECT_EQ(cache.capacity(0), 0) << "layer 0 was never appended to";
  const void* store = cache.keys[1].data_ptr();
  step(1);  // exactly full: no growth
  EXPECT_EQ(cache.capacity(1), 4);
  EXPECT_EQ(cache.keys[1].data_ptr(), store) << "an append that fits writes in place";
  step(1);  // one past the boundary: doubles
  EXPECT_EQ(cache.capacity(1), 8);
  step(4);
  EXPECT_EQ(cache.capacity(1), 16);
  step(40);  // more than twice the capacity: grows to what is needed
  EXPECT_EQ(cache.capacity(1), 49);
  EXPECT_TRUE(at::equal(cache.keys[1], at::cat(ks, 2)));
  EXPECT_TRUE(at::equal(cache.values[1], at::cat(vs, 2)));
  EXPECT_EQ(cache.bytes(), 2 * 2 * 3 * 49 * 5 * 4);
  EXPECT_THROW(cache.append(1, at::randn({2, 4, 1, 5}), at::randn({2, 4, 1, 5})), Error) << "wrong kv_heads";
  EXPECT_THROW(cache.append(1, at::randn({2, 3, 1, 5}), at::randn({2, 3, 2, 5})), Error) << "keys != values";
}

TEST(KvCache, CopiesAreDeepSoTwoDecodesFromOnePrefillDoNotMix) {
  KvCache prefilled;
  prefilled.append(0, at::ones({1, 1, 2, 4}), at::ones({1, 1, 2, 4}));
  KvCache a = prefilled, b = prefilled;
  a.append(0, at::full({1, 1, 1, 4}, 2.0), at::full({1, 1, 1, 4}, 2.0));
  b.append(0, at::full({1, 1, 1, 4}, 3.0), at::full({1, 1, 1, 4}, 3.0));
  EXPECT_EQ(a.keys[0][0][0][2][0].item<float>(), 2.0f);
  EXPECT_EQ(b.keys[0][0][0][2][0].item<float>(), 3.0f);
  EXPECT_EQ(prefilled.length(), 2);
  // A view assigned from outside is adopted (copied into a store) on the next append.
  KvCache c;
  c.keys = {at::ones({1, 1, 2, 4})}, c.values = {at::ones({1, 1, 2, 4})};
  c.append(0, at::zeros({1, 1, 1, 4}), at::zeros({1, 1, 1, 4}));
  EXPECT_EQ(c.length(), 3);
  EXPECT_EQ(c.keys[0].sum().item<float>(), 8.0f);
}

TEST(KvCache, TruncateKeepsAPrefixViewAndTheNextAppendWritesInPlace) {
  KvCache cache;
  cache.reserve(8);
  const at::Tensor k = at::randn({1, 2, 4, 3}), v = at::randn({1, 2, 4, 3});
  cache.append(0, k, v);
  cache.append(1, k, v);
  const void* store = cache.keys[0].data_ptr();
  cache.truncate(2);
  EXPECT_EQ(cache.length(), 2);
  EXPECT_EQ(cache.keys[1].size(2), 2);
  EXPECT_EQ(cache.bytes(), 2 * 2 * 1 * 2 * 2 * 3 * 4);
  EXPECT_EQ(cache.capacity_bytes(), 2 * 2 * 1 * 2 * 8 * 3 * 4) << "truncation keeps the stores";
  const at::Tensor x = at::full({1, 2, 1, 3}, 7.0);
  cache.append(0, x, x);
  EXPECT_EQ(cache.keys[0].data_ptr(), store) << "no copy after a truncation";
  EXPECT_EQ(cache.capacity(0), 8);
  EXPECT_TRUE(at::equal(cache.keys[0], at::cat({k.narrow(2, 0, 2), x}, 2)));
  EXPECT_TRUE(at::equal(cache.values[0], at::cat({v.narrow(2, 0, 2), x}, 2)));
  EXPECT_THROW(cache.truncate(4), Error) << "layer 0 holds 3 positions";
  EXPECT_THROW(cache.truncate(-1), Error);
  cache.truncate(0);
  EXPECT_EQ(cache.length(), 0);
}

TEST(KvCache, OnlyAPrefixViewOfTheStoreIsWrittenAfterInPlace) {
  KvCache cache;
  cache.reserve(8);
  const at::Tensor k = at::randn({1, 1, 3, 4});
  cache.append(0, k, k);
  // Same storage, but positions 1..2: appending in place would write after position 2 of the store.
  cache.keys[0] = cache.keys[0].narrow(2, 1, 2), cache.values[0] = cache.values[0].narrow(2, 1, 2);
  const at::Tensor x = at::zeros({1, 1, 1, 4});
  cache.append(0, x, x);
  EXPECT_TRUE(at::equal(cache.keys[0], at::cat({k.narrow(2, 1, 2), x}, 2)));
  EXPECT_TRUE(at::equal(cache.values[0], at::cat({k.narrow(2, 1, 2), x}, 2)));
  EXPECT_THROW(cache.append(0, x.to(at::kDouble), x.to(at::kDouble)), Error) << "dtype differs from the cached";
  EXPECT_THROW(cache.append(0, x, x.to(at::kDouble)), Error) << "keys and values differ in dtype";
}

TEST(KvCache, AutogradConcatenatesKeepsEarlierViewsAndSwitchesBackToAStore) {
  KvCache cache;
  const at::Tensor a = at::randn({1, 1, 2, 4});
  cache.append(0, a, a);  // no grad: into a store
  const at::Tensor k = at::randn({1, 1, 1, 4}).requires_grad_(), v = at::randn({1, 1, 1, 4}).requires_grad_();
  cache.append(0, k, v);  // grad: concatenated
  const at::Tensor keys1 = cache.keys[0], values1 = cache.values[0];
  const at::Tensor k2 = at::randn({1, 1, 1, 4}).requires_grad_();
  cache.append(0, k2, k2);
  EXPECT_EQ(cache.capacity(0), 0) << "the autograd path holds no store";
  (cache.keys[0] * 2 + cache.values[0] * 3).sum().backward();
  EXPECT_TRUE(at::allclose(k.grad(), at::full_like(k, 2.0)));
  EXPECT_TRUE(at::allclose(v.grad(), at::full_like(v, 3.0)));
  EXPECT_TRUE(at::allclose(k2.grad(), at::full_like(k2, 5.0)));
  EXPECT_TRUE(at::equal(keys1, at::cat({a, k.detach()}, 2))) << "an earlier view is unchanged";
  {
    at::NoGradGuard g;
    const at::Tensor x = at::zeros({1, 1, 1, 4});
    cache.append(0, x, x);  // back to a store, adopting the concatenation by a copy
    EXPECT_GT(cache.capacity(0), 0);
    EXPECT_TRUE(at::equal(cache.keys[0], at::cat({a, k.detach(), k2.detach(), x}, 2)));
  }
  EXPECT_TRUE(at::equal(keys1, at::cat({a, k.detach()}, 2)));
  EXPECT_TRUE(at::equal(values1, at::cat({a, v.detach()}, 2)));
}

}  // namespace
}  // namespace qforge::models
