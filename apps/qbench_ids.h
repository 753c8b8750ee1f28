// Token ids for qbench's embedding rows (apps/qbench_rpq.cpp), drawn before timing.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace qforge::bench {

// Batches of random ids taken in turn: each call looks up new tokens without the draw entering
// the timed work.
class IdBatches {
 public:
  IdBatches(int64_t vocab, int64_t ids, int64_t batches) : all_(at::randint(vocab, {batches, ids}, at::kLong)) {}
  at::Tensor next() {
    const at::Tensor b = all_[next_];
    next_ = (next_ + 1) % all_.size(0);
    return b;
  }

 private:
  at::Tensor all_;
  int64_t next_ = 0;
};

// GPT-2's table; 32 ids a call.
constexpr int64_t kEmbeddingVocab = 50257, kEmbeddingDim = 768, kEmbeddingIds = 32;
// 4096 batches x 32 ids: 131072 lookups before one repeats, 2.6x the table's rows.
constexpr int64_t kFreshIdBatches = 4096;

// The ids of rpq_embedding_lookup's rows: new ones every call (fresh) or one batch repeated.
inline IdBatches embedding_ids(bool fresh) {
  return IdBatches(kEmbeddingVocab, kEmbeddingIds, fresh ? kFreshIdBatches : 1);
}

}  // namespace qforge::bench
