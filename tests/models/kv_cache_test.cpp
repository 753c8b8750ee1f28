// models::KvCache: appends in place into preallocated stores, growth by doubling at the capacity
// boundary (contents equal to concatenation), deep copies, mismatched appends refused.
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

}  // namespace
}  // namespace qforge::models
