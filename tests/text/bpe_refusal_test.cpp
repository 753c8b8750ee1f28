// What tokenizer.json loading refuses: sections and values qforge does not implement (each error
// names the JSON key), inconsistent vocabularies and merges, and missing, truncated or foreign files.
#include "framework/text/bpe_tokenizer.h"
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

const std::string kRefusalFixtures = QFORGE_TEXT_FIXTURES;

json gpt2_fixture() {
  std::ifstream f(kRefusalFixtures + "/gpt2_bpe.json");
  return json::parse(f);
}

// The error of loading the GPT-2 fixture after `edit`.
template <typename Edit>
std::string refusal(Edit edit) {
  json j = gpt2_fixture();
  edit(j);
  return error_of([&] { BpeTokenizer::parse(j.dump(), "edited.json"); });
}

void expect_names(const std::string& error, const std::string& key) {
  EXPECT_NE(error.find(key), std::string::npos) << "error does not name " << key << ": " << error;
  EXPECT_NE(error.find("edited.json"), std::string::npos) << error;
}

TEST(BpeRefusal, ForeignSectionsNameTheirKey) {
  expect_names(refusal([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }), "normalizer.type \"Lowercase\"");
  expect_names(refusal([](json& j) { j["normalizer"] = {{"type", "NFC"}, {"x", 1}}; }), "normalizer has fields");
  expect_names(refusal([](json& j) { j["model"]["type"] = "WordPiece"; }), "model.type");
  expect_names(refusal([](json& j) { j["model"]["dropout"] = 0.1; }), "model.dropout");
  expect_names(refusal([](json& j) { j["model"]["foo"] = 1; }), "model.foo");
  expect_names(refusal([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }),
               "pre_tokenizer.type \"Whitespace\"");
  expect_names(refusal([](json& j) {
                 j["pre_tokenizer"] = {{"type", "Sequence"},
                                       {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "a"}}},
                                                           {"behavior", "Removed"}, {"invert", false}}}}};
               }),
               "pre_tokenizer.pretokenizers[0].behavior");
  expect_names(refusal([](json& j) {
                 j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(?<bad"}}}, {"behavior", "Isolated"}};
               }),
               "pre_tokenizer.pattern");
  expect_names(refusal([](json& j) {
                 j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "sometimes"}};
               }),
               "pre_tokenizer.prepend_scheme");
  expect_names(refusal([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }), "decoder.type");
  expect_names(refusal([](json& j) { j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "CTC"}}}}}; }),
               "decoder.decoders[0].type");
  expect_names(refusal([](json& j) { j["post_processor"] = {{"type", "RobertaProcessing"}}; }), "post_processor.type");
  expect_names(refusal([](json& j) { j["truncation"] = {{"max_length", 8}}; }), "truncation");
  expect_names(refusal([](json& j) { j["added_tokens"][0]["single_word"] = true; }), "added_tokens[0].single_word");
  expect_names(refusal([](json& j) { j["extra"] = 1; }), "\"extra\"");
}

TEST(BpeRefusal, InconsistentVocabularyAndMerges) {
  expect_names(refusal([](json& j) { j["model"]["merges"].push_back("Ġ zzzq"); }), "names a token missing");
  expect_names(refusal([](json& j) { j["model"]["merges"][0] = "abc"; }), "model.merges[0]");
  expect_names(refusal([](json& j) { j["model"]["merges"][0] = {"a"}; }), "model.merges[0]");
  expect_names(refusal([](json& j) { j["model"]["vocab"]["x"] = -3; }), "model.vocab[\"x\"]");
  expect_names(refusal([](json& j) { j["model"]["unk_token"] = "<nope>"; }), "model.unk_token");
  expect_names(refusal([](json& j) { j["added_tokens"][0]["content"] = ""; }), "added_tokens[0].content");
}

// HF renumbers added tokens silently (the model's id for known content, else the next free one);
// qforge refuses every id the file does not state consistently, naming the key.
TEST(BpeRefusal, HostileIdsNameTheirKey) {
  expect_names(refusal([](json& j) { j["model"]["vocab"]["zzq"] = j["model"]["vocab"]["a"]; }), "share id 97");
  // Content the model has, with another id.
  expect_names(refusal([](json& j) { j["added_tokens"].push_back({{"id", 900000}, {"content", "a"}}); }),
               "added_tokens[1].content \"a\" is model.vocab's id");
  // An id that belongs to another model token.
  expect_names(refusal([](json& j) {
                 j["added_tokens"].push_back({{"id", j["model"]["vocab"]["a"]}, {"content", "<new>"}});
               }),
               "added_tokens[1].id");
  expect_names(refusal([](json& j) { j["added_tokens"].push_back({{"id", 900001}, {"content", "<|endoftext|>"}}); }),
               "is also added_tokens[0].content");
  expect_names(refusal([](json& j) {
                 j["added_tokens"].push_back({{"id", 900001}, {"content", "<x>"}});
                 j["added_tokens"].push_back({{"id", 900001}, {"content", "<y>"}});
               }),
               "added_tokens[2].id = 900001 is also added_tokens[1].id");
  expect_names(refusal([](json& j) { j["added_tokens"].push_back({{"id", 0x80000000LL}, {"content", "<big>"}}); }),
               "added_tokens[1].id = 2147483648 is above");
}

TEST(BpeRefusal, TemplateIdsMustNameTokens) {
  const auto with_template = [](int64_t id) {
    return [id](json& j) {
      j["post_processor"] = {{"type", "TemplateProcessing"},
                             {"single", {{{"SpecialToken", {{"id", "X"}, {"type_id", 0}}}},
                                         {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                             {"special_tokens", {{"X", {{"id", "X"}, {"ids", {id}}, {"tokens", {"X"}}}}}}};
    };
  };
  expect_names(refusal(with_template(777777)), "post_processor.special_tokens[\"X\"].ids holds 777777");
  json j = gpt2_fixture();
  with_template(j["added_tokens"][0]["id"].get<int64_t>())(j);
  EXPECT_NO_THROW(BpeTokenizer::parse(j.dump(), "edited.json"));
}

TEST(BpeRefusal, MissingTruncatedAndForeignFiles) {
  namespace fs = std::filesystem;
  EXPECT_NE(error_of([] { BpeTokenizer::load("/nonexistent/tokenizer.json"); }).find("/nonexistent/tokenizer.json"),
            std::string::npos);
  std::ifstream in(kRefusalFixtures + "/gpt2_bpe.json");
  std::stringstream whole;
  whole << in.rdbuf();
  const std::string text = whole.str();
  const fs::path cut = fs::temp_directory_path() / ("qforge_bpe_cut_" + std::to_string(::getpid()) + ".json");
  std::ofstream(cut) << text.substr(0, text.size() / 2);
  const std::string e = error_of([&] { BpeTokenizer::load(cut.string()); });
  EXPECT_NE(e.find(cut.string()), std::string::npos) << e;
  EXPECT_NE(e.find("not a JSON tokenizer file"), std::string::npos) << e;
  fs::remove(cut);
  EXPECT_NE(error_of([] { BpeTokenizer::parse("[1, 2]", "list.json"); }).find("list.json"), std::string::npos);
  EXPECT_NE(error_of([] { BpeTokenizer::parse("{\"version\": \"1.0\"}", "empty.json"); }).find("no \"model\""),
            std::string::npos);
}

}  // namespace
