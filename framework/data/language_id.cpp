// Language-identification dataset from Debian word lists.
#include "framework/data/language_id.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "framework/core/error.h"
#include "framework/data/char_tokenizer.h"

namespace qforge::data {
namespace {

constexpr int64_t kMinWordLetters = 2;

// Lowercase for the Latin-1 and Latin Extended-A letters the word lists use.
char32_t to_lower(char32_t c) {
  if (c >= U'A' && c <= U'Z') return c + 32;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c | 1;
  if (c >= 0x139 && c <= 0x148 && (c & 1)) return c + 1;
  if (c >= 0x179 && c <= 0x17E && (c & 1)) return c + 1;
  if (c == 0x178) return 0xFF;
  return c;
}

bool is_letter(char32_t c) {
  return (c >= U'a' && c <= U'z') || (c >= 0xDF && c <= 0xFF && c != 0xF7) || (c >= 0x100 && c <= 0x17F);
}

template <typename T>
void shuffle(std::vector<T>& v, std::mt19937_64& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng() % i]);
}

// shared[l][i]: whether lists[l][i] is in another list too. One merge pass over the sorted, unique
// lists (a map of every word cost about a second per data stage); returns the distinct shared words.
int64_t mark_shared_words(const std::vector<std::vector<std::string>>& lists, std::vector<std::vector<char>>& shared) {
  const size_t L = lists.size();
  std::vector<size_t> head(L, 0);
  shared.assign(L, {});
  for (size_t l = 0; l < L; ++l) shared[l].assign(lists[l].size(), 0);
  int64_t distinct_shared = 0;
  while (true) {
    const std::string* least = nullptr;
    for (size_t l = 0; l < L; ++l)
      if (head[l] < lists[l].size() && (!least || lists[l][head[l]] < *least)) least = &lists[l][head[l]];
    if (!least) return distinct_shared;
    const std::string& word = *least;
    std::vector<size_t> holders;
    for (size_t l = 0; l < L; ++l)
      if (head[l] < lists[l].size() && lists[l][head[l]] == word) holders.push_back(l);
    distinct_shared += holders.size() > 1;
    for (size_t l : holders) shared[l][head[l]++] = holders.size() > 1;
  }
}

}  // namespace

const std::vector<WordList>& default_word_lists() {
  static const std::vector<WordList> kLists = {
      {"English", "/usr/share/dict/american-english", "wamerican"},
      {"French", "/usr/share/dict/french", "wfrench"},
      {"German", "/usr/share/dict/ngerman", "wngerman"},
      {"Italian", "/usr/share/dict/italian", "witalian"},
      {"Spanish", "/usr/share/dict/spanish", "wspanish"},
      {"Portuguese", "/usr/share/dict/portuguese", "wportuguese"},
      {"Dutch", "/usr/share/dict/dutch", "wdutch"},
      {"Swedish", "/usr/share/dict/swedish", "wswedish"},
  };
  return kLists;
}

std::vector<std::string> read_word_list(const WordList& list) {
  QF_REQUIRE(std::filesystem::exists(list.path), "data: ", list.name, " word list not found at ", list.path,
             "; install it with: apt-get install ", list.package);
  std::ifstream f(list.path, std::ios::binary);
  QF_REQUIRE(f, "data: cannot open ", list.path);
  std::vector<std::string> words;
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::u32string w = decode_utf8_or_latin1(line);
    bool ok = static_cast<int64_t>(w.size()) >= kMinWordLetters;
    for (auto& c : w) {
      c = to_lower(c);
      ok = ok && is_letter(c);
    }
    if (ok) words.push_back(encode_utf8(w));
  }
  QF_REQUIRE(!words.empty(), "data: ", list.path, " holds no usable words (is it a word list?)");
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  return words;
}

LanguageId load_language_id(const LanguageIdOptions& o) {
  QF_REQUIRE(o.languages.size() >= 2, "data: language ID needs at least two word lists");
  QF_REQUIRE(o.min_words >= 1 && o.max_words >= o.min_words, "data: need 1 <= min_words <= max_words");
  QF_REQUIRE(o.train_fraction > 0 && o.validation_fraction >= 0 && o.train_fraction + o.validation_fraction < 1,
             "data: train_fraction + validation_fraction must be below 1");
  std::vector<std::vector<std::string>> lists;
  for (const auto& l : o.languages) lists.push_back(read_word_list(l));
  std::vector<std::vector<char>> shared;
  LanguageId out;
  out.shared_words_removed = mark_shared_words(lists, shared);

  std::mt19937_64 rng(o.seed);
  const size_t L = o.languages.size();
  out.train_words.resize(L), out.validation_words.resize(L), out.test_words.resize(L);
  for (size_t l = 0; l < L; ++l) {
    out.languages.push_back(o.languages[l].name);
    std::vector<std::string> words;
    for (size_t i = 0; i < lists[l].size(); ++i)
      if (!shared[l][i]) words.push_back(lists[l][i]);
    shuffle(words, rng);
    if (o.words_per_language > 0 && static_cast<int64_t>(words.size()) > o.words_per_language)
      words.resize(o.words_per_language);
    const auto n = static_cast<int64_t>(words.size());
    const auto n_train = static_cast<int64_t>(n * o.train_fraction);
    const auto n_val = static_cast<int64_t>(n * o.validation_fraction);
    QF_REQUIRE(n_train > 0 && n - n_train - n_val > 0 && (o.validation_fraction == 0 || n_val > 0), "data: ",
               o.languages[l].name, " has only ", n, " unique words, too few to split");
    out.train_words[l].assign(words.begin(), words.begin() + n_train);
    out.validation_words[l].assign(words.begin() + n_train, words.begin() + n_train + n_val);
    out.test_words[l].assign(words.begin() + n_train + n_val, words.end());
  }

  auto make = [&](const std::vector<std::vector<std::string>>& pool, int64_t per_language) {
    std::vector<std::pair<std::string, int64_t>> ex;
    for (size_t l = 0; l < L; ++l) {
      if (pool[l].empty()) continue;
      for (int64_t i = 0; i < per_language; ++i) {
        const int64_t k = o.min_words + static_cast<int64_t>(rng() % static_cast<uint64_t>(o.max_words - o.min_words + 1));
        std::string phrase;
        for (int64_t j = 0; j < k; ++j) phrase += (j ? " " : "") + pool[l][rng() % pool[l].size()];
        ex.emplace_back(std::move(phrase), static_cast<int64_t>(l));
      }
    }
    shuffle(ex, rng);
    TextExamples t;
    for (auto& [s, y] : ex) t.text.push_back(std::move(s)), t.label.push_back(y);
    return t;
  };
  out.train = make(out.train_words, o.train_per_language);
  out.validation = make(out.validation_words, o.validation_per_language);
  out.test = make(out.test_words, o.test_per_language);
  return out;
}

}  // namespace qforge::data
