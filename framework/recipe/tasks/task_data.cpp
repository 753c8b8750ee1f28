// Capped splits for the task files (task_data.h).
#include "framework/recipe/tasks/task_data.h"

#include <ATen/ATen.h>

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "framework/core/error.h"
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

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    in.ignore(256, '\n');
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : -1;
}

void check_model_fits_memory(const Recipe& r, double parameters) {
  const int64_t available = available_memory_bytes();
  const double bytes = parameters * 4;  // float32, before any gradient or optimizer state
  if (available < 0 || bytes <= static_cast<double>(available)) return;
  std::ostringstream what;
  what.precision(3);
  what << "model.config";
  if (!r.model.config.is_null()) what << " " << r.model.config.dump();
  if (!r.model.config_file.empty()) what << " (over model.config_file " << r.model.config_file << ")";
  what << " describes a " << r.model.arch << " of about " << parameters << " parameters, " << bytes / 1e9
       << " GB as float32, more than the " << static_cast<double>(available) / 1e9
       << " GB of memory available (MemAvailable); lower its size keys (layers, hidden size, vocabulary)";
  throw Error(what.str());
}

}  // namespace qforge::tasks
