// Language identification from Debian word lists: a character-level BERT classifier.
#include <ATen/ATen.h>

#include <algorithm>

#include "framework/data/char_tokenizer.h"
#include "framework/data/language_id.h"
#include "framework/format/safetensors.h"
#include "framework/models/bert.h"
#include "framework/recipe/task.h"
#include "framework/recipe/tasks/task_data.h"

namespace qforge {

namespace {

Task make_bert_task(const Recipe& r, bool with_data) {
  Task t;
  const auto& d = r.data;
  models::BertConfig c = tasks::model_config<models::BertConfig>(r);
  c.max_position_embeddings = std::max(c.max_position_embeddings, d.seq_len);
  data::LanguageId lid;
  data::CharTokenizer tok;
  if (with_data) {
    data::LanguageIdOptions o;
    o.seed = r.seed;
    if (d.examples_per_language > 0) o.train_per_language = d.examples_per_language;
    lid = data::load_language_id(o);
    const int64_t ngram = d.tokens == "trigrams" ? 3 : d.tokens == "bigrams" ? 2 : 1;
    tok = data::CharTokenizer::build(lid.train.text, ngram);
    c.vocab_size = tok.vocab_size();
    c.num_labels = static_cast<int64_t>(lid.languages.size());
    t.class_names = lid.languages;
  } else {
    c.num_labels = 8;
    c.vocab_size = std::min<int64_t>(c.vocab_size, 256);
  }
  tasks::check_model_fits_memory(r, c.parameter_count());
  auto m = models::BertForSequenceClassification(c);
  t.model = m.ptr();
  t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input, b.mask); };
  t.import_safetensors = [m](const std::string& path) mutable {
    models::load_hf_bert(*m, io::read_safetensors(path).tensors, path);
  };
  t.metric = "accuracy";
  if (with_data) {
    auto split = [&](const auto& s, int64_t cap) {
      return tasks::capped(std::make_shared<train::TensorBatches>(train::text_classification_batches(s, tok, d.seq_len)), cap);
    };
    t.train = split(lid.train, d.max_train_examples);
    t.validation = split(lid.validation, d.max_eval_examples);
    t.test = split(lid.test, d.max_eval_examples);
    const at::Tensor labels = at::tensor(lid.test.label, at::kLong);
    t.baselines["majority_class_accuracy"] = at::bincount(labels).max().item<double>() / labels.numel();
  }
  return t;
}

}  // namespace

TaskKind bert_task() { return {"bert", "langid", make_bert_task}; }

}  // namespace qforge
