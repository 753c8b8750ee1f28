// The KV cache priced into the search's size budgets (SearchOptions::kv_cache_context): on a tiny
// Llama the cache's bytes at the stated context are the model's own per-token bytes times the
// context, the size budgets hold model + cache (size_ratio against the float model plus a float32
// cache), a budget the model meets alone forces smaller weights once the cache counts, and the
// errors name the cache: an unreachable budget, no size budget, a model without a cache.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <torch/nn/modules/container/sequential.h>

#include "framework/core/error.h"
#include "framework/models/llama.h"
#include "framework/nn/linear.h"
#include "framework/search/search.h"
#include "tests/models/kv_cache_test_models.h"

namespace qforge::search {
namespace {

struct TinyLlama {
  models::LlamaForCausalLM model;
  at::Tensor ids;
  std::function<at::Tensor(int64_t)> loss;
};

TinyLlama tiny_llama() {
  at::manual_seed(21);
  TinyLlama t{models::LlamaForCausalLM(models::kv_test_llama()), at::randint(0, 61, {2, 24}, at::kLong), {}};
  t.model->eval();
  t.loss = [m = t.model, ids = t.ids](int64_t) mutable {
    const at::Tensor logits = m->forward(ids.narrow(1, 0, 23));
    return at::cross_entropy_loss(logits.reshape({-1, 61}), ids.narrow(1, 1, 23).reshape({-1}));
  };
  return t;
}

SearchOptions options() {
  SearchOptions o;
  o.method = Method::kLoss;
  o.candidates = {Candidate{qint8, Granularity::kPerChannel, 0, std::nullopt},
                  Candidate{qint4, Granularity::kPerGroup, 16, std::nullopt},
                  Candidate{qint2, Granularity::kPerGroup, 16, std::nullopt}};
  o.latency.cache_path.clear();
  return o;
}

KvCacheScheme int8_cache() {
  KvCacheScheme s;
  s.qtype = qint8;
  return s;
}

TEST(SearchKvCache, TheCacheCountsInTheSizeBudgetAtTheStatedContext) {
  TinyLlama t = tiny_llama();
  const Scheme base(qint8);
  SearchOptions alone = options();
  alone.budget.size_ratio = 0.5;
  const SearchResult a = search(*t.model, base, 1, t.loss, alone);
  EXPECT_EQ(a.kv_cache_bytes, 0);
  // The same bytes as a size_mb budget, now with a cache of 50 positions to fit beside the model.
  SearchOptions with_cache = options();
  with_cache.budget.size_mb = static_cast<double>(a.bytes) / 1e6;
  with_cache.kv_cache_context = 50;
  with_cache.kv_cache = int8_cache();
  const SearchResult c = search(*t.model, base, 1, t.loss, with_cache);
  EXPECT_EQ(c.kv_cache_context, 50);
  EXPECT_EQ(c.kv_cache_bytes, 50 * t.model->kv_cache_bytes_per_token(int8_cache()));
  EXPECT_EQ(c.float_kv_cache_bytes, 50 * t.model->kv_cache_bytes_per_token(KvCacheScheme{}));
  EXPECT_EQ(c.kv_cache_bytes, 50 * 2 * 2 * 2 * (16 + 4));  // layers · sides · kv heads · (codes + scale)
  EXPECT_LE(c.bytes + c.kv_cache_bytes, a.bytes);
  EXPECT_LT(c.bytes, a.bytes) << "the cache left less for the weights";
  // size_ratio: against the float model and a float32 cache together.
  SearchOptions ratio = options();
  ratio.budget.size_ratio = 0.5;
  ratio.kv_cache_context = 50;
  ratio.kv_cache = int8_cache();
  const SearchResult r = search(*t.model, base, 1, t.loss, ratio);
  EXPECT_LE(static_cast<double>(r.bytes + r.kv_cache_bytes), 0.5 * static_cast<double>(r.float_bytes + r.float_kv_cache_bytes));
}

TEST(SearchKvCache, ErrorsNameTheCache) {
  TinyLlama t = tiny_llama();
  const Scheme base(qint8);
  auto message = [&](const SearchOptions& o) {
    try {
      search(*t.model, base, 1, t.loss, o);
    } catch (const SearchError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  SearchOptions tight = options();
  tight.budget.size_mb = 0.05;  // the smallest weights fit; beside a float cache of 1000 positions they do not
  tight.kv_cache_context = 1000;
  EXPECT_NE(message(tight).find("the KV cache's"), std::string::npos) << message(tight);
  EXPECT_NE(message(tight).find("at 1000 positions"), std::string::npos) << message(tight);
  SearchOptions bits = options();
  bits.budget.avg_bits = 4;
  bits.kv_cache_context = 100;
  EXPECT_NE(message(bits).find("has neither"), std::string::npos) << message(bits);
  EXPECT_THROW(check_search(*t.model, base, bits), SearchError);
  torch::nn::Sequential plain(nn::Linear(8, 8));
  SearchOptions no_cache = options();
  no_cache.budget.size_ratio = 0.5;
  no_cache.kv_cache_context = 100;
  try {
    check_search(*plain, base, no_cache);
    ADD_FAILURE() << "a model without a cache priced one";
  } catch (const SearchError& e) {
    EXPECT_NE(std::string(e.what()).find("keeps none"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qforge::search
