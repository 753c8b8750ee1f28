// The tasks qtrain runs, one factory per architecture behind a small registry.
#include "framework/recipe/task.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "framework/core/error.h"
#include "framework/data/char_tokenizer.h"
#include "framework/data/fashion_mnist.h"
#include "framework/data/language_id.h"
#include "framework/data/text_corpus.h"
#include "framework/io/safetensors.h"
#include "framework/models/bert.h"
#include "framework/models/cnn.h"
#include "framework/models/gpt2.h"
#include "framework/models/mlp.h"
#include "framework/models/state_dict.h"

namespace qforge {

namespace {

// The first n examples of a source (quick runs and CI).
class Prefix : public train::BatchSource {
 public:
  Prefix(std::shared_ptr<train::BatchSource> base, int64_t n) : base_(std::move(base)), n_(n) {}
  int64_t size() const override { return n_ > 0 ? std::min(n_, base_->size()) : base_->size(); }
  train::Batch get(const at::Tensor& indices) const override { return base_->get(indices); }

 private:
  std::shared_ptr<train::BatchSource> base_;
  int64_t n_;
};


std::shared_ptr<train::BatchSource> capped(std::shared_ptr<train::BatchSource> s, int64_t n) {
  return n > 0 ? std::make_shared<Prefix>(std::move(s), n) : s;
}

// The architecture config: model.config_file (HF config.json) if given, else the defaults, with
// the recipe's model.config keys merged over it.
template <class Config>
Config model_config(const Recipe& r) {
  Config c = r.model.config_file.empty() ? Config{} : Config::from_file(r.model.config_file);
  if (r.model.config.is_null()) return c;
  nlohmann::json merged = c.to_json();
  merged.update(r.model.config);
  return Config::from_json(merged);
}

// Fashion-MNIST classifiers: the MLP and the CNN (whose BatchNorm folds before quantization).
Task make_image_task(const Recipe& r, bool with_data) {
  Task t;
  const auto& d = r.data;
  if (r.model.arch == "mlp") {
    auto m = models::Mlp(models::MlpOptions{});
    t.model = m.ptr();
    t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input); };
  } else {
    auto m = models::SmallCnn(models::SmallCnnOptions{});
    t.model = m.ptr();
    t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input); };
    t.before_quantize = [m]() mutable { m->fold_batch_norm(); };
  }
  t.import_safetensors = [m = t.model](const std::string& path) {
    models::LoadStateOptions o;
    o.source = path;
    models::load_model_state(*m, io::read_safetensors(path).tensors, o);
  };
  t.metric = "accuracy";
  for (int64_t c = 0; c < 10; ++c) t.class_names.push_back(data::fashion_mnist_class_name(c));
  if (with_data) {
    const data::FashionMnist fm = data::load_fashion_mnist(d.validation_size, r.seed);
    t.train = capped(std::make_shared<train::TensorBatches>(fm.train.images, fm.train.labels), d.max_train_examples);
    t.validation = capped(std::make_shared<train::TensorBatches>(fm.validation.images, fm.validation.labels),
                          d.max_eval_examples);
    t.test = capped(std::make_shared<train::TensorBatches>(fm.test.images, fm.test.labels), d.max_eval_examples);
    t.baselines["majority_class_accuracy"] = at::bincount(fm.test.labels).max().item<double>() / fm.test.size();
  }
  return t;
}

// Language identification from Debian word lists: a character-level BERT classifier.
Task make_bert_task(const Recipe& r, bool with_data) {
  Task t;
  const auto& d = r.data;
  models::BertConfig c = model_config<models::BertConfig>(r);
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
  auto m = models::BertForSequenceClassification(c);
  t.model = m.ptr();
  t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input, b.mask); };
  t.import_safetensors = [m](const std::string& path) mutable {
    models::load_hf_bert(*m, io::read_safetensors(path).tensors, path);
  };
  t.metric = "accuracy";
  if (with_data) {
    t.train = capped(std::make_shared<train::TensorBatches>(train::text_classification_batches(lid.train, tok, d.seq_len)),
                     d.max_train_examples);
    t.validation = capped(
        std::make_shared<train::TensorBatches>(train::text_classification_batches(lid.validation, tok, d.seq_len)),
        d.max_eval_examples);
    t.test = capped(std::make_shared<train::TensorBatches>(train::text_classification_batches(lid.test, tok, d.seq_len)),
                    d.max_eval_examples);
    const at::Tensor labels = at::tensor(lid.test.label, at::kLong);
    t.baselines["majority_class_accuracy"] = at::bincount(labels).max().item<double>() / labels.numel();
  }
  return t;
}

// Byte-level language model on fortunes: GPT-2.
Task make_gpt2_task(const Recipe& r, bool with_data) {
  Task t;
  const auto& d = r.data;
  models::Gpt2Config c = model_config<models::Gpt2Config>(r);
  c.vocab_size = data::TextCorpus::kVocabSize;
  c.n_positions = std::max(c.n_positions, d.seq_len);
  auto m = models::Gpt2LMHeadModel(c);
  t.model = m.ptr();
  t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input); };
  t.import_safetensors = [m](const std::string& path) mutable {
    models::load_hf_gpt2(m, io::read_safetensors(path).tensors, path);
  };
  t.metric = "perplexity";
  if (with_data) {
    const data::TextCorpus corpus = data::load_fortunes();
    t.train = capped(std::make_shared<train::LmBatches>(corpus.train, d.seq_len, d.seq_len), d.max_train_examples);
    t.validation = capped(std::make_shared<train::LmBatches>(corpus.validation, d.seq_len, d.seq_len), d.max_eval_examples);
    t.test = capped(std::make_shared<train::LmBatches>(corpus.test, d.seq_len, d.seq_len), d.max_eval_examples);
    t.baselines["unigram_perplexity"] = data::unigram_perplexity(corpus.train, corpus.test);
  }
  return t;
}

struct TaskFactory {
  const char* arch;
  Task (*make)(const Recipe&, bool);
};

constexpr TaskFactory kTasks[] = {
    {"mlp", make_image_task}, {"cnn", make_image_task}, {"bert", make_bert_task}, {"gpt2", make_gpt2_task}};

}  // namespace

std::vector<std::string> task_architectures() {
  std::vector<std::string> out;
  for (const TaskFactory& f : kTasks) out.emplace_back(f.arch);
  return out;
}

Task make_task(const Recipe& r, bool with_data) {
  for (const TaskFactory& f : kTasks)
    if (r.model.arch == f.arch) return f.make(r, with_data);
  throw Error("qtrain: no task for model.arch '" + r.model.arch + "'");
}

}  // namespace qforge
