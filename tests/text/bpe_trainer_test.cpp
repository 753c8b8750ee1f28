// The BPE trainer: merges chosen by pair frequency with the documented tie-break, files that
// BpeTokenizer loads and that round-trip text, one file per corpus, and its refusals.
#include "framework/text/bpe_tokenizer.h"
#include "framework/text/bpe_trainer.h"
#include "tests/error_of.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace {

using namespace qforge::text;
using qforge::testing::error_of;

using Merges = std::vector<std::pair<std::string, std::string>>;

TEST(BpeTrainer, MergesTheMostFrequentPairUntilNoneReachesMinFrequency) {
  BpeTrainerOptions o;
  o.vocab_size = 300;
  // Pieces "ab", " ab", " ab", " cd": (a,b) x3, then (Ġ,ab) x2; (Ġ,c) and (c,d) occur once.
  const TrainedBpe t = train_bpe({"ab ab ab cd"}, o);
  EXPECT_EQ(t.merges, (Merges{{"a", "b"}, {"\xC4\xA0", "ab"}}));
  EXPECT_EQ(t.vocab.size(), 258u);
  EXPECT_EQ(t.vocab[256], "ab");
  EXPECT_EQ(t.vocab[257], "\xC4\xA0" "ab");
}

TEST(BpeTrainer, TiesGoToTheSmallestPairOfIds) {
  BpeTrainerOptions o;
  o.vocab_size = 257;
  o.min_frequency = 1;
  // (a,b), (Ġ,c), (c,d) each occur once; Ġ is byte 0x20 (id 32), smaller than 'a' (97).
  EXPECT_EQ(train_bpe({"ab cd"}, o).merges, (Merges{{"\xC4\xA0", "c"}}));
}

TEST(BpeTrainer, StopsAtVocabSizeAndPlacesSpecialTokensLast) {
  BpeTrainerOptions o;
  o.vocab_size = 256 + 5 + 2;
  o.min_frequency = 1;
  o.special_tokens = {"<s>", "</s>"};
  const TrainedBpe t = train_bpe({"the cat sat on the mat with the hat"}, o);
  EXPECT_EQ(t.vocab.size(), 263u);
  EXPECT_EQ(t.merges.size(), 5u);
  EXPECT_EQ(t.vocab[261], "<s>");
  EXPECT_EQ(t.vocab[262], "</s>");
}

std::string fortunes_text() {
  std::ifstream f("/usr/share/games/fortunes/fortunes");
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(BpeTrainer, WritesATokenizerJsonThatLoadsAndRoundTrips) {
  const std::string corpus = fortunes_text();
  ASSERT_FALSE(corpus.empty()) << "Debian package fortunes is not installed";
  for (const char* pattern : {kGpt2Pattern, kLlama3Pattern}) {
    BpeTrainerOptions o;
    o.vocab_size = 600;
    o.pattern = pattern;
    o.special_tokens = {"<|begin_of_text|>", "<|end_of_text|>"};
    o.bos_token = "<|begin_of_text|>";
    o.merges_as_pairs = pattern == kLlama3Pattern;
    const TrainedBpe t = train_bpe({corpus}, o);
    EXPECT_EQ(t.vocab.size(), 600u);
    const BpeTokenizer tok = BpeTokenizer::parse(t.to_json(), "trained");
    EXPECT_EQ(tok.vocab_size(), 600);
    const auto ids = tok.encode(corpus, false);
    EXPECT_EQ(tok.decode(ids), corpus);
    // A vocabulary trained on the text compresses it well below one token per byte.
    EXPECT_LT(static_cast<double>(ids.size()), 0.5 * static_cast<double>(corpus.size()));
    EXPECT_EQ(tok.encode("x").front(), 598);  // the BOS template
    EXPECT_EQ(t.to_json(), train_bpe({corpus}, o).to_json());  // one corpus, one file
  }
}

TEST(BpeTrainer, Refusals) {
  BpeTrainerOptions o;
  o.vocab_size = 200;
  EXPECT_NE(error_of([&] { train_bpe({"abc"}, o); }).find("vocab_size 200"), std::string::npos);
  o.vocab_size = 300;
  EXPECT_NE(error_of([&] { train_bpe({"ok", "bad\xC3"}, o); }).find("corpus text 1: invalid UTF-8 at byte 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { train_bpe({}, o); }).find("corpus is empty"), std::string::npos);
  o.bos_token = "<s>";
  EXPECT_NE(error_of([&] { train_bpe({"abc"}, o); }).find("not one of special_tokens"), std::string::npos);
}

}  // namespace
