// Capped splits for the task files (task_data.h).
#include "framework/recipe/tasks/task_data.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "framework/data/text_corpus.h"

namespace qforge::tasks {

namespace {

// The first n examples of a source.
class Prefix : public train::BatchSource {
 public:
  Prefix(std::shared_ptr<train::BatchSource> base, int64_t n) : base_(std::move(base)), n_(n) {}
  int64_t size() const override { return n_ > 0 ? std::min(n_, base_->size()) : base_->size(); }
  train::Batch get(const at::Tensor& indices) const override { return base_->get(indices); }

 private:
  std::shared_ptr<train::BatchSource> base_;
  int64_t n_;
};

}  // namespace

std::shared_ptr<train::BatchSource> capped(std::shared_ptr<train::BatchSource> s, int64_t n) {
  return n > 0 ? std::make_shared<Prefix>(std::move(s), n) : s;
}

void attach_fortunes(Task& t, const Recipe& r) {
  const auto& d = r.data;
  const data::TextCorpus corpus = data::load_fortunes();
  t.train = capped(std::make_shared<train::LmBatches>(corpus.train, d.seq_len, d.seq_len), d.max_train_examples);
  t.validation = capped(std::make_shared<train::LmBatches>(corpus.validation, d.seq_len, d.seq_len), d.max_eval_examples);
  t.test = capped(std::make_shared<train::LmBatches>(corpus.test, d.seq_len, d.seq_len), d.max_eval_examples);
  t.baselines["unigram_perplexity"] = data::unigram_perplexity(corpus.train, corpus.test);
}

}  // namespace qforge::tasks
