// Command-line access to qforge's tokenizers for the fixture script and the Python cross-checks:
//   text_tool train OUT.json VOCAB_SIZE gpt2|llama3|qwen2 [--special S]... [--bos S] [--ignore-merges]
//                   [--pair-merges] [--nfc] FILE...
//   text_tool encode-lines TOKENIZER TEXT_FILE OUT_IDS   (ids of each line, one line each)
#include "framework/core/error.h"
#include "framework/text/bpe_trainer.h"
#include "framework/text/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace qforge::text;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw qforge::Error("text_tool: cannot read " + path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

int train(const std::vector<std::string>& args) {
  if (args.size() < 4) throw qforge::Error("text_tool train: OUT VOCAB_SIZE PATTERN [options] FILE...");
  BpeTrainerOptions o;
  o.vocab_size = std::stoll(args[1]);
  o.pattern = args[2] == "llama3" ? kLlama3Pattern : args[2] == "qwen2" ? kQwen2Pattern : kGpt2Pattern;
  std::vector<std::string> texts;
  for (size_t i = 3; i < args.size(); ++i) {
    if (args[i] == "--special") {
      o.special_tokens.push_back(args.at(++i));
    } else if (args[i] == "--bos") {
      o.bos_token = args.at(++i);
    } else if (args[i] == "--ignore-merges") {
      o.ignore_merges = true;
    } else if (args[i] == "--nfc") {
      o.normalizer = "NFC";
    } else if (args[i] == "--pair-merges") {
      o.merges_as_pairs = true;
    } else {
      texts.push_back(read_file(args[i]));
    }
  }
  const TrainedBpe trained = train_bpe(texts, o);
  trained.save(args[0]);
  std::cout << args[0] << ": " << trained.vocab.size() << " tokens, " << trained.merges.size() << " merges\n";
  return 0;
}

int encode_lines(const std::vector<std::string>& args) {
  if (args.size() != 3) throw qforge::Error("text_tool encode-lines: TOKENIZER TEXT_FILE OUT_IDS");
  const auto tokenizer = load_tokenizer(args[0]);
  std::istringstream in(read_file(args[1]));
  std::ofstream out(args[2]);
  std::string line;
  while (std::getline(in, line)) {
    const auto ids = tokenizer->encode(line, false);
    for (size_t i = 0; i < ids.size(); ++i) out << (i ? " " : "") << ids[i];
    out << "\n";
  }
  return out.good() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> args(argv + std::min(argc, 2), argv + argc);
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "train") return train(args);
    if (cmd == "encode-lines") return encode_lines(args);
    std::cerr << "usage: text_tool train|encode-lines ...\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
