// fortunes corpus and its unigram baseline.
#include "framework/data/text_corpus.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "framework/core/error.h"

namespace qforge::data {

TextCorpus load_fortunes(double train_fraction, double validation_fraction, const std::string& dir) {
  namespace fs = std::filesystem;
  QF_REQUIRE(fs::is_directory(dir), "data: fortunes not found at ", dir, "; install it with: apt-get install ",
             kFortunesPackage);
  QF_REQUIRE(train_fraction > 0 && validation_fraction >= 0 && train_fraction + validation_fraction < 1,
             "data: train_fraction + validation_fraction must be below 1");
  TextCorpus out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_symlink() || !e.is_regular_file() || e.path().extension() == ".dat") continue;
    out.files.push_back(e.path().string());
  }
  std::sort(out.files.begin(), out.files.end());
  QF_REQUIRE(!out.files.empty(), "data: no fortune files in ", dir, "; install them with: apt-get install ",
             kFortunesPackage);
  std::string text;
  for (const auto& path : out.files) {
    std::ifstream f(path, std::ios::binary);
    QF_REQUIRE(f, "data: cannot read ", path);
    text.append(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  const auto n = static_cast<int64_t>(text.size());
  at::Tensor all = at::empty({n}, at::kLong);
  auto* p = all.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(text[i]);
  const auto n_train = static_cast<int64_t>(n * train_fraction), n_val = static_cast<int64_t>(n * validation_fraction);
  out.train = all.narrow(0, 0, n_train).clone();
  out.validation = all.narrow(0, n_train, n_val).clone();
  out.test = all.narrow(0, n_train + n_val, n - n_train - n_val).clone();
  return out;
}

double unigram_perplexity(const at::Tensor& train, const at::Tensor& eval, int64_t vocab) {
  QF_REQUIRE(eval.numel() > 0, "data: unigram_perplexity needs a non-empty evaluation split");
  QF_REQUIRE(train.numel() == 0 || train.max().item<int64_t>() < vocab, "data: unigram_perplexity: a training id is outside the vocabulary of ", vocab);
  QF_REQUIRE(eval.max().item<int64_t>() < vocab, "data: unigram_perplexity: an evaluation id is outside the vocabulary of ", vocab);
  const at::Tensor counts = at::bincount(train.flatten(), {}, vocab).to(at::kDouble) + 1.0;
  const at::Tensor logp = (counts / counts.sum()).log();
  return std::exp(-logp.index_select(0, eval.flatten()).mean().item<double>());
}

}  // namespace qforge::data
