// The recipe's ptq section: derived fields and the checks against the rest of the recipe (split
// from recipe.cpp; recipe_where.h).
#include <string>
#include <utility>

#include "framework/recipe/recipe_where.h"

namespace qforge::recipe_detail {

namespace {

// ptq.rotate: hadamard changes the model in the calibrate stage; what would act on the model as
// it was before, or ignore the online transform, is refused up front instead of failing or lying.
void check_rotate_partners(const Recipe& r, const Where& w) {
  if (r.ptq.awq)
    w.problem("ptq.method", r.ptq.rotate_down_proj
                                ? "AWQ's per-channel scales would cross down_proj's online Hadamard transform after "
                                  "ptq.rotate: hadamard; use rtn or gptq with the rotation"
                                : "AWQ on a rotated model is not built (its scales were never checked against the "
                                  "folded norms); use rtn or gptq with the rotation");
  if (r.search.enabled)
    w.problem("ptq.rotate", "the search stage runs before calibrate rotates the model, so its sensitivities and "
                            "latencies would describe the unrotated model; drop the search or the rotation");
  // Without online transforms a rotated model is a plain one with turned weights, which any reader runs.
  const std::string online = r.ptq.online_rotations();
  if (online.empty()) return;
  if (r.export_.safetensors)
    w.problem("export.safetensors", "a rotated model's safetensors need qforge's online Hadamard transforms (" + online +
                                        "), which other readers do not apply; set export.safetensors: false (or "
                                        "ptq.rotate_online off)");
  if (r.export_.gguf.enabled)
    w.problem("export.gguf", "a rotated model needs qforge's online Hadamard transforms (" + online +
                                 "), which llama.cpp does not apply; drop export.gguf or the rotation (or "
                                 "ptq.rotate_online off)");
}

}  // namespace

void read_ptq(Recipe& r, const YAML::Node& pn, const Where& w) {
  Recipe::Ptq& p = r.ptq;
  // AWQ scales the weights before calibration; the rounding after it is RTN or GPTQ.
  if (p.method == "awq" || p.method == "awq+gptq") {
    p.awq = true;
    p.method = p.method == "awq" ? "rtn" : "gptq";
  }
  const Recipe::Ptq defaults;
  if (!p.awq && (p.awq_grid != defaults.awq_grid || p.awq_clip != defaults.awq_clip ||
                 p.awq_scales != defaults.awq_scales || p.awq_objective != defaults.awq_objective))
    w.problem("ptq.awq", "AWQ options without AWQ: set ptq.method to awq or awq+gptq");
  if (pn["rules"])
    for (size_t i = 0; i < pn["rules"].size(); ++i) {
      const YAML::Node rn = pn["rules"][i];
      const std::string key = "ptq.rules[" + std::to_string(i) + "]";
      if (!rn["pattern"] || !rn["method"]) {
        w.ctx.add(w.at("ptq").file, rn.Mark(), key, "every rule needs a pattern and a method");
        continue;
      }
      p.rules.emplace_back(rn["pattern"].as<std::string>(), rn["method"].as<std::string>());
      p.rule_sites.push_back(w.site(key));
    }
  bool autoround = p.method == "autoround";
  for (const auto& [pattern, m] : p.rules) autoround |= m == "autoround";
  if (!autoround && (p.autoround_iterations != defaults.autoround_iterations || p.autoround_lr != defaults.autoround_lr ||
                     p.autoround_batch_size != defaults.autoround_batch_size))
    w.problem("ptq.autoround", "AutoRound options without AutoRound: set ptq.method (or a rule's method) to autoround");
  bool brecq = p.method == "brecq";
  for (const auto& [pattern, m] : p.rules) brecq |= m == "brecq";
  if (!brecq && (p.brecq_iterations != defaults.brecq_iterations || p.brecq_lr != defaults.brecq_lr ||
                 p.brecq_reg_weight != defaults.brecq_reg_weight || p.brecq_batch_size != defaults.brecq_batch_size ||
                 p.brecq_fisher != defaults.brecq_fisher))
    w.problem("ptq.brecq", "BRECQ options without BRECQ: set ptq.method (or a rule's method) to brecq");
  for (const auto& [on, name] : {std::pair{autoround, "AutoRound"}, std::pair{brecq, "BRECQ"}})
    if (on && r.model.arch != "llama" && r.model.arch != "gpt2")
      w.problem("ptq.method", std::string(name) + " reconstructs transformer blocks of Llama-family and GPT-2 models "
                              "(arch llama or gpt2), not " + r.model.arch);
  if (p.rotates() && r.model.arch != "llama")
    w.problem("ptq.rotate", "the Hadamard rotation needs an RMSNorm model (arch llama: Llama, Mistral, Qwen2), not " +
                                r.model.arch);
  if (p.rotates()) check_rotate_partners(r, w);
  if (p.rotate != "spinquant" && (p.spinquant_steps != defaults.spinquant_steps || p.spinquant_lr != defaults.spinquant_lr ||
                                  p.spinquant_batches != defaults.spinquant_batches ||
                                  p.spinquant_weights != defaults.spinquant_weights ||
                                  p.spinquant_objective != defaults.spinquant_objective))
    w.problem("ptq.spinquant", "SpinQuant options without ptq.rotate: spinquant");
  if (p.rotate == "spinquant" && p.spinquant_weights == "float" && !r.dynamic_activations() && !r.kv_cache.quantized())
    w.problem("ptq.spinquant.weights", "with float weights, no dynamic activations and a float KV cache nothing is "
                                       "quantized while learning, so the loss is the float model's, which no rotation "
                                       "changes; use quantized (or auto)");
  if (p.rotate == "spinquant" && r.kv_cache.is_static())
    w.problem("ptq.rotate", "spinquant learns with a dynamic KV cache or a float one; a static cache is calibrated "
                            "after the rotations are learned, so set quantize.kv_cache.scales: dynamic, or "
                            "ptq.rotate: hadamard");
  // Turning an online transform off means nothing without the rotation (the resolved recipe writes
  // the defaults, true, everywhere).
  for (const auto& [key, on] : {std::pair{"ptq.rotate_online.down_proj", p.rotate_down_proj},
                                std::pair{"ptq.rotate_online.qk", p.rotate_qk}})
    if (!p.rotates() && !on) w.problem(key, "has no effect without ptq.rotate: hadamard or spinquant");
  if (!p.rotates() && p.rotate_seed != -1) w.problem("ptq.rotate_seed", "has no effect without ptq.rotate: hadamard or spinquant");
  if (!r.quantize) {
    w.problem("ptq", "the PTQ solvers work on a quantized model; add a quantize section");
    return;
  }
  if (p.rounds_beyond_rtn() && !any_weights_quantized(r.scheme))
    w.problem("ptq.method", "AWQ, GPTQ and AdaRound round quantized weights, and quantize.weights.qtype is none");
  bool any_acts = r.scheme.activations != ActivationMode::kNone;
  for (const LayerRule& rule : r.scheme.rules) any_acts |= rule.activations && *rule.activations != ActivationMode::kNone;
  if (p.smoothquant && !any_acts)
    w.problem("ptq.smoothquant", "SmoothQuant eases the quantization of input activations, and the scheme keeps them "
                                 "float (quantize.activations.mode: none)");
}

}  // namespace qforge::recipe_detail

namespace qforge {

bool Recipe::Ptq::rounds_beyond_rtn() const {
  bool rounds = method != "rtn" || awq;
  for (const auto& [pattern, m] : rules) rounds |= m != "rtn";
  return rounds;
}

bool Recipe::dynamic_activations() const {
  bool dynamic = scheme.activations == ActivationMode::kDynamicPerToken;
  for (const LayerRule& rule : scheme.rules)
    dynamic |= !rule.keep_float && rule.activations == ActivationMode::kDynamicPerToken;
  return dynamic;
}

}  // namespace qforge
