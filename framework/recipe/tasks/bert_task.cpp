// Language identification from Debian word lists: a character-level BERT classifier.
#include <ATen/ATen.h>

#include <algorithm>

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
  if (with_data) {
    c.vocab_size = tasks::attach_language_id(t, r);
    c.num_labels = static_cast<int64_t>(t.class_names.size());
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
  return t;
}

}  // namespace

TaskKind bert_task() { return {"bert", "langid", make_bert_task}; }

}  // namespace qforge
