// A crafted report.json whose layers carry BERT's names (over 40 characters, sharing their first
// 36): report_html_test checks the page's specs from it, report_html_tool writes it through
// write_report_files for the browser test.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace qforge {

inline std::vector<std::string> long_layer_names() {
  std::vector<std::string> names;
  for (const char* layer : {"1", "10", "11"})
    for (const char* leaf : {"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                             "intermediate.dense", "output.dense"})
      names.push_back(std::string("bert.encoder.layer.") + layer + "." + leaf);
  names.push_back("classifier");
  return names;
}

// The keys qtrain writes for a float stage, a search and the numeric suite, every layer in the
// layer table, the numeric suite's SQNR and the search's choice; a Pareto front of three points,
// the chosen one first.
inline nlohmann::json long_names_report() {
  nlohmann::json table = nlohmann::json::array(), errors = nlohmann::json::array(), chosen = nlohmann::json::array();
  double db = 20.0;
  for (const std::string& n : long_layer_names()) {
    table.push_back({{"name", n}, {"type", "Linear"}, {"weights", "qint4 per_channel"}, {"activations", "qint8 per_tensor"},
                     {"kernel", "gemm_s8s4f32_n16k8_avx512vnni"}, {"fallback_reason", ""}, {"bytes", 294912}});
    errors.push_back({{"path", n}, {"type", "Linear"}, {"weight_sqnr_db", db + 10}, {"own_sqnr_db", db + 5}, {"accumulated_sqnr_db", db},
                      {"clipped_fraction", 0.001}, {"nonfinite_inputs", 0}, {"note", ""}});
    chosen.push_back({{"path", n}, {"qtype", db < 26 ? "qint8 per_channel" : "qint4 per_channel"}, {"bytes", 294912},
                      {"latency_ms", 0.05}, {"sensitivity", 1.0 / db}, {"kernel", "gemm_s8s4f32_n16k8_avx512vnni"},
                      {"input_shape", {32, 768}}});
    db += 0.5;
  }
  const nlohmann::json pareto = {{{"bytes", 3000000}, {"latency_ms", 2.0}, {"predicted", 0.01}, {"chosen", true}, {"accuracy", 0.9}},
                                 {{"bytes", 2000000}, {"latency_ms", 1.5}, {"predicted", 0.5}},
                                 {{"bytes", 6000000}, {"latency_ms", 3.0}, {"predicted", 0.001}}};
  return {{"metric", "accuracy"},
          {"metrics", {{"float", {{"accuracy", 0.91}, {"loss", 0.3}}}}},
          {"timings_s", {{"float", 1.0}, {"search", 2.0}, {"total", 3.0}}},
          {"size_bytes", {{"float", 12000000}}},
          {"notes", nlohmann::json::array()},
          {"layers", table},
          {"layer_errors", {{"batches", 2}, {"layers", errors}}},
          {"search",
           {{"method", "hessian"}, {"budget", "size_mb: 4"}, {"budget_bytes", 4000000.0}, {"budget_latency_ms", nullptr},
            {"bytes", 3000000}, {"float_bytes", 12000000}, {"latency_ms", 2.0}, {"float_latency_ms", 6.0},
            {"latency_regime", "batch"}, {"cpu", "x86-64"}, {"threads", 1}, {"seconds", 2.0},
            {"pareto_axis", "bytes"}, {"layers", chosen}, {"pareto", pareto}}}};
}

}  // namespace qforge
