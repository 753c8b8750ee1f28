// What the task files share: a split capped at the recipe's example limits, the fortunes LM splits,
// and an architecture config from model.config_file and model.config.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/models/perplexity.h"
#include "framework/recipe/recipe.h"
#include "framework/recipe/task.h"
#include "framework/train/batches.h"

namespace qforge::tasks {

// The first n examples of `s` (n = 0: all of them), for quick runs and CI.
std::shared_ptr<train::BatchSource> capped(std::shared_ptr<train::BatchSource> s, int64_t n);

// Fashion-MNIST (data.validation_size, seed, example caps) as the task's splits, its class names,
// the accuracy metric and the majority-class baseline.
void attach_fashion_mnist(Task& t, const Recipe& r, bool with_data);

// The tensors `names` of a user's data file (data.file) that it holds (the others absent from the
// result; *held, when given, lists every top-level name, for messages): a safetensors file, or an
// HDF5 file's datasets at its root, other datasets there left unread (as h5py writes them: `f.create_dataset("inputs", data=x)`; read
// first in a forked child, as an untrusted file, docs/formats.md; HDF5's earliest formats are
// refused naming h5py's libver option). float16 / float64 / bfloat16 become float32, as qforge's
// models compute; other dtypes come back as stored. Throws naming the file when it is missing,
// neither format, or unreadable.
std::map<std::string, at::Tensor> read_data_file(const std::string& path, const std::vector<std::string>& names,
                                                 std::vector<std::string>* held = nullptr);

// data.dataset images: torchvision's ImageFolder layout, data.folder/<class>/.../<image>. Classes
// are the folder's subfolders in sorted name order (labels 0, 1, ...: t.class_names); images are
// the PNG and JPEG files below each (recursively, sorted paths; files with other extensions are
// skipped and counted on stderr, except image formats qforge does not decode, which are refused by
// name). Each is decoded (io::read_image) to model.input_shape [C, H, W] (C 1: PIL's grey, 3:
// RGB; any other size refused, naming the file), scaled to [0, 1] as torchvision's ToTensor, then
// (x - data.mean) / data.std per channel when given. The files are decoded in a forked child into
// shared memory (the decoders trust what they parse: a crash there is an error naming the file;
// this process never parses them). The examples in a seeded order (r.seed): the last data.validation_size
// evaluate (validation and test), the others calibrate and train; the majority-class baseline.
void attach_image_folder(Task& t, const Recipe& r);

// The language-ID data (Debian word lists; data.examples_per_language, seed) as the task's splits
// of token ids, at most data.seq_len, each batch padded to its longest phrase, with their masks (data.tokens: characters, bigrams or
// trigrams, the vocabulary built on the training phrases; id 0 is padding), the class names and
// the majority-class baseline. Returns the vocabulary size. The bert task and TorchScript
// classifiers read it.
int64_t attach_language_id(Task& t, const Recipe& r);

// The vocabulary of the fortunes language models under data.tokenizer: 256 bytes without it,
// data.tokenizer.train.vocab_size, or the size of data.tokenizer.file's tokenizer.
int64_t fortunes_vocab_size(const Recipe& r);

// The fortunes corpus as language-model splits (windows of data.seq_len) of bytes or of the
// data.tokenizer tokens (a BPE tokenizer trained on the training text, or the file's; t.save_tokenizer
// writes it), its unigram baseline, and the sliding-window perplexity of `logits` on the test text
// (windows of data.seq_len every data.seq_len / 2 tokens), for the causal LM tasks (GPT-2, Llama).
void attach_fortunes(Task& t, const Recipe& r, models::CausalLmForward logits);

// The architecture config: model.config_file (HF config.json) if given, else the defaults, with
// the recipe's model.config keys merged over it.
// Memory a new allocation can have now: MemAvailable from /proc/meminfo, else the free physical
// pages (sysconf); -1 when neither is readable.
int64_t available_memory_bytes();

// Refuses, before the model is built, a config whose float32 parameters (its parameter_count())
// exceed available_memory_bytes(), naming model.config / model.config_file and the estimate.
void check_model_fits_memory(const Recipe& r, double parameters);

template <class Config>
Config model_config(const Recipe& r) {
  Config c = r.model.config_file.empty() ? Config{} : Config::from_file(r.model.config_file);
  if (r.model.config.is_null()) return c;
  nlohmann::json merged = c.to_json();
  merged.update(r.model.config);
  return Config::from_json(merged);
}

}  // namespace qforge::tasks
