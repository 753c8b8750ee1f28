#include "framework/text/bpe_trainer.h"

#include "framework/core/error.h"
#include "framework/format/atomic_file.h"
#include "framework/text/byte_level.h"
#include "framework/text/normalizer.h"
#include "framework/text/utf8.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <queue>
#include <unordered_map>
#include <unordered_set>

namespace qforge::text {

namespace {

constexpr int64_t kByteSymbols = 256;

using Pair = uint64_t;  // (left id << 32) | right id
Pair make_pair_key(int64_t a, int64_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b); }
int64_t left_of(Pair p) { return static_cast<int64_t>(p >> 32); }
int64_t right_of(Pair p) { return static_cast<int64_t>(p & 0xFFFFFFFFu); }

struct Word {
  std::vector<int64_t> symbols;
  int64_t count = 0;
};

// The distinct pre-tokenized pieces of the corpus as byte symbols, with their counts, sorted by
// bytes so the training order never depends on hashing.
std::vector<Word> count_words(const std::vector<std::string>& texts, const std::string& pattern,
                              const Normalizer& normalizer) {
  const RegexSplitter splitter(pattern, false, "framework/text: BPE trainer pattern");
  std::unordered_map<std::string, int64_t> counts;
  for (size_t t = 0; t < texts.size(); ++t) {
    require_utf8(texts[t], "framework/text: BPE trainer corpus text " + std::to_string(t));
    const std::string text = normalizer.normalize(texts[t]);
    for (const auto& [b, e] : splitter.split_isolated(text)) ++counts[text.substr(b, e - b)];
  }
  std::map<std::string, int64_t> sorted(counts.begin(), counts.end());
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto& [piece, count] : sorted) {
    Word w;
    w.count = count;
    for (const char c : piece) w.symbols.push_back(static_cast<unsigned char>(c));
    words.push_back(std::move(w));
  }
  return words;
}

// Pair statistics: counts, which words hold each pair, and a max-heap checked lazily against the
// counts (an entry whose count changed since it was pushed is re-pushed with the current count).
class PairStats {
 public:
  explicit PairStats(const std::vector<Word>& words) {
    for (size_t w = 0; w < words.size(); ++w) add_word(words[w], w, +1);
    for (const auto& [pair, count] : counts_) heap_.push({count, pair});
  }

  void add_word(const Word& word, size_t index, int sign) {
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
      const Pair p = make_pair_key(word.symbols[i], word.symbols[i + 1]);
      counts_[p] += sign * word.count;
      if (sign > 0) where_[p].insert(index);
    }
  }
  void push(const Word& word) {
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
      const Pair p = make_pair_key(word.symbols[i], word.symbols[i + 1]);
      heap_.push({counts_[p], p});
    }
  }

  // The most frequent pair (ties: the smallest key) with its count; count 0 when none is left.
  std::pair<Pair, int64_t> best() {
    while (!heap_.empty()) {
      const Entry top = heap_.top();
      heap_.pop();
      const int64_t now = counts_[top.pair];
      if (now == top.count && now > 0) return {top.pair, now};
      if (now > 0 && now < top.count) heap_.push({now, top.pair});
    }
    return {0, 0};
  }

  std::vector<size_t> words_with(Pair p) const {
    const auto it = where_.find(p);
    if (it == where_.end()) return {};
    std::vector<size_t> ws(it->second.begin(), it->second.end());
    std::sort(ws.begin(), ws.end());
    return ws;
  }

 private:
  struct Entry {
    int64_t count;
    Pair pair;
    // Max-heap on count; among equal counts the smallest pair comes first.
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : pair > o.pair; }
  };
  std::unordered_map<Pair, int64_t> counts_;
  std::unordered_map<Pair, std::unordered_set<size_t>> where_;
  std::priority_queue<Entry> heap_;
};

// Replaces every non-overlapping (a, b), left to right, by `merged`.
bool merge_in_word(Word& word, int64_t a, int64_t b, int64_t merged) {
  std::vector<int64_t> out;
  out.reserve(word.symbols.size());
  bool changed = false;
  for (size_t i = 0; i < word.symbols.size(); ++i) {
    if (i + 1 < word.symbols.size() && word.symbols[i] == a && word.symbols[i + 1] == b) {
      out.push_back(merged);
      ++i;
      changed = true;
    } else {
      out.push_back(word.symbols[i]);
    }
  }
  word.symbols = std::move(out);
  return changed;
}

nlohmann::json normalizer_json(const BpeTrainerOptions& o) {
  if (o.normalizer.empty()) return nullptr;
  return {{"type", o.normalizer}};
}

Normalizer normalizer_of(const BpeTrainerOptions& o) {
  return Normalizer::parse(normalizer_json(o), "framework/text: BPE trainer");
}

void check_options(const BpeTrainerOptions& o) {
  const auto specials = static_cast<int64_t>(o.special_tokens.size());
  QF_REQUIRE(o.vocab_size >= kByteSymbols + specials, "framework/text: BPE trainer vocab_size ", o.vocab_size,
             " is below the 256 byte symbols + ", specials, " special tokens");
  QF_REQUIRE(o.min_frequency >= 1, "framework/text: BPE trainer min_frequency must be >= 1, got ", o.min_frequency);
  for (const std::string& s : o.special_tokens) {
    QF_REQUIRE(!s.empty(), "framework/text: BPE trainer special tokens must not be empty");
    require_utf8(s, "framework/text: BPE trainer special token");
  }
  QF_REQUIRE(o.bos_token.empty() ||
                 std::find(o.special_tokens.begin(), o.special_tokens.end(), o.bos_token) != o.special_tokens.end(),
             "framework/text: BPE trainer bos_token \"", o.bos_token, "\" is not one of special_tokens");
}

}  // namespace

TrainedBpe train_bpe(const std::vector<std::string>& texts, const BpeTrainerOptions& options) {
  check_options(options);
  std::vector<Word> words = count_words(texts, options.pattern, normalizer_of(options));
  QF_REQUIRE(!words.empty(), "framework/text: BPE trainer corpus is empty");
  TrainedBpe result;
  result.options = options;
  result.vocab.assign(byte_level_alphabet().begin(), byte_level_alphabet().end());
  const auto specials = static_cast<int64_t>(options.special_tokens.size());
  std::unordered_map<std::string, int64_t> ids;
  for (size_t i = 0; i < result.vocab.size(); ++i) ids[result.vocab[i]] = static_cast<int64_t>(i);
  PairStats stats(words);
  while (static_cast<int64_t>(result.vocab.size()) + specials < options.vocab_size) {
    const auto [pair, count] = stats.best();
    if (count < options.min_frequency) break;
    const int64_t a = left_of(pair), b = right_of(pair);
    // Two merges can spell the same token ("ab" + "c", "a" + "bc"): it keeps its first id, as in HF.
    const std::string token = result.vocab[a] + result.vocab[b];
    const auto [it, fresh] = ids.emplace(token, static_cast<int64_t>(result.vocab.size()));
    if (fresh) result.vocab.push_back(token);
    result.merges.emplace_back(result.vocab[a], result.vocab[b]);
    for (const size_t w : stats.words_with(pair)) {
      Word candidate = words[w];
      if (!merge_in_word(candidate, a, b, it->second)) continue;
      stats.add_word(words[w], w, -1);
      words[w] = std::move(candidate);
      stats.add_word(words[w], w, +1);
      stats.push(words[w]);
    }
  }
  // A special token the merges already spelled keeps that id (tokenizer.json cannot list it twice).
  for (const std::string& s : options.special_tokens)
    if (ids.emplace(s, static_cast<int64_t>(result.vocab.size())).second) result.vocab.push_back(s);
  return result;
}

namespace {

using ojson = nlohmann::ordered_json;

ojson byte_level_step(bool use_regex) {
  return ojson{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

// GPT-2's pattern is ByteLevel's own; any other is a Split before a regex-free ByteLevel (Llama-3's layout).
ojson pre_tokenizer_json(const std::string& pattern) {
  if (pattern == kGpt2Pattern) return byte_level_step(true);
  const ojson split{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
  return ojson{{"type", "Sequence"}, {"pretokenizers", ojson::array({split, byte_level_step(false)})}};
}

ojson template_json(const std::string& bos, int64_t bos_id) {
  const ojson special{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
  auto sequence = [](const char* id, int type_id) { return ojson{{"Sequence", {{"id", id}, {"type_id", type_id}}}}; };
  return ojson{{"type", "TemplateProcessing"},
               {"single", ojson::array({special, sequence("A", 0)})},
               {"pair", ojson::array({special, sequence("A", 0), special, sequence("B", 1)})},
               {"special_tokens", {{bos, {{"id", bos}, {"ids", ojson::array({bos_id})}, {"tokens", ojson::array({bos})}}}}}};
}

}  // namespace

std::string TrainedBpe::to_json() const {
  std::unordered_map<std::string, int64_t> ids;
  ojson vocab_json = ojson::object();
  for (size_t i = 0; i < vocab.size(); ++i) {
    ids[vocab[i]] = static_cast<int64_t>(i);
    vocab_json[vocab[i]] = i;
  }
  ojson merges_json = ojson::array();
  for (const auto& [a, b] : merges)
    merges_json.push_back(options.merges_as_pairs ? ojson::array({a, b}) : ojson(a + " " + b));
  ojson added = ojson::array();
  for (const std::string& s : options.special_tokens)
    added.push_back({{"id", ids.at(s)}, {"content", s}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  const ojson model{{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                    {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                    {"byte_fallback", false}, {"ignore_merges", options.ignore_merges}, {"vocab", vocab_json},
                    {"merges", merges_json}};
  const ojson post = options.bos_token.empty() ? byte_level_step(true) : template_json(options.bos_token, ids.at(options.bos_token));
  const ojson j{{"version", "1.0"},          {"truncation", nullptr},    {"padding", nullptr},
                {"added_tokens", added},     {"normalizer", options.normalizer.empty() ? ojson() : ojson{{"type", options.normalizer}}},    {"pre_tokenizer", pre_tokenizer_json(options.pattern)},
                {"post_processor", post},    {"decoder", byte_level_step(true)}, {"model", model}};
  return j.dump(1) + "\n";
}

void TrainedBpe::save(const std::string& path) const { io::write_text_atomically(path, to_json()); }

}  // namespace qforge::text
