// Byte-level language model on fortunes: a Llama-family decoder (model.config holds HF LlamaConfig
// keys; model.config_file an HF config.json). The vocabulary is the corpus's 256 bytes until a
// BPE tokenizer is wired in.
#include <algorithm>

#include "framework/data/text_corpus.h"
#include "framework/format/safetensors.h"
#include "framework/models/llama.h"
#include "framework/recipe/task.h"
#include "framework/recipe/tasks/task_data.h"

namespace qforge {

namespace {

Task make_llama_task(const Recipe& r, bool with_data) {
  Task t;
  models::LlamaConfig c = tasks::model_config<models::LlamaConfig>(r);
  c.vocab_size = data::TextCorpus::kVocabSize;
  c.max_position_embeddings = std::max(c.max_position_embeddings, r.data.seq_len);
  auto m = models::LlamaForCausalLM(c);
  t.model = m.ptr();
  t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input); };
  t.import_safetensors = [m](const std::string& path) mutable {
    models::load_hf_llama(m, io::read_safetensors(path).tensors, path);
  };
  t.metric = "perplexity";
  if (with_data) tasks::attach_fortunes(t, r);
  return t;
}

}  // namespace

TaskKind llama_task() { return {"llama", "fortunes", make_llama_task}; }

}  // namespace qforge
