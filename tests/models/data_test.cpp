// framework/data: language ID from Debian word lists, fortunes corpus, character tokenizer.
// Tests on the real files are skipped (with the package to install) when a package is absent.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "framework/core/error.h"
#include "framework/data/char_tokenizer.h"
#include "framework/data/language_id.h"
#include "framework/data/text_corpus.h"

namespace qforge::data {
namespace {

std::string missing_word_list() {
  for (const auto& l : default_word_lists())
    if (!std::filesystem::exists(l.path)) return l.path + " (apt-get install " + l.package + ")";
  return "";
}

LanguageIdOptions small_options(uint64_t seed) {
  LanguageIdOptions o;
  o.seed = seed;
  o.words_per_language = 2000;
  o.train_per_language = 300, o.validation_per_language = 50, o.test_per_language = 50;
  return o;
}

const LanguageId& small_dataset() {
  static const LanguageId d = load_language_id(small_options(7));
  return d;
}

#define SKIP_WITHOUT_WORD_LISTS()                                                      \
  do {                                                                                 \
    const std::string missing = missing_word_list();                                   \
    if (!missing.empty()) GTEST_SKIP() << "word list missing: " << missing;            \
  } while (0)

TEST(LanguageId, NoWordAppearsInTwoSplitsOrTwoLanguages) {
  SKIP_WITHOUT_WORD_LISTS();
  const LanguageId& d = small_dataset();
  ASSERT_EQ(d.languages.size(), 8u);
  EXPECT_GT(d.shared_words_removed, 1000) << "loanwords and shared spellings are removed";
  std::map<std::string, std::string> owner;  // word -> "split/language"
  auto add = [&](const std::vector<std::vector<std::string>>& words, const char* split) {
    for (size_t l = 0; l < words.size(); ++l)
      for (const auto& w : words[l]) {
        const std::string where = std::string(split) + "/" + d.languages[l];
        auto [it, fresh] = owner.emplace(w, where);
        EXPECT_TRUE(fresh) << "'" << w << "' in " << it->second << " and " << where;
      }
  };
  add(d.train_words, "train");
  add(d.validation_words, "validation");
  add(d.test_words, "test");
  // Every test phrase is made of test words of its own language.
  std::set<std::string> test_words;
  for (size_t l = 0; l < d.test_words.size(); ++l) test_words.insert(d.test_words[l].begin(), d.test_words[l].end());
  for (int64_t i = 0; i < d.test.size(); ++i) {
    std::stringstream ss(d.test.text[i]);
    std::string w;
    int n = 0;
    while (ss >> w) {
      ++n;
      EXPECT_TRUE(test_words.count(w)) << "'" << w << "' of test phrase '" << d.test.text[i] << "'";
      EXPECT_EQ(owner[w], "test/" + d.languages[d.test.label[i]]);
    }
    EXPECT_GE(n, 1);
    EXPECT_LE(n, 4);
  }
}

TEST(LanguageId, BalancedAndDeterministicGivenTheSeed) {
  SKIP_WITHOUT_WORD_LISTS();
  const LanguageId& a = small_dataset();
  EXPECT_EQ(a.train.size(), 8 * 300);
  EXPECT_EQ(a.test.size(), 8 * 50);
  const at::Tensor counts = at::bincount(at::tensor(a.train.label, at::kLong));
  EXPECT_TRUE(at::equal(counts, at::full({8}, 300, at::kLong)));
  const LanguageId b = load_language_id(small_options(7));
  EXPECT_EQ(a.train.text, b.train.text);
  EXPECT_EQ(a.test.label, b.test.label);
  const LanguageId c = load_language_id(small_options(8));
  EXPECT_NE(a.train.text, c.train.text);
}

TEST(LanguageId, WordListsAreLowercaseUtf8Letters) {
  SKIP_WITHOUT_WORD_LISTS();
  // wswedish is ISO-8859-1 on disk; it must come out as UTF-8.
  const auto sv = read_word_list(default_word_lists()[7]);
  bool has_ring = false;
  for (const auto& w : sv) has_ring |= w.find("\xC3\xA5") != std::string::npos;  // å
  EXPECT_TRUE(has_ring);
  const auto de = read_word_list(default_word_lists()[2]);
  for (const auto& w : de) {
    ASSERT_EQ(w.find_first_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ'- 0123456789"), std::string::npos) << w;
    ASSERT_EQ(decode_utf8_or_latin1(w), decode_utf8_or_latin1(encode_utf8(decode_utf8_or_latin1(w))));
  }
}

// Which words count as shared, against a count of the lists holding each word: three crafted lists
// (one word in all three, some in two, one with an uppercase twin) keep exactly their own words.
TEST(LanguageId, SharedWordsAreThoseOfSeveralListsAsACountSays) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("qforge_lid_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::vector<std::vector<std::string>> lists = {
      {"common", "apple", "Cat", "dog", "aa", "ab", "ac", "ad", "ae", "af", "ag", "ah", "ai", "aj", "ak", "al"},
      {"common", "cat", "dog", "ba", "bb", "bc", "bd", "be", "bf", "bg", "bh", "bi", "bj", "bk", "bl", "ab"},
      {"common", "dog", "zz", "ca", "cb", "cc", "cd", "ce", "cf", "cg", "ch", "ci", "cj", "ck", "cl", "ba"}};
  LanguageIdOptions o;
  o.languages.clear();
  for (size_t l = 0; l < lists.size(); ++l) {
    const std::string path = (dir / ("list" + std::to_string(l))).string();
    std::ofstream f(path);
    for (const auto& w : lists[l]) f << w << "\n";
    o.languages.push_back({"L" + std::to_string(l), path, "none"});
  }
  o.words_per_language = 0, o.train_per_language = 4, o.validation_per_language = 1, o.test_per_language = 1;
  const LanguageId d = load_language_id(o);
  std::map<std::string, int> holders;
  for (const auto& l : o.languages)
    for (const auto& w : read_word_list(l)) ++holders[w];
  int64_t shared = 0;
  for (const auto& [w, n] : holders) shared += n > 1;
  EXPECT_EQ(d.shared_words_removed, shared);
  EXPECT_EQ(shared, 5);  // common, cat, dog, ab, ba
  for (size_t l = 0; l < lists.size(); ++l) {
    std::set<std::string> kept(d.train_words[l].begin(), d.train_words[l].end()), own;
    kept.insert(d.validation_words[l].begin(), d.validation_words[l].end());
    kept.insert(d.test_words[l].begin(), d.test_words[l].end());
    for (const auto& w : read_word_list(o.languages[l]))
      if (holders[w] == 1) own.insert(w);
    EXPECT_EQ(kept, own) << o.languages[l].name;
  }
  std::filesystem::remove_all(dir);
}

TEST(LanguageId, MissingWordListNamesTheDebianPackage) {
  try {
    read_word_list({"Klingon", "/nonexistent/klingon", "wklingon"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("apt-get install wklingon"), std::string::npos) << e.what();
  }
}

TEST(CharTokenizer, EncodesCodePointsWithClsPaddingAndUnk) {
  const CharTokenizer tok = CharTokenizer::build({"ab", "b\xC3\xA9"});  // a, b, é
  EXPECT_EQ(tok.vocab_size(), CharTokenizer::kNumSpecial + 3);
  const auto ids = tok.encode("a\xC3\xA9z", 10);
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[0], CharTokenizer::kCls);
  EXPECT_EQ(ids[3], CharTokenizer::kUnk);
  EXPECT_EQ(tok.decode(ids), "a\xC3\xA9");
  EXPECT_EQ(tok.encode("abababab", 3).size(), 3u);
  const TokenBatch b = tok.encode_batch({"a", "abb"}, 8);
  EXPECT_EQ(b.input_ids.sizes(), at::IntArrayRef({2, 4}));
  EXPECT_EQ(b.attention_mask.sum().item<int64_t>(), 2 + 4);
  EXPECT_EQ(b.input_ids[0][3].item<int64_t>(), CharTokenizer::kPad);
}

TEST(CharTokenizer, BigramsAreOverlappingWithWordBoundarySpaces) {
  // " ab " -> " a", "ab", "b "; " bé " -> " b", "bé", "é " (code points, not bytes).
  const CharTokenizer tok = CharTokenizer::build({"ab", "b\xC3\xA9"}, 2);
  EXPECT_EQ(tok.ngram(), 2);
  EXPECT_EQ(tok.vocab_size(), CharTokenizer::kNumSpecial + 6);
  const auto ids = tok.encode("ab", 10);
  ASSERT_EQ(ids.size(), 4u);  // [CLS] + c + 3 - n
  EXPECT_EQ(ids[0], CharTokenizer::kCls);
  for (size_t i = 1; i < ids.size(); ++i) EXPECT_GE(ids[i], CharTokenizer::kNumSpecial);
  EXPECT_EQ(tok.decode(ids), "ab");
  EXPECT_EQ(tok.decode(tok.encode("b\xC3\xA9", 10)), "b\xC3\xA9");
  // " ba ": " b" is known, "ba" and "a " were never seen.
  const auto unk = tok.encode("ba", 10);
  ASSERT_EQ(unk.size(), 4u);
  EXPECT_EQ(unk[2], CharTokenizer::kUnk);
  EXPECT_NE(unk[1], CharTokenizer::kUnk);
  EXPECT_EQ(unk[3], CharTokenizer::kUnk);
  EXPECT_EQ(tok.encode("abababab", 3).size(), 3u);
  EXPECT_EQ(CharTokenizer::build({"abc"}, 3).vocab_size(), CharTokenizer::kNumSpecial + 3);  // " ab" "abc" "bc "
  EXPECT_THROW(CharTokenizer::build({"ab"}, 4), Error);
}

TEST(CharTokenizer, InvalidUtf8DecodesAsLatin1) {
  EXPECT_EQ(decode_utf8_or_latin1("f\xF6r"), std::u32string(U"f\u00F6r"));
  EXPECT_EQ(encode_utf8(decode_utf8_or_latin1("f\xF6r")), "f\xC3\xB6r");
}

TEST(Fortunes, ContiguousSplitsOfThePlainTextFiles) {
  if (!std::filesystem::is_directory(kFortunesDir)) GTEST_SKIP() << "fortunes missing (apt-get install fortunes)";
  const TextCorpus c = load_fortunes(0.9, 0.05);
  for (const auto& f : c.files) EXPECT_NE(std::filesystem::path(f).extension(), ".dat") << f;
  const int64_t n = c.train.numel() + c.validation.numel() + c.test.numel();
  EXPECT_GT(n, 1000000);
  EXPECT_NEAR(static_cast<double>(c.train.numel()) / n, 0.9, 1e-5);
  // The validation split continues the training text where it stops.
  std::string first_file;
  {
    std::ifstream f(c.files[0], std::ios::binary);
    first_file.assign(std::istreambuf_iterator<char>(f), {});
  }
  for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(c.train[i].item<int64_t>(), static_cast<unsigned char>(first_file[i]));
  EXPECT_GE(c.train.min().item<int64_t>(), 0);
  EXPECT_LT(c.train.max().item<int64_t>(), 256);
  const double ppl = unigram_perplexity(c.train, c.validation);
  EXPECT_GT(ppl, 10.0);
  EXPECT_LT(ppl, 60.0);
}

TEST(Fortunes, MissingDirectoryNamesTheDebianPackage) {
  try {
    load_fortunes(0.9, 0.05, "/nonexistent/fortunes");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("apt-get install fortunes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qforge::data
