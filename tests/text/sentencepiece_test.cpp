// SentencePiece tokenizer.model through libsentencepiece: the committed Llama-2-style fixture
// (BPE with byte fallback, trained by spm_train) against python3-sentencepiece's ids, byte
// fallback for characters outside the vocabulary, BOS/EOS, and refusals.
#include "framework/text/sentencepiece_tokenizer.h"
#include "framework/text/tokenizer.h"
#include "tests/error_of.h"
#include "tests/paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

namespace {

using namespace qforge::text;
using nlohmann::json;
using qforge::testing::error_of;

const std::string kModel = std::string(QFORGE_TEXT_FIXTURES) + "/sentencepiece_bpe.model";

// Skipped only in a build without libsentencepiece-dev; where the plugin was built it must load.
#if QFORGE_TEST_HAS_SENTENCEPIECE
#define REQUIRE_SENTENCEPIECE() \
  ASSERT_TRUE(SentencePieceTokenizer::available()) << SentencePieceTokenizer::unavailable_reason()
#else
#define REQUIRE_SENTENCEPIECE() GTEST_SKIP() << "built without libsentencepiece-dev"
#endif

TEST(SentencePieceFixtures, MatchesPythonSentencePiece) {
  REQUIRE_SENTENCEPIECE();
  const SentencePieceTokenizer tok = SentencePieceTokenizer::load(kModel);
  std::ifstream f(std::string(QFORGE_TEXT_FIXTURES) + "/sentencepiece_bpe_expected.json");
  const json cases = json::parse(f);
  ASSERT_GT(cases.size(), 20u);
  for (const json& c : cases) {
    const std::string text = c["text"];
    const auto ids = tok.encode(text);
    EXPECT_EQ(ids, c["ids"].get<std::vector<int64_t>>()) << text;
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>()) << text;
    for (size_t i = 0; i < ids.size() && i < c["pieces"].size(); ++i) EXPECT_EQ(tok.id_to_token(ids[i]), c["pieces"][i]);
  }
}

TEST(SentencePiece, ByteFallbackSpellsUnknownCharactersInBytes) {
  REQUIRE_SENTENCEPIECE();
  const SentencePieceTokenizer tok = SentencePieceTokenizer::load(kModel);
  // U+1F600 (F0 9F 98 80) is in no word list: four byte pieces, and decoding restores it.
  const auto ids = tok.encode("\xF0\x9F\x98\x80", false);
  std::vector<std::string> pieces;
  for (const int64_t id : ids) pieces.push_back(tok.id_to_token(id));
  EXPECT_EQ(pieces, (std::vector<std::string>{"\xE2\x96\x81", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"}));
  EXPECT_EQ(tok.decode(ids), "\xF0\x9F\x98\x80");
}

TEST(SentencePiece, BosAndEosFollowTheOptions) {
  REQUIRE_SENTENCEPIECE();
  const SentencePieceTokenizer plain = SentencePieceTokenizer::load(kModel);
  EXPECT_EQ(plain.bos_id(), 1);
  EXPECT_EQ(plain.eos_id(), 2);
  EXPECT_EQ(plain.token_to_id("<s>"), 1);
  EXPECT_EQ(plain.token_to_id("<unk>"), 0);
  EXPECT_EQ(plain.token_to_id("no such piece"), std::nullopt);
  const auto body = plain.encode("hello", false);
  auto with_bos = body;
  with_bos.insert(with_bos.begin(), 1);
  EXPECT_EQ(plain.encode("hello"), with_bos);
  SentencePieceOptions o;
  o.add_eos = true;
  auto both = with_bos;
  both.push_back(2);
  EXPECT_EQ(SentencePieceTokenizer::load(kModel, o).encode("hello"), both);
  EXPECT_EQ(plain.decode(both), "hello");  // control pieces decode to nothing
}

TEST(SentencePiece, Refusals) {
  namespace fs = std::filesystem;
#if !QFORGE_TEST_HAS_SENTENCEPIECE
  {
    EXPECT_NE(error_of([] { SentencePieceTokenizer::load(kModel); }).find("libsentencepiece-dev"), std::string::npos);
    return;
  }
#endif
  REQUIRE_SENTENCEPIECE();
  EXPECT_NE(error_of([] { SentencePieceTokenizer::load("/nonexistent/tokenizer.model"); })
                .find("/nonexistent/tokenizer.model"),
            std::string::npos);
  std::ifstream in(kModel, std::ios::binary);
  std::stringstream whole;
  whole << in.rdbuf();
  const fs::path cut = fs::temp_directory_path() / ("qforge_sp_cut_" + std::to_string(::getpid()) + ".model");
  std::ofstream(cut, std::ios::binary) << whole.str().substr(0, whole.str().size() / 3);
  const std::string e = error_of([&] { SentencePieceTokenizer::load(cut.string()); });
  EXPECT_NE(e.find("not a readable SentencePiece model"), std::string::npos) << e;
  fs::remove(cut);
  const SentencePieceTokenizer tok = SentencePieceTokenizer::load(kModel);
  EXPECT_NE(error_of([&] { tok.encode("bad\xC3"); }).find("invalid UTF-8 at byte 3"), std::string::npos);
  EXPECT_NE(error_of([&] { tok.decode({5, tok.vocab_size()}); }).find("ids[1]"), std::string::npos);
}


// A folder whose tokenizer.json qforge refuses falls back to its tokenizer.model only when the
// json's added tokens keep their ids there.
TEST(SentencePiece, FolderFallbackChecksTheAddedTokenIds) {
  REQUIRE_SENTENCEPIECE();
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("qforge_sp_fallback_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kModel, dir / "tokenizer.model");
  const int64_t bos = *SentencePieceTokenizer::load(kModel).token_to_id("<s>");
  auto write_json = [&](int64_t id) {
    const json j = {{"version", "1.0"}, {"model", {{"type", "WordPiece"}}},
                    {"added_tokens", json::array({{{"id", id}, {"content", "<s>"}, {"special", true}}})}};
    std::ofstream(dir / "tokenizer.json") << j.dump();
  };
  write_json(bos);
  EXPECT_EQ(load_tokenizer(dir.string())->encode("Hello world"), SentencePieceTokenizer::load(kModel).encode("Hello world"));
  write_json(bos + 3);
  const std::string e = error_of([&] { load_tokenizer(dir.string()); });
  EXPECT_NE(e.find("gives added token '<s>' id " + std::to_string(bos) + ", not tokenizer.json's " + std::to_string(bos + 3)),
            std::string::npos) << e;
  EXPECT_NE(e.find("WordPiece"), std::string::npos) << e;  // why tokenizer.json was refused
  fs::remove_all(dir);
}

}  // namespace
