// Byte-level language model on fortunes: GPT-2.
#include <algorithm>

#include "framework/data/text_corpus.h"
#include "framework/format/safetensors.h"
#include "framework/models/gpt2.h"
#include "framework/recipe/task.h"
#include "framework/recipe/tasks/task_data.h"

namespace qforge {

namespace {

Task make_gpt2_task(const Recipe& r, bool with_data) {
  Task t;
  const auto& d = r.data;
  models::Gpt2Config c = tasks::model_config<models::Gpt2Config>(r);
  c.vocab_size = data::TextCorpus::kVocabSize;
  c.n_positions = std::max(c.n_positions, d.seq_len);
  auto m = models::Gpt2LMHeadModel(c);
  t.model = m.ptr();
  t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input); };
  t.import_safetensors = [m](const std::string& path) mutable {
    models::load_hf_gpt2(m, io::read_safetensors(path).tensors, path);
  };
  t.metric = "perplexity";
  if (with_data) tasks::attach_fortunes(t, r);
  return t;
}

}  // namespace

TaskKind gpt2_task() { return {"gpt2", "fortunes", make_gpt2_task}; }

}  // namespace qforge
