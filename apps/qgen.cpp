// qgen: text generation with a Llama-family model (Llama, Mistral, Qwen2) from a Hugging Face
// folder or a qforge run directory, optionally quantized and frozen on the fly, greedy or sampled
// (framework/models/sampling.h), streaming the text as it decodes; the timings and memory go to
// stderr. docs/llm.md "qgen" documents the options.
//   qgen MODEL --prompt TEXT [--max-new-tokens 64] [--weights none|w8|w4g128] [--temperature 0]
//        [--top-k 0] [--top-p 1] [--min-p 0] [--repetition-penalty 1] [--seed 0] [--eos ID ...]
//        [--threads N] [--print-ids]
// Exit codes: 0 success, 2 bad arguments, 1 a model that cannot be loaded or run (named).
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "framework/api/quantize.h"
#include "framework/core/error.h"
#include "framework/io/model_io.h"
#include "framework/models/generation.h"
#include "framework/models/llama.h"
#include "framework/ptq/rotate.h"
#include "framework/recipe/task.h"
#include "framework/text/tokenizer.h"

namespace {

using namespace qforge;
namespace fs = std::filesystem;

struct Loaded {
  models::LlamaForCausalLM model{nullptr};
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::vector<int64_t> eos;  // config.json's eos_token_id (a number or a list)
  bool frozen = false;       // a run directory's model.h5 holds frozen layers
};

std::vector<int64_t> eos_ids(const fs::path& config) {
  std::ifstream in(config);
  const nlohmann::json c = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!c.is_object() || !c.contains("eos_token_id") || c["eos_token_id"].is_null()) return {};
  const nlohmann::json& e = c["eos_token_id"];
  QF_REQUIRE(e.is_number_integer() || e.is_array(), config.string(), ": eos_token_id must be an id or a list of ids");
  return e.is_array() ? e.get<std::vector<int64_t>>() : std::vector<int64_t>{e.get<int64_t>()};
}

// What the run did, not what its recipe asked: report.json's ptq.rotate exists only when calibrate
// rotated the model (--stages may have skipped it, leaving model.h5 unrotated); null otherwise.
nlohmann::json recorded_rotation(const fs::path& dir, bool recipe_rotates) {
  std::ifstream in(dir / "report.json");
  const nlohmann::json rep = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!rep.is_object()) {
    QF_REQUIRE(!recipe_rotates, dir.string(), ": the recipe has ptq.rotate: hadamard but report.json is missing or ",
               "unreadable, so whether model.h5 holds rotated weights is unknown");
    return nullptr;
  }
  const nlohmann::json* rotate = rep.contains("ptq") && rep["ptq"].is_object() && rep["ptq"].contains("rotate")
                                     ? &rep["ptq"]["rotate"] : nullptr;
  if (rotate == nullptr) return nullptr;
  QF_REQUIRE(rotate->is_object(), dir.string(), ": report.json's ptq.rotate is not an object");
  return *rotate;
}

// A run directory of `qtrain` on the llama task: its resolved recipe rebuilds the model, model.h5
// fills it (frozen layers included), its tokenizer.json or tokenizer.model tokenizes.
Loaded load_run_directory(const fs::path& dir) {
  Recipe r = load_recipe((dir / "recipe.resolved.yaml").string());
  QF_REQUIRE(r.model.arch == "llama", dir.string(), ": the run's model.arch is '", r.model.arch, "'; qgen runs llama");
  QF_REQUIRE(fs::is_regular_file(dir / "model.h5"), dir.string(), ": no model.h5 (export.checkpoint was off?)");
  QF_REQUIRE(r.data.tokenizer_vocab_size > 0 || !r.data.tokenizer_file.empty(), dir.string(),
             ": the run's model reads bytes (no data.tokenizer); qgen needs a tokenizer");
  for (const char* name : {"tokenizer.json", "tokenizer.model"})
    if (!r.data.tokenizer_file.empty() && fs::is_regular_file(dir / name)) r.data.tokenizer_file = (dir / name).string();
  Task t = make_task(r, /*with_data=*/false);
  Loaded out;
  out.model = models::LlamaForCausalLM(std::dynamic_pointer_cast<models::LlamaForCausalLMImpl>(t.model));
  // model.h5 of a rotated run holds rotated weights: the model needs the structure they came from.
  const nlohmann::json rotation = recorded_rotation(dir, r.ptq.enabled && r.ptq.rotate == "hadamard");
  if (rotation.is_object()) ptq::prepare_rotated_structure(*out.model, rotation.value("online_down_proj", true));
  io::load_model(*t.model, (dir / "model.h5").string());
  out.tokenizer = text::load_tokenizer(dir.string());
  out.frozen = model_size(*t.model).quantized_bytes > 0;
  return out;
}

Loaded load(const std::string& path) {
  const fs::path dir(path);
  QF_REQUIRE(fs::is_directory(dir), path, ": not a folder (an HF folder with config.json, or a qforge run directory)");
  if (fs::is_regular_file(dir / "recipe.resolved.yaml")) return load_run_directory(dir);
  QF_REQUIRE(fs::is_regular_file(dir / "config.json"), path,
             ": neither an HF folder (config.json) nor a qforge run directory (recipe.resolved.yaml)");
  Loaded out;
  out.model = models::load_llama_for_causal_lm(path);
  out.tokenizer = text::load_tokenizer(path);
  out.eos = eos_ids(dir / "config.json");
  return out;
}

// Weight-only int8 per channel or int4 in groups of 128; the embedding stays float, a tied head
// gets its own quantized copy.
void quantize_weights(Loaded& m, const std::string& weights) {
  if (weights == "none") return;
  QF_REQUIRE(!m.frozen, "--weights ", weights, ": the run directory's model is already quantized and frozen");
  if (m.model->config.tie_word_embeddings) m.model->untie_lm_head();
  Scheme s(weights == "w8" ? qint8 : qint4);
  if (weights == "w4g128") s.weight_granularity = Granularity::kPerGroup, s.group_size = 128;
  LayerRule keep;
  keep.pattern = "model.embed_tokens";
  keep.keep_float = true;
  s.rules.push_back(keep);
  quantize(m.model, s);
  freeze(m.model);
}

// Prints the decoded continuation as it grows, holding back a trailing partial UTF-8 character.
class Streamer {
 public:
  explicit Streamer(const text::Tokenizer& t) : tok_(t) {}
  void add(int64_t id) {
    ids_.push_back(id);
    const std::string text = tok_.decode(ids_, /*skip_special_tokens=*/true);
    if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return;
    if (text.compare(0, printed_.size(), printed_) == 0) std::fputs(text.c_str() + printed_.size(), stdout);
    else std::fputs(("\n" + text).c_str(), stdout);  // a decoder that rewrote earlier text: print it whole
    std::fflush(stdout);
    printed_ = text;
  }

 private:
  const text::Tokenizer& tok_;
  std::vector<int64_t> ids_;
  std::string printed_;
};

void report(const models::GenerationResult& r, const Loaded& m, const std::vector<int64_t>& prompt, bool print_ids) {
  const ModelSize size = model_size(*m.model);
  std::fprintf(stderr, "\nqgen: prompt %lld tokens in %.3f s (%.1f tokens/s); decode %lld tokens in %.3f s (%.1f tokens/s); %s\n",
               static_cast<long long>(r.prompt_tokens), r.prompt_seconds, r.prompt_tokens_per_second(),
               static_cast<long long>(r.new_tokens - 1), r.decode_seconds, r.decode_tokens_per_second(),
               r.stopped_at_eos ? "stopped at eos" : "stopped at --max-new-tokens");
  std::fprintf(stderr, "qgen: model %.3f MB (%.3f MB float tensors, %.3f MB packed weights); KV cache %.3f MB for %lld positions\n",
               size.total_bytes / 1e6, size.float_bytes / 1e6, size.quantized_bytes / 1e6, r.cache_bytes / 1e6,
               static_cast<long long>(r.prompt_tokens + r.new_tokens - 1));
  if (!print_ids) return;
  std::string ids;
  for (int64_t id : prompt) ids += std::to_string(id) + " ";
  ids += "|";
  const at::Tensor t = r.tokens.contiguous();
  for (int64_t i = 0; i < t.numel(); ++i) ids += " " + std::to_string(t.data_ptr<int64_t>()[i]);
  std::fprintf(stderr, "qgen: ids %s\n", ids.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qgen: generate text with a Llama-family model (HF folder or qforge run directory)"};
  std::string model_path, prompt, weights = "none";
  models::GenerateOptions o;
  o.sampling.temperature = 0;
  int threads = 0;
  bool print_ids = false;
  app.add_option("model", model_path, "HF folder (config.json, safetensors, tokenizer) or qtrain run directory")->required();
  app.add_option("--prompt", prompt, "prompt text")->required();
  app.add_option("--max-new-tokens", o.max_new_tokens, "stop after this many new tokens")->check(CLI::Range(1, 1 << 20));
  app.add_option("--weights", weights, "quantize and freeze the float model's weights first")
      ->check(CLI::IsMember({"none", "w8", "w4g128"}));
  app.add_option("--temperature", o.sampling.temperature, "0: greedy (default); > 0: sample")->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", o.sampling.top_k, "keep the k most likely tokens (0: off)")->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", o.sampling.top_p, "nucleus: keep the most likely tokens up to this mass (1: off)");
  app.add_option("--min-p", o.sampling.min_p, "keep tokens with p >= min_p * max p (0: off)");
  app.add_option("--repetition-penalty", o.sampling.repetition_penalty, "CTRL's penalty on seen tokens (1: off)");
  app.add_option("--seed", o.sampling.seed, "sampling seed (the same seed gives the same text)");
  app.add_option("--eos", o.eos, "stop after this id (repeatable; default: config.json's eos_token_id)");
  app.add_option("--threads", threads, "intra-op threads (0: LibTorch's default)")->check(CLI::NonNegativeNumber);
  app.add_flag("--print-ids", print_ids, "print the prompt's and the new token ids to stderr");
  try {
    app.parse(argc, argv);
    o.sampling.validate();
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qgen: %s\n", e.what());
    return 2;
  }
  if (threads > 0) at::set_num_threads(threads);
  try {
    Loaded m = load(model_path);
    quantize_weights(m, weights);
    m.model->eval();
    if (o.eos.empty()) o.eos = m.eos;
    const std::vector<int64_t> ids = m.tokenizer->encode(prompt);
    QF_REQUIRE(!ids.empty(), "the prompt encodes to no tokens");
    std::fputs(prompt.c_str(), stdout);
    Streamer stream(*m.tokenizer);
    const models::CachedLmForward fwd = [&](const at::Tensor& x, models::KvCache* c) { return m.model->forward(x, c); };
    const models::GenerationResult r =
        models::generate(fwd, at::tensor(ids, at::kLong).unsqueeze(0), o, [&](int64_t id) { stream.add(id); });
    report(r, m, ids, print_ids);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nqgen: %s\n", e.what());
    return 1;
  }
  return 0;
}
