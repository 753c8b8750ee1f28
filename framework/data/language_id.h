// Language identification from Debian word lists: an example is a phrase of 1-4 words of one
// language, the label is that language. Splits are made by word (per language) before phrases
// are built, so no word appears in two splits. Words found in several languages' lists (after
// lowercasing) are removed from all of them, so every remaining word has exactly one language.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qforge::data {

struct WordList {
  std::string name;     // "English"
  std::string path;     // "/usr/share/dict/american-english"
  std::string package;  // "wamerican"
};

// English, French, German, Italian, Spanish, Portuguese, Dutch, Swedish (label order).
const std::vector<WordList>& default_word_lists();

// Reads a word list: one word per line, UTF-8 or Latin-1; lowercased; words containing anything
// but letters (apostrophes, hyphens, digits, dots) or shorter than 2 letters are dropped;
// duplicates removed; sorted. A missing file names the Debian package to install.
std::vector<std::string> read_word_list(const WordList& list);

struct TextExamples {
  std::vector<std::string> text;
  std::vector<int64_t> label;
  int64_t size() const { return static_cast<int64_t>(label.size()); }
};

struct LanguageIdOptions {
  std::vector<WordList> languages = default_word_lists();
  uint64_t seed = 0;
  int64_t words_per_language = 30000;  // drawn (by seed) from each list after filtering; 0 = all
  double train_fraction = 0.8, validation_fraction = 0.1;  // of each language's words; test gets the rest
  int64_t train_per_language = 6000, validation_per_language = 500, test_per_language = 1000;
  int64_t min_words = 1, max_words = 4;
};

struct LanguageId {
  std::vector<std::string> languages;  // label -> name
  TextExamples train, validation, test;
  int64_t shared_words_removed = 0;    // distinct words present in more than one list
  std::vector<std::vector<std::string>> train_words, validation_words, test_words;  // [language] -> words
};

// Deterministic given options.seed (own Fisher-Yates on mt19937_64, no implementation-defined
// distributions). Examples within each split are shuffled across languages.
LanguageId load_language_id(const LanguageIdOptions& options = {});

}  // namespace qforge::data
