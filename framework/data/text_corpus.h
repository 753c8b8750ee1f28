// Text corpora for language models: the `fortunes` package's plain-text files as one byte
// stream, split contiguously into train / validation / test (no shuffling across the cut).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace qforge::data {

inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";
inline constexpr const char* kFortunesPackage = "fortunes";

struct TextCorpus {
  std::vector<std::string> files;  // the files read, in order
  at::Tensor train, validation, test;  // int64 [n] byte tokens (vocabulary 256)
  static constexpr int64_t kVocabSize = 256;
};

// Reads every regular file of `dir` except *.dat indexes and symlinks (the .u8 aliases), sorted by
// name, concatenated; then the first train_fraction of bytes is train, the next validation_fraction
// validation, the rest test. Missing directory: an error naming the Debian package.
TextCorpus load_fortunes(double train_fraction = 0.9, double validation_fraction = 0.05,
                         const std::string& dir = kFortunesDir);

// Unigram (token-frequency) baseline: add-one-smoothed frequencies of the `vocab` token ids in
// `train`, and the per-token perplexity they give on `eval`: exp(-mean log p(token)).
double unigram_perplexity(const at::Tensor& train, const at::Tensor& eval, int64_t vocab = TextCorpus::kVocabSize);

}  // namespace qforge::data
