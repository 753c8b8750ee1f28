// Writes the GGUF files llama.cpp runs in gguf_llamacpp (run_llamacpp.js) with what qforge computes
// for them: for a tiny GPT-2 and a tiny Llama, float (F32 and Q8_0 by ggml's quantizer) and frozen
// (W8 per-channel -> Q8_0, W4 g32 -> Q4_0), and a tied-head Llama (F32): the prompt's greedy
// continuation by qforge and, for every generated step, qforge's next-token probabilities.
// Usage: gguf_llamacpp_tool OUT_DIR
#include <ATen/ATen.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "framework/api/quantize.h"
#include "framework/models/generation.h"
#include "framework/models/gguf_export.h"
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

template <typename Model>
nlohmann::json run_case(const std::string& name, Model& m, const qm::GgufExportOptions& o, const std::string& dir,
                        const std::string& compares) {
  const std::string file = name + ".gguf";
  const qm::GgufExportReport report = qm::export_gguf(m, dir + "/" + file, o);
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
  j["report"] = report.str();
  return j;
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
    std::ofstream(dir + "/manifest.json") << nlohmann::json{{"cases", cases}}.dump(1);
  } catch (const std::exception& e) {
    std::cerr << "gguf_llamacpp_tool: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
