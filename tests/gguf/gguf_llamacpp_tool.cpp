// Writes the GGUF files llama.cpp runs in gguf_llamacpp (run_llamacpp.js) with what qforge computes
// for them: for a tiny GPT-2 and a tiny Llama, float (F32 and Q8_0 by ggml's quantizer) and frozen
// (W8 per-channel -> Q8_0, W4 g32 -> Q4_0), a tied-head Llama (F32), and the model.gguf of a qtrain
// run (a tiny GPT-2 recipe with export.gguf, its frozen model read back from the run's model.h5):
// the prompt's greedy continuation by qforge and, for every generated step, qforge's next-token
// probabilities.
// Usage: gguf_llamacpp_tool OUT_DIR
#include <ATen/ATen.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "framework/api/quantize.h"
#include "framework/core/error.h"
#include "framework/io/model_io.h"
#include "framework/models/generation.h"
#include "framework/models/gguf_export.h"
#include "framework/models/gguf_load.h"
#include "framework/pipeline/pipeline.h"
#include "framework/recipe/task.h"
#include "tests/gguf/gguf_models.h"

namespace qm = qforge::models;

namespace {

constexpr int64_t kNewTokens = 12;

// Larger weights than HF's init, and a final norm that scales the logits up, so the next-token
// distributions have clear winners and a greedy mismatch means a wrong computation, not a tie.
void sharpen(torch::nn::Module& m) {
  at::NoGradGuard ng;
  for (auto& p : m.named_parameters()) {
    if (p.value().dim() == 2) p.value().mul_(4.0);
    if (p.key() == "model.norm.weight" || p.key() == "transformer.ln_f.weight") p.value().mul_(8.0);
  }
}

// qforge's side of one case: `file` (relative to the manifest) holds m's weights.
template <typename Model>
nlohmann::json qforge_case(const std::string& name, Model& m, const std::string& file, const std::string& compares,
                           const std::string& report) {
  at::NoGradGuard ng;
  const at::Tensor prompt = at::arange(65, 65 + 8, at::kLong).unsqueeze(0);  // "ABCDEFGH"
  auto forward = [&](const at::Tensor& ids, qm::KvCache* cache) { return m->forward(ids, cache); };
  const at::Tensor greedy = qm::greedy_generate(forward, prompt, kNewTokens).tokens;
  // One full forward over prompt + continuation: position T - 1 + i predicts greedy token i.
  const at::Tensor all = at::cat({prompt, greedy}, 1);
  const at::Tensor probs = at::softmax(m->forward(all).narrow(1, prompt.size(1) - 1, kNewTokens)[0], -1);
  nlohmann::json j;
  j["name"] = name, j["file"] = file, j["compares"] = compares;
  j["prompt"] = std::vector<int64_t>(prompt.data_ptr<int64_t>(), prompt.data_ptr<int64_t>() + prompt.numel());
  j["greedy"] = std::vector<int64_t>(greedy.data_ptr<int64_t>(), greedy.data_ptr<int64_t>() + greedy.numel());
  for (int64_t s = 0; s < kNewTokens; ++s) {
    const at::Tensor p = probs[s].contiguous();
    j["probs"].push_back(std::vector<float>(p.data_ptr<float>(), p.data_ptr<float>() + p.numel()));
  }
  j["report"] = report;
  return j;
}

template <typename Model>
nlohmann::json run_case(const std::string& name, Model& m, const qm::GgufExportOptions& o, const std::string& dir,
                        const std::string& compares) {
  const std::string file = name + ".gguf";
  const qm::GgufExportReport report = qm::export_gguf(m, dir + "/" + file, o);
  return qforge_case(name, m, file, compares, report.str());
}

// A tiny GPT-2 recipe with export.gguf (W4 g32 -> Q4_0, the float embedding as Q8_0), run by the
// pipeline as qtrain runs it; its frozen model is rebuilt from the run's resolved recipe and model.h5.
nlohmann::json recipe_case(const std::string& dir) {
  const std::string run = dir + "/gpt2_recipe_w4g32";
  std::ofstream(dir + "/gpt2_recipe.yaml") << "seed: 0\n"
      "model: {arch: gpt2, config: {n_embd: 64, n_layer: 2, n_head: 4, n_positions: 64}}\n"
      "data: {dataset: fortunes, batch_size: 16, seq_len: 32, max_train_examples: 2048, max_eval_examples: 64}\n"
      "train: {epochs: 1, lr: 0.003, max_steps: 60}\n"
      "quantize:\n"
      "  weights: {qtype: qint4, granularity: per_group, group_size: 32, symmetric: true}\n"
      "  activations: {mode: none}\n"
      "  rules: [{pattern: transformer.wte, keep_float: true}]\n"
      "calibrate: {batches: 2}\n"
      "freeze: {enabled: true}\n"
      "export: {calibration_dump: false, gguf: {float_type: q8_0, refuse_wider: true}}\n";
  qforge::PipelineOptions po;
  po.out_dir = run;
  qforge::run_pipeline(qforge::load_recipe(dir + "/gpt2_recipe.yaml"), po);
  std::ifstream in(run + "/report.json");
  const nlohmann::json rep = nlohmann::json::parse(in);
  const nlohmann::json& lines = rep.at("gguf").at("tensors");
  QF_REQUIRE(lines.size() > 10 && lines.dump().find("Q4_0") != std::string::npos, "report.json's gguf lines: ", lines.dump());
  std::string report;
  for (const auto& l : lines) report += l.get<std::string>() + "\n";
  const qforge::Recipe r = qforge::load_recipe(run + "/recipe.resolved.yaml");
  qforge::Task t = qforge::make_task(r, /*with_data=*/false);
  qforge::io::load_model(*t.model, run + "/model.h5");
  qm::Gpt2LMHeadModel m(std::dynamic_pointer_cast<qm::Gpt2LMHeadModelImpl>(t.model));
  m->eval();
  return qforge_case("gpt2_recipe_w4g32", m, "gpt2_recipe_w4g32/model.gguf", "qtrain's export.gguf of a trained W4 g32 GPT-2",
                     report);
}

template <typename Model, typename Make>
void add_cases(nlohmann::json& cases, const std::string& arch, Make make, const std::string& dir) {
  qm::GgufExportOptions f32, q8;
  q8.float_type = qforge::io::GgmlType::kQ8_0;
  Model m = make();
  sharpen(*m);
  cases.push_back(run_case(arch + "_float_f32", m, f32, dir, "F32 of the float model"));
  cases.push_back(run_case(arch + "_float_q8_0", m, q8, dir, "Q8_0 (ggml's quantizer) of the float model"));
  for (auto [label, scheme] : {std::pair{"w8", qforge::Scheme(qforge::qint8)}, std::pair{"w4g32", qm::w4_g32_scheme()}}) {
    Model q = make();
    sharpen(*q);
    if (q->config.tie_word_embeddings) q->untie_lm_head();  // the head is frozen apart from the embedding
    qforge::quantize(q, scheme);
    qforge::freeze(q);
    cases.push_back(run_case(arch + "_frozen_" + label, q, f32, dir,
                             std::string("frozen ") + label + " (codes kept) of the same weights"));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: gguf_llamacpp_tool OUT_DIR\n";
    return 2;
  }
  const std::string dir = argv[1];
  try {
    at::set_num_threads(1);
    nlohmann::json cases = nlohmann::json::array();
    add_cases<qm::LlamaForCausalLM>(cases, "llama", [] { return qm::tiny_gguf_llama(); }, dir);
    add_cases<qm::Gpt2LMHeadModel>(cases, "gpt2", [] { return qm::tiny_gguf_gpt2(); }, dir);
    // A tied Llama has no `output` tensor: llama.cpp computes the logits with token_embd.
    qm::LlamaForCausalLM tied = qm::tiny_gguf_llama(13, /*tied=*/true);
    sharpen(*tied);
    cases.push_back(run_case("llama_tied_f32", tied, {}, dir, "F32 of a float model with a tied head"));
    cases.push_back(recipe_case(dir));
    // A Llama of width 256 (k-quant rows are 256 values).
    qm::LlamaConfig wide = qm::tiny_gguf_llama()->config;
    wide.hidden_size = 256, wide.intermediate_size = 512;
    at::manual_seed(14);
    qm::LlamaForCausalLM w(wide);
    w->init_weights();
    sharpen(*w);
    {
      // Rows four times wider: matrices scaled by 2 instead of 4 and the final norm by 4 instead of 8
      // keep the pre-activations' and logits' spread of the 64-wide models.
      at::NoGradGuard ng;
      for (auto& p : w->named_parameters())
        if (p.value().dim() == 2 || p.key() == "model.norm.weight") p.value().div_(2.0);
    }
    // Q6_K and Q4_K (qforge's quantizers of the formats): qforge computes with the file's decoded weights.
    for (auto [label, type] : {std::pair{"q6_k", qforge::io::GgmlType::kQ6_K}, std::pair{"q4_k", qforge::io::GgmlType::kQ4_K}}) {
      qm::GgufExportOptions k;
      k.float_type = type;
      const std::string name = std::string("llama256_float_") + label, file = name + ".gguf";
      const qm::GgufExportReport report = qm::export_gguf(w, dir + "/" + file, k);
      qm::LlamaForCausalLM decoded = qm::load_gguf(dir + "/" + file).llama;
      cases.push_back(qforge_case(name, decoded, file,
                                  std::string(qforge::io::ggml_type_name(type)) +
                                      " (qforge's quantizer) of a float model, qforge on the decoded weights",
                                  report.str()));
    }
    std::ofstream(dir + "/manifest.json") << nlohmann::json{{"cases", cases}}.dump(1);
  } catch (const std::exception& e) {
    std::cerr << "gguf_llamacpp_tool: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
