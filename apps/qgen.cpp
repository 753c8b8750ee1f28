// qgen: text generation with a Llama-family model (Llama, Mistral, Qwen2) from a Hugging Face
// folder or a qforge run directory, optionally quantized and frozen on the fly, greedy or sampled
// (framework/models/sampling.h), streaming the text as it decodes; or the sliding-window perplexity
// of a text file (framework/models/perplexity.h). The timings and memory go to stderr.
// docs/llm.md "qgen" documents the options.
//   qgen MODEL --prompt TEXT [--max-new-tokens 64] [--weights none|w8|w4g128] [--temperature 0]
//        [--top-k 0] [--top-p 1] [--min-p 0] [--repetition-penalty 1] [--seed 0] [--eos ID ...]
//        [--threads N] [--print-ids]
//   qgen MODEL --perplexity FILE [--window N] [--stride N] [--kl-base BASE] [--weights ...] [--threads N]
// Exit codes: 0 success, 2 bad arguments, 1 a model that cannot be loaded or run, a --perplexity
// file that is missing, empty, not UTF-8 or under 2 tokens, or a --kl-base model whose tokenizer
// encodes the file otherwise (the reason named).
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "apps/elapsed.h"
#include "apps/process_memory.h"
#include "apps/qgen_streamer.h"

#include "framework/api/quantize.h"
#include "framework/core/error.h"
#include "framework/io/model_io.h"
#include "framework/models/generation.h"
#include "framework/models/llama.h"
#include "framework/models/perplexity.h"
#include "framework/ptq/rotate.h"
#include "framework/recipe/task.h"
#include "framework/text/tokenizer.h"
#include "framework/text/utf8.h"

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
    QF_REQUIRE(!recipe_rotates, dir.string(), ": the recipe has ptq.rotate but report.json is missing or ",
               "unreadable, so whether model.h5 holds rotated weights is unknown");
    return nullptr;
  }
  const nlohmann::json* rotate = rep.contains("ptq") && rep["ptq"].is_object() && rep["ptq"].contains("rotate")
                                     ? &rep["ptq"]["rotate"] : nullptr;
  if (rotate == nullptr) return nullptr;
  QF_REQUIRE(rotate->is_object(), dir.string(), ": report.json's ptq.rotate is not an object");
  return *rotate;
}

// `s` as a YAML double-quoted scalar: a --set value that a path's " #" or ": " cannot cut short.
std::string yaml_quoted(const std::string& s) {
  YAML::Emitter e;
  e << YAML::DoubleQuoted << s;
  return e.c_str();
}

// The run's resolved recipe. The tokenizer the export stage copied into the run directory stands in
// for the data.tokenizer.file the run recorded, which may have moved since (the recipe check would
// refuse a missing file); with neither, the error names both paths.
// A malformed file falls to load_recipe, whose error names the file and line.
Recipe load_run_recipe(const fs::path& dir) {
  const std::string resolved = (dir / "recipe.resolved.yaml").string();
  YAML::Node parsed;
  try {
    parsed = YAML::LoadFile(resolved);
  } catch (const YAML::Exception&) {
    return load_recipe(resolved);
  }
  const YAML::Node root = parsed;  // const: a missing key reads as undefined, not an error
  std::string recorded;
  if (const YAML::Node data = root["data"]; data.IsDefined() && data.IsMap())
    if (const YAML::Node tok = data["tokenizer"]; tok.IsDefined() && tok.IsMap())
      if (const YAML::Node file = tok["file"]; file.IsDefined() && file.IsScalar()) recorded = file.as<std::string>();
  if (recorded.empty()) return load_recipe(resolved);
  for (const char* name : {"tokenizer.json", "tokenizer.model"})
    if (fs::is_regular_file(dir / name))
      return load_recipe(resolved, {"data.tokenizer.file=" + yaml_quoted((dir / name).string())});
  QF_REQUIRE(fs::exists(recorded), dir.string(), ": the run's tokenizer is gone: data.tokenizer.file ", recorded,
             " does not exist (moved?) and the run directory holds no copy (", (dir / "tokenizer.json").string(),
             " or tokenizer.model); put the tokenizer back at either path");
  return load_recipe(resolved);
}

// A run directory of `qtrain` on the llama task: its resolved recipe rebuilds the model, model.h5
// fills it (frozen layers included), its tokenizer.json or tokenizer.model tokenizes.
Loaded load_run_directory(const fs::path& dir) {
  Recipe r = load_run_recipe(dir);
  QF_REQUIRE(r.model.arch == "llama", dir.string(), ": the run's model.arch is '", r.model.arch, "'; qgen runs llama");
  QF_REQUIRE(fs::is_regular_file(dir / "model.h5"), dir.string(), ": no model.h5 (export.checkpoint was off?)");
  QF_REQUIRE(r.data.tokenizer_vocab_size > 0 || !r.data.tokenizer_file.empty(), dir.string(),
             ": the run's model reads bytes (no data.tokenizer); qgen needs a tokenizer");
  Task t = make_task(r, /*with_data=*/false);
  Loaded out;
  out.model = models::LlamaForCausalLM(std::dynamic_pointer_cast<models::LlamaForCausalLMImpl>(t.model));
  // model.h5 of a rotated run holds rotated weights: the model needs the structure they came from.
  const nlohmann::json rotation = recorded_rotation(dir, r.ptq.enabled && r.ptq.rotates());
  if (rotation.is_object()) {
    ptq::RotateOptions o;
    o.online_down_proj = rotation.value("online_down_proj", true);
    o.online_qk = rotation.value("online_qk", false);  // runs before the KV-cache rotation have no key
    ptq::prepare_rotated_structure(*out.model, o);
  }
  io::load_model(*t.model, (dir / "model.h5").string());
  out.tokenizer = text::load_tokenizer(r.data.tokenizer_file.empty() ? dir.string() : r.data.tokenizer_file);
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

// The process's resident set from the kernel, beside the tensor bytes counted above it.
void report_resident_memory() {
  const int64_t rss = apps::status_kib("VmRSS"), hwm = apps::status_kib("VmHWM");
  if (rss < 0 || hwm < 0) {
    std::fputs("qgen: process resident memory unknown (no /proc/self/status)\n", stderr);
    return;
  }
  std::fprintf(stderr, "qgen: process resident memory %.3f MB now (VmRSS), %.3f MB at peak (VmHWM)\n", rss * 1024 / 1e6,
               hwm * 1024 / 1e6);
}

void report(const models::GenerationResult& r, const Loaded& m, const std::vector<int64_t>& prompt,
            const apps::Streamer& stream, bool print_ids) {
  const ModelSize size = model_size(*m.model);
  std::fprintf(stderr, "\nqgen: %s\n", apps::phase_times(r, stream).c_str());
  std::fprintf(stderr, "qgen: model %.3f MB (%.3f MB float tensors, %.3f MB packed weights); KV cache %.3f MB for %lld positions\n",
               size.total_bytes / 1e6, size.float_bytes / 1e6, size.quantized_bytes / 1e6, r.cache_bytes / 1e6,
               static_cast<long long>(r.prompt_tokens + r.new_tokens - 1));
  report_resident_memory();
  if (!print_ids) return;
  std::string ids;
  for (int64_t id : prompt) ids += std::to_string(id) + " ";
  ids += "|";
  const at::Tensor t = r.tokens.contiguous();
  for (int64_t i = 0; i < t.numel(); ++i) ids += " " + std::to_string(t.data_ptr<int64_t>()[i]);
  std::fprintf(stderr, "qgen: ids %s\n", ids.c_str());
}

// The ids of a text file for --perplexity: its bytes as they are (no newline stripped), valid UTF-8.
std::vector<int64_t> file_tokens(const std::string& path, const text::Tokenizer& tok) {
  QF_REQUIRE(fs::is_regular_file(path), "--perplexity ", path, ": not a file");
  std::ifstream in(path, std::ios::binary);
  QF_REQUIRE(in, "--perplexity ", path, ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  QF_REQUIRE(!text.empty(), "--perplexity ", path, ": the file is empty; nothing to score");
  text::require_utf8(text, "--perplexity " + path);
  std::vector<int64_t> ids = tok.encode(text);
  QF_REQUIRE(ids.size() >= 2, "--perplexity ", path, ": the text encodes to ", ids.size(),
             " token(s); perplexity needs at least 2");
  return ids;
}

struct PerplexityArgs {
  std::string file;
  int64_t window = 0, stride = 0;  // 0: min(1024, max_position_embeddings) and window / 2
  std::string kl_base;             // --kl-base: the model the divergence is measured from ("": none)
};

// --kl-base: the base model, its tokens of the file checked against the model's.
Loaded load_kl_base(const PerplexityArgs& a, const std::vector<int64_t>& ids) {
  Loaded base = load(a.kl_base);
  base.model->eval();
  const std::vector<int64_t> base_ids = file_tokens(a.file, *base.tokenizer);
  if (base_ids != ids) {
    const auto diff = std::mismatch(ids.begin(), ids.end(), base_ids.begin(), base_ids.end());
    throw Error("--kl-base " + a.kl_base + ": its tokenizer encodes " + a.file + " to " +
                std::to_string(base_ids.size()) + " ids and the model's to " + std::to_string(ids.size()) +
                " (first difference at id " + std::to_string(diff.first - ids.begin()) +
                "); the divergence needs the same tokens");
  }
  return base;
}

// Sliding-window perplexity of the file, with progress (and an ETA) on stderr at most once a second;
// with --kl-base, the KL divergence of the model's next-token distributions from the base model's
// over the same windows, with both perplexities (models::sliding_window_kl_divergence).
void run_perplexity(Loaded& m, const PerplexityArgs& a) {
  const std::vector<int64_t> ids = file_tokens(a.file, *m.tokenizer);
  std::optional<Loaded> base;
  if (!a.kl_base.empty()) base = load_kl_base(a, ids);
  const int64_t positions = m.model->config.max_position_embeddings;
  const int64_t base_positions = base ? base->model->config.max_position_embeddings : positions;
  models::PerplexityOptions o;  // the default window fits every model scored
  o.max_length = a.window > 0 ? a.window : std::min<int64_t>({1024, positions, base_positions});
  o.stride = a.stride > 0 ? a.stride : std::max<int64_t>(1, o.max_length / 2);
  QF_REQUIRE(o.max_length <= positions, "--window ", o.max_length, " exceeds the model's max_position_embeddings ", positions);
  QF_REQUIRE(o.max_length <= base_positions, "--window ", o.max_length, " exceeds the base model's max_position_embeddings ",
             base_positions);
  QF_REQUIRE(o.stride <= o.max_length, "--stride ", o.stride, " exceeds the window of ", o.max_length, " tokens");
  const auto t0 = std::chrono::steady_clock::now();
  double last_print = -1;
  const auto progress = [&](const models::PerplexityProgress& p) {
    const double t = apps::seconds_since(t0);
    if (t - last_print < 1 && p.windows_done != 1 && p.windows_done != p.windows_total) return;
    last_print = t;
    std::fprintf(stderr, "qgen: perplexity window %lld/%lld, %lld/%lld tokens scored, %.1f s, ETA %.1f s\n",
                 static_cast<long long>(p.windows_done), static_cast<long long>(p.windows_total),
                 static_cast<long long>(p.tokens_scored), static_cast<long long>(p.tokens_total), t,
                 t / p.windows_done * (p.windows_total - p.windows_done));
  };
  const models::CausalLmForward fwd = [&](const at::Tensor& x) { return m.model->forward(x); };
  const at::Tensor tokens = at::tensor(ids, at::kLong);
  if (base) {
    const models::KlDivergenceResult r = models::sliding_window_kl_divergence(
        [&](const at::Tensor& x) { return base->model->forward(x); }, fwd, tokens, o, progress);
    std::printf("qgen: KL divergence from %s over %lld tokens of %s in %lld windows of %lld, stride %lld: mean %.6g, "
                "median %.6g, 99th percentile %.6g, max %.6g nats/token; same top token %.2f %%; perplexity %.8g "
                "(base %.8g, ln ratio %.6f)\n",
                a.kl_base.c_str(), static_cast<long long>(r.test.tokens_scored), a.file.c_str(),
                static_cast<long long>(r.test.windows), static_cast<long long>(o.max_length),
                static_cast<long long>(o.stride), r.mean_kl, r.median_kl, r.p99_kl, r.max_kl, 100 * r.same_top_token,
                r.test.perplexity, r.base.perplexity, r.test.nll_per_token - r.base.nll_per_token);
    const double seconds = apps::seconds_since(t0);
    std::fprintf(stderr, "qgen: scored in %.3f s (%.1f tokens/s, both models)\n", seconds,
                 r.test.tokens_scored / std::max(seconds, 1e-9));
  } else {
    const models::PerplexityResult r = models::sliding_window_perplexity(fwd, tokens, o, progress);
    const double seconds = apps::seconds_since(t0);
    std::printf("qgen: perplexity %.8g (%.6f nats/token) over %lld tokens of %s in %lld windows of %lld, stride %lld\n",
                r.perplexity, r.nll_per_token, static_cast<long long>(r.tokens_scored), a.file.c_str(),
                static_cast<long long>(r.windows), static_cast<long long>(r.max_length), static_cast<long long>(r.stride));
    std::fprintf(stderr, "qgen: scored in %.3f s (%.1f tokens/s); model %.3f MB of tensors\n", seconds,
                 r.tokens_scored / std::max(seconds, 1e-9), model_size(*m.model).total_bytes / 1e6);
  }
  report_resident_memory();
}

// The options of `names` given on the command line, comma-separated ("" for none).
std::string given_options(const CLI::App& app, std::initializer_list<const char*> names) {
  std::string given;
  for (const char* name : names)
    if (app.count(name) > 0) given += std::string(given.empty() ? "" : ", ") + name;
  return given;
}

// Greedy decoding takes the argmax: the options that shape a sampled distribution do nothing there.
void warn_unused_sampling_options(const CLI::App& app, const models::SamplingOptions& s) {
  const std::string given = given_options(app, {"--top-k", "--top-p", "--min-p", "--seed"});
  if (s.greedy() && !given.empty())
    std::fprintf(stderr, "qgen: warning: %s ignored: decoding is greedy at --temperature 0 (the default); give "
                 "--temperature > 0 to sample\n", given.c_str());
}

// --perplexity scores the file's own tokens: the options of generation do nothing there.
void warn_unused_generation_options(const CLI::App& app) {
  const std::string given = given_options(app, {"--max-new-tokens", "--temperature", "--top-k", "--top-p", "--min-p",
                                                "--repetition-penalty", "--seed", "--eos", "--print-ids"});
  if (!given.empty())
    std::fprintf(stderr, "qgen: warning: %s ignored: --perplexity scores the file's tokens and generates none\n",
                 given.c_str());
}

void run_generation(Loaded& m, const std::string& prompt, models::GenerateOptions o, bool print_ids) {
  if (o.eos.empty()) o.eos = m.eos;
  const std::vector<int64_t> ids = m.tokenizer->encode(prompt);
  QF_REQUIRE(!ids.empty(), "the prompt encodes to no tokens");
  std::fputs(prompt.c_str(), stdout);
  apps::Streamer stream(*m.tokenizer);
  const models::CachedLmForward fwd = [&](const at::Tensor& x, models::KvCache* c) { return m.model->forward(x, c); };
  const models::GenerationResult r =
      models::generate(fwd, at::tensor(ids, at::kLong).unsqueeze(0), o, [&](int64_t id) { stream.add(id); });
  report(r, m, ids, stream, print_ids);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qgen: generate text with a Llama-family model (HF folder or qforge run directory), or score a text file"};
  std::string model_path, prompt, weights = "none";
  PerplexityArgs ppl;
  models::GenerateOptions o;
  o.sampling.temperature = 0;
  int threads = 0;
  bool print_ids = false;
  app.add_option("model", model_path, "HF folder (config.json, safetensors, tokenizer) or qtrain run directory")->required();
  CLI::Option* prompt_opt = app.add_option("--prompt", prompt, "prompt text");
  CLI::Option* ppl_opt = app.add_option("--perplexity", ppl.file, "score this UTF-8 text file (sliding-window perplexity)");
  prompt_opt->excludes(ppl_opt);
  app.add_option("--window", ppl.window, "--perplexity: tokens per window (default min(1024, max_position_embeddings))")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 30))->needs(ppl_opt);
  app.add_option("--stride", ppl.stride, "--perplexity: tokens between window starts (default window / 2)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))->needs(ppl_opt);
  app.add_option("--kl-base", ppl.kl_base,
                 "--perplexity: also the KL divergence of MODEL's next-token distributions from this model's "
                 "(e.g. the float run), the same windows, the same tokens required")
      ->needs(ppl_opt);
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
    if (prompt_opt->count() == 0 && ppl_opt->count() == 0) throw Error("give --prompt TEXT or --perplexity FILE");
    if (ppl.window > 0 && ppl.stride > ppl.window)
      throw Error("--stride " + std::to_string(ppl.stride) + " exceeds the window of " + std::to_string(ppl.window) + " tokens");
    o.sampling.validate();
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qgen: %s\n", e.what());
    return 2;
  }
  if (prompt_opt->count() > 0) warn_unused_sampling_options(app, o.sampling);
  else warn_unused_generation_options(app);
  if (threads > 0) at::set_num_threads(threads);
  try {
    Loaded m = load(model_path);
    quantize_weights(m, weights);
    m.model->eval();
    if (ppl_opt->count() > 0) run_perplexity(m, ppl);
    else run_generation(m, prompt, o, print_ids);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nqgen: %s\n", e.what());
    return 1;
  }
  return 0;
}
