// qgen as a user runs it: greedy decoding of the committed tiny HF folder gives the ids
// llama_reference.py's float forward gives (expected_greedy.json), a sampling seed reproduces its
// text, --weights w8 freezes and runs, a qtrain run directory with a trained BPE tokenizer loads
// and generates, and bad input exits 1 or 2 with the reason.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

namespace fs = std::filesystem;

namespace {

struct Outcome {
  int code;
  std::string out, err;
};

const std::string kFolder = std::string(QFORGE_SOURCE_DIR) + "/tests/models/fixtures/qgen_tiny_llama";

Outcome run(const std::string& bin, const std::string& args) {
  const fs::path err = fs::temp_directory_path() / ("qforge_qgen_err_" + std::to_string(::getpid()));
  const std::string cmd = std::string("cd ") + QFORGE_SOURCE_DIR + " && " + bin + " " + args + " 2>" + err.string();
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  std::ifstream e(err);
  std::stringstream es;
  es << e.rdbuf();
  fs::remove(err);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, es.str()};
}

Outcome qgen(const std::string& args) { return run(QGEN_BIN, args); }

// The "qgen: ids P... | N..." line: the new ids.
std::vector<int64_t> new_ids(const std::string& err) {
  const size_t at = err.find("qgen: ids ");
  std::vector<int64_t> out;
  if (at == std::string::npos) return out;
  std::istringstream line(err.substr(err.find('|', at) + 1, err.find('\n', at) - err.find('|', at) - 1));
  for (int64_t id; line >> id;) out.push_back(id);
  return out;
}

TEST(Qgen, GreedyDecodingOfAnHfFolderMatchesTheReferenceForward) {
  std::ifstream in(kFolder + "/expected_greedy.json");
  const nlohmann::json want = nlohmann::json::parse(in);
  const Outcome r = qgen(kFolder + " --prompt '" + want["prompt"].get<std::string>() + "' --max-new-tokens 8 --print-ids");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(new_ids(r.err), want["greedy_ids"].get<std::vector<int64_t>>()) << r.err;
  EXPECT_EQ(r.out.rfind(want["prompt"].get<std::string>(), 0), 0u) << r.out;
  EXPECT_NE(r.err.find("decode 7 tokens in"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stopped at --max-new-tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("KV cache 0.00"), std::string::npos) << r.err;  // 2 layers x 2 x 2 heads x 8 x 23 positions x 4 B
}

TEST(Qgen, ASamplingSeedReproducesItsTextAndW8Freezes) {
  const std::string args = kFolder + " --prompt 'Hello world' --max-new-tokens 12 --temperature 1.5 --top-p 0.95 --min-p 0.02"
                                     " --top-k 50 --repetition-penalty 1.2 --print-ids";
  const Outcome a = qgen(args + " --seed 5"), b = qgen(args + " --seed 5"), c = qgen(args + " --seed 6");
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(new_ids(a.err), new_ids(b.err));
  EXPECT_NE(new_ids(a.err), new_ids(c.err));
  const Outcome w8 = qgen(kFolder + " --prompt 'Hello world' --max-new-tokens 4 --weights w8");
  ASSERT_EQ(w8.code, 0) << w8.err;
  EXPECT_EQ(w8.err.find("0.000 MB packed weights"), std::string::npos) << w8.err;
}

TEST(Qgen, BadInputExitsWithTheReason) {
  Outcome r = qgen("/nonexistent/qforge_model --prompt hi");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("/nonexistent/qforge_model: not a folder"), std::string::npos) << r.err;
  r = qgen(kFolder + " --prompt hi --top-p 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("top_p must be in (0, 1]"), std::string::npos) << r.err;
  r = qgen(kFolder + " --prompt hi --weights w3");
  EXPECT_EQ(r.code, 2);
  // w4g128 on a hidden size of 32: groups of 128 do not fit, each layer says so and takes per_channel.
  r = qgen(kFolder + " --prompt hi --max-new-tokens 2 --weights w4g128");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("dimension 32 is not a multiple of group_size 128; using per_channel"), std::string::npos) << r.err;
  r = qgen(QFORGE_SOURCE_DIR + std::string("/tests/models/fixtures --prompt hi"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("neither an HF folder (config.json) nor a qforge run directory"), std::string::npos) << r.err;
}

// qtrain on the llama task with a trained BPE tokenizer writes a run directory qgen loads: the
// frozen W8 model from model.h5 and tokenizer.json beside it.
TEST(Qgen, LoadsAQtrainRunDirectoryWithItsTrainedTokenizer) {
  const fs::path dir = fs::temp_directory_path() / ("qforge_qgen_run_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string sets =
      " --set data.tokenizer.train.vocab_size=300 --set data.max_train_examples=16 --set data.max_eval_examples=2"
      " --set data.seq_len=32 --set data.batch_size=8 --set train.epochs=1 --set calibrate.batches=1"
      " --set model.config.hidden_size=64 --set model.config.intermediate_size=64 --set model.config.num_hidden_layers=1"
      " --set quantize.weights.qtype=qint8 --set quantize.weights.granularity=per_channel"
      " --set model.checkpoint=" + (dir / "fp32.h5").string();
  const Outcome t = run(QTRAIN_BIN, "--recipe recipes/llama_w4_gptq.yaml --out " + dir.string() + sets);
  ASSERT_EQ(t.code, 0) << t.out << t.err;
  ASSERT_TRUE(fs::is_regular_file(dir / "tokenizer.json"));
  const Outcome r = qgen(dir.string() + " --prompt 'Q: What' --max-new-tokens 6 --print-ids");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(new_ids(r.err).size(), 6u) << r.err;
  EXPECT_EQ(r.err.find("0.000 MB packed weights"), std::string::npos) << r.err;
  const Outcome again = qgen(dir.string() + " --prompt 'Q: What' --max-new-tokens 6 --weights w8");
  EXPECT_EQ(again.code, 1);
  EXPECT_NE(again.err.find("already quantized and frozen"), std::string::npos) << again.err;

  // The hook follows what the run recorded, not the recipe: a recipe asking for ptq.rotate whose
  // report.json has no rotation (calibrate skipped by --stages) holds unrotated weights.
  std::ifstream in(dir / "recipe.resolved.yaml");
  std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t none = yaml.find("\n  rotate: none\n");
  ASSERT_NE(none, std::string::npos) << yaml;
  yaml.replace(none, 16, "\n  rotate: hadamard\n");
  std::ofstream(dir / "recipe.resolved.yaml") << yaml;
  const Outcome unrotated = qgen(dir.string() + " --prompt 'Q: What' --max-new-tokens 6 --print-ids");
  ASSERT_EQ(unrotated.code, 0) << unrotated.err;
  EXPECT_EQ(new_ids(unrotated.err), new_ids(r.err)) << unrotated.err;
  fs::remove(dir / "report.json");
  const Outcome unknown = qgen(dir.string() + " --prompt 'Q: What' --max-new-tokens 6");
  EXPECT_EQ(unknown.code, 1);
  EXPECT_NE(unknown.err.find("report.json is missing or unreadable"), std::string::npos) << unknown.err;
  fs::remove_all(dir);
}

// ptq.rotate on a Llama whose intermediate_size (86 = 2·43) has no Hadamard matrix stops at the
// calibrate stage's check, before the float stage trains (no float checkpoint is written).
TEST(Qgen, QtrainRefusesARotationWithNoHadamardSizeBeforeTraining) {
  const fs::path dir = fs::temp_directory_path() / ("qforge_qgen_norot_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string sets =
      " --set data.max_train_examples=16 --set data.max_eval_examples=2 --set data.seq_len=32"
      " --set train.epochs=1 --set calibrate.batches=1 --set ptq.rotate=hadamard"
      " --set model.config.hidden_size=64 --set model.config.intermediate_size=86 --set model.config.num_hidden_layers=1"
      " --set model.checkpoint=" + (dir / "fp32.h5").string();
  const Outcome t = run(QTRAIN_BIN, "--recipe recipes/llama_w4_gptq.yaml --out " + dir.string() + sets);
  EXPECT_NE(t.code, 0) << t.out << t.err;
  EXPECT_NE(t.err.find("intermediate_size 86 cannot be rotated"), std::string::npos) << t.err;
  EXPECT_FALSE(fs::exists(dir / "fp32.h5"));
  fs::remove_all(dir);
}

}  // namespace
