// qbench's rpq_embedding_lookup rows (apps/qbench_rpq.cpp): the regime each row times is in its
// shape, and the fresh-ids row really looks up new ids every call (issue 39 item 25).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "apps/qbench_ids.h"
#include "apps/qbench_registry.h"

namespace qforge::bench {

// This test's registry: apps/qbench_rpq.cpp, compiled in, registers its benches here.
std::vector<Bench>& registry() {
  static std::vector<Bench> benches;
  return benches;
}

namespace {

TEST(QbenchRpq, Item25EmbeddingRowsNameTheirRegimeAndFreshIdsChangeEveryCall) {
  const Bench* bench = nullptr;
  for (const Bench& b : registry())
    if (b.name == "rpq_embedding_lookup") bench = &b;
  ASSERT_NE(bench, nullptr);
  std::vector<std::string> shapes;
  for (const Case& c : bench->make_cases()) {
    shapes.push_back(c.shape);
    for (const Impl& i : c.impls) i.run(), i.run();  // each impl runs call after call
  }
  EXPECT_EQ(shapes, (std::vector<std::string>{"32_fresh_ids_50257x768", "32_same_ids_hot"}));
  IdBatches fresh = embedding_ids(true);
  const at::Tensor a = fresh.next(), b = fresh.next();
  EXPECT_EQ(a.sizes(), at::IntArrayRef({kEmbeddingIds}));
  EXPECT_FALSE(at::equal(a, b)) << "two calls of the fresh case look up the same ids";
  EXPECT_GE(at::min(at::cat({a, b})).item<int64_t>(), 0);
  EXPECT_LT(at::max(at::cat({a, b})).item<int64_t>(), kEmbeddingVocab);
  IdBatches hot = embedding_ids(false);
  const at::Tensor h = hot.next();
  EXPECT_TRUE(at::equal(h, hot.next())) << "the cache-hot case repeats one batch of ids";
}

}  // namespace
}  // namespace qforge::bench
