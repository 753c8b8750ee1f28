// Rendering of qtrain's report.json / report.md.
#include "framework/report/report_files.h"

#include "framework/core/utf8.h"
#include "framework/format/atomic_file.h"

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

namespace qforge {

namespace {

namespace fs = std::filesystem;

std::string fmt(double v, int prec = 4) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(prec) << v;
  return os.str();
}

// "float 6.5 ms, frozen 8.1 ms" for the stages `l` has.
std::string per_stage_ms(const nlohmann::json& l) {
  std::string out;
  for (const char* stage : {"float", "frozen"})
    if (l.contains(stage)) out += std::string(out.empty() ? "" : ", ") + stage + " " + fmt(l.at(stage).get<double>(), 3) + " ms";
  return out;
}

// What was timed beside the figures: shape, phase, threads, and whether the machine was idle.
void md_latency(std::ostringstream& md, const nlohmann::json& l) {
  md << "latency: " << per_stage_ms(l);
  if (l.contains("regime") && l.at("regime").is_object()) {
    const auto& r = l.at("regime");
    md << " (" << r.value("phase", std::string("forward")) << ", input " << r.at("input_shape").dump() << ", "
       << r.value("threads", 0) << " thread(s), " << r.value("cache", std::string()) << ", "
       << r.value("statistic", std::string()) << ")";
  }
  md << "\n";
  if (l.contains("decode_step"))
    md << "decode step: " << per_stage_ms(l.at("decode_step")) << " (" << l.at("decode_step").value("phase", std::string())
       << ", context " << l.at("decode_step").value("context", 0) << ")\n";
  if (l.contains("other_busy_cores")) {
    md << "machine while timing:";
    for (const auto& [stage, cores] : l.at("other_busy_cores").items())
      md << " " << stage << " "
         << (cores.is_number() ? (cores.get<double>() < 0.25 ? "idle" : "busy (" + fmt(cores.get<double>(), 2) + " other cores)")
                               : std::string("unknown"));
    md << "\n";
  }
}

// Metrics per stage, wall times, size and latency.
void md_summary(std::ostringstream& md, const nlohmann::json& report, const std::string& recipe_path, const std::string& recipe_sha256) {
  md << "# qtrain report\n\nrecipe `" << recipe_path << "` (sha256 `" << recipe_sha256 << "`)\n\n| stage | ";
  const std::string metric = report.value("metric", std::string("metric"));
  md << metric << " | loss | stage wall s |\n|---|---|---|---|\n";
  const auto& timings = report.at("timings_s");
  for (const char* stage : {"float", "ptq", "qat", "frozen"}) {
    if (!report.at("metrics").contains(stage)) continue;
    const auto& m = report.at("metrics")[stage];
    const std::string timed = std::string(stage) == "frozen" ? "freeze" : stage;
    md << "| " << stage << " | " << fmt(m.value(metric, 0.0)) << " | " << fmt(m.value("loss", 0.0)) << " | "
       << (timings.contains(timed) ? fmt(timings.at(timed).get<double>(), 1) : std::string("-")) << " |\n";
  }
  if (report.contains("eval_examples"))
    md << "\nevaluated on " << report.at("eval_examples").get<int64_t>() << " test examples\n";
  md << "\nwall time per stage:";
  for (const char* stage : {"data", "float", "search", "calibrate", "equalize", "smoothquant", "solve", "ptq", "qat", "layer_errors", "freeze",
                            "freeze_pack", "export", "total"})
    if (timings.contains(stage)) md << " " << stage << " " << fmt(timings.at(stage).get<double>(), 1) << " s;";
  md << "\n";
  if (report.at("size_bytes").contains("float")) {
    const auto& sz = report.at("size_bytes");
    md << "\nsize: " << sz["float"].get<int64_t>() << " bytes float";
    if (sz.contains("frozen"))
      md << ", " << sz["frozen"].get<int64_t>() << " bytes frozen (compression "
         << fmt(static_cast<double>(sz["float"].get<int64_t>()) / static_cast<double>(sz["frozen"].get<int64_t>()), 2)
         << "x)";
    md << "\n";
  }
  if (report.contains("latency_ms") && report.at("latency_ms").contains("float")) md_latency(md, report.at("latency_ms"));
}

// The frozen (or fake-quant) layers with kernels and bytes.
void md_layers(std::ostringstream& md, const nlohmann::json& report) {
  if (report.contains("layers")) {
    md << "\n| layer | type | weights | activations | kernel | bytes | fallback |\n|---|---|---|---|---|---|---|\n";
    for (const auto& l : report.at("layers"))
      md << "| " << l["name"].get<std::string>() << " | " << l["type"].get<std::string>() << " | "
         << l["weights"].get<std::string>() << " | " << l["activations"].get<std::string>() << " | "
         << l["kernel"].get<std::string>() << " | " << l["bytes"].get<int64_t>() << " | "
         << l["fallback_reason"].get<std::string>() << " |\n";
  }
}

// The numeric suite's table, worst first.
void md_layer_errors(std::ostringstream& md, const nlohmann::json& report) {
  if (report.contains("layer_errors")) {
    // Worst first, as the pipeline stores them; "inf": exact, "-": not measured (see note).
    auto db = [](const nlohmann::json& v) {
      return v.is_number() ? fmt(v.get<double>(), 1) : v.is_string() ? v.get<std::string>() : std::string("-");
    };
    const auto& le = report.at("layer_errors");
    md << "\n## Per-layer error (numeric suite, worst first)\n\nSQNR in dB of each layer's output against the float "
          "layer: own = float inputs, accumulated = the inputs the quantized model feeds it; "
       << le.at("batches").get<int64_t>() << " calibration batches.\n\n"
       << "| layer | type | weight SQNR | own SQNR | accumulated SQNR | clipped inputs | non-finite inputs | note |\n"
          "|---|---|---|---|---|---|---|---|\n";
    for (const auto& l : le.at("layers"))
      md << "| " << l.at("path").get<std::string>() << " | " << l.at("type").get<std::string>() << " | "
         << db(l.at("weight_sqnr_db")) << " | " << db(l.at("own_sqnr_db")) << " | " << db(l.at("accumulated_sqnr_db"))
         << " | " << (l.at("clipped_fraction").is_number() ? fmt(100.0 * l.at("clipped_fraction").get<double>(), 3) + " %" : "-")
         << " | " << l.at("nonfinite_inputs").get<int64_t>() << " | " << l.at("note").get<std::string>() << " |\n";
  }
}

// The search's choice per layer and its Pareto front.
void md_search(std::ostringstream& md, const nlohmann::json& report) {
  const std::string metric = report.value("metric", std::string("metric"));
  if (report.contains("search")) {
    const auto& se = report.at("search");
    md << "\n## Search\n\n" << se.at("method").get<std::string>() << " sensitivities, budget `"
       << se.at("budget").get<std::string>() << "`: predicted " << se.at("bytes").get<int64_t>() << " bytes (float "
       << se.at("float_bytes").get<int64_t>() << "), " << fmt(se.at("latency_ms").get<double>(), 3)
       << " ms of layer kernels (float " << fmt(se.at("float_latency_ms").get<double>(), 3) << " ms; "
       << se.at("latency_regime").get<std::string>() << ", on " << se.at("cpu").get<std::string>() << ", "
       << se.at("threads").get<int>() << " threads), search " << fmt(se.at("seconds").get<double>(), 1) << " s.";
    if (se.contains("kv_cache") && se.at("kv_cache").is_object()) {
      const auto& kv = se.at("kv_cache");
      md << " The size budget included the KV cache at " << kv.at("context_length").get<int64_t>() << " positions ("
         << kv.at("scheme").get<std::string>() << "): " << kv.at("bytes").get<int64_t>() << " bytes (float32 "
         << kv.at("float_bytes").get<int64_t>() << ").";
    }
    md << "\n\n"
       << "| layer | chosen | bytes | latency ms | sensitivity | kernel | input |\n|---|---|---|---|---|---|---|\n";
    for (const auto& l : se.at("layers")) {
      std::string shape;
      for (const auto& d : l.at("input_shape")) shape += (shape.empty() ? "" : "x") + std::to_string(d.get<int64_t>());
      md << "| " << l.at("path").get<std::string>() << " | " << l.at("qtype").get<std::string>() << " | "
         << l.at("bytes").get<int64_t>() << " | " << fmt(l.at("latency_ms").get<double>(), 4) << " | "
         << l.at("sensitivity").get<double>() << " | " << l.at("kernel").get<std::string>() << " | " << shape << " |\n";
    }
    md << "\nPareto front (" << se.at("pareto").size() << " points, by " << se.at("pareto_axis").get<std::string>()
       << "):\n\n| bytes | latency ms | predicted | " << metric << " |\n|---|---|---|---|\n";
    for (const auto& p : se.at("pareto"))
      md << "| " << p.at("bytes").get<int64_t>() << (p.value("chosen", false) ? " (chosen)" : "") << " | " << fmt(p.at("latency_ms").get<double>(), 4) << " | "
         << p.at("predicted").get<double>() << " | "
         << (p.contains(metric) ? fmt(p.at(metric).get<double>()) : std::string("not measured")) << " |\n";
  }
}

// Equalisation, SmoothQuant and the solvers' per-layer errors.
void md_ptq(std::ostringstream& md, const nlohmann::json& report) {
  if (report.contains("ptq")) {
    const auto& p = report.at("ptq");
    md << "\n## PTQ solvers\n";
    if (p.contains("equalize")) {
      md << "\nCross-layer equalisation (" << fmt(p.at("equalize").at("seconds").get<double>(), 1)
         << " s):\n\n| first | second | applied | range spread before | after | why not |\n|---|---|---|---|---|---|\n";
      for (const auto& e : p.at("equalize").at("pairs"))
        md << "| " << e.at("first").get<std::string>() << " | " << e.at("second").get<std::string>() << " | "
           << (e.at("applied").get<bool>() ? "yes" : "no") << " | "
           << (e.at("applied").get<bool>() ? fmt(e.at("range_spread_before").get<double>(), 1) + " | " +
                                                 fmt(e.at("range_spread_after").get<double>(), 1)
                                           : std::string("- | -"))
           << " | " << e.at("reason").get<std::string>() << " |\n";
    }
    if (p.contains("smoothquant")) {
      const auto& sq = p.at("smoothquant");
      md << "\nSmoothQuant, alpha " << fmt(sq.at("alpha").get<double>(), 2) << " (float output moved by "
         << sq.at("float_output_change").get<double>() << ", " << fmt(sq.at("seconds").get<double>(), 1)
         << " s):\n\n| layer | max input before | after | factors |\n|---|---|---|---|\n";
      for (const auto& l : sq.at("layers"))
        md << "| " << l.at("path").get<std::string>() << " | " << fmt(l.at("act_range_before").get<double>(), 3) << " | "
           << fmt(l.at("act_range_after").get<double>(), 3) << " | " << fmt(l.at("min_factor").get<double>(), 3) << " .. "
           << fmt(l.at("max_factor").get<double>(), 3) << " |\n";
      for (const auto& sk : sq.at("skipped")) md << "- not smoothed: " << sk.get<std::string>() << "\n";
    }
    if (p.contains("solve")) {
      const auto& so = p.at("solve");
      md << "\nWeight rounding `" << so.at("method").get<std::string>() << "`"
         << (so.at("bias_correction").get<bool>() ? " with bias correction" : "") << ": "
         << so.at("passes").get<int64_t>() << " calibration passes, " << fmt(so.at("seconds").get<double>(), 1)
         << " s. Error: " << so.at("error").get<std::string>()
         << ".\n\n| layer | type | method | error before | error after | rows | s | note |\n|---|---|---|---|---|---|---|---|\n";
      for (const auto& l : so.at("layers")) {
        const bool measured = l.contains("rows");
        md << "| " << l.at("path").get<std::string>() << " | " << l.at("type").get<std::string>() << " | "
           << l.at("method").get<std::string>() << " | "
           << (measured ? fmt(l.at("error_before").get<double>(), 6) : std::string("-")) << " | "
           << (measured ? fmt(l.at("error_after").get<double>(), 6) : std::string("-")) << " | "
           << (measured ? std::to_string(l.at("rows").get<int64_t>()) : std::string("-")) << " | "
           << (measured ? fmt(l.at("seconds").get<double>(), 2) : std::string("-")) << " | "
           << l.at("note").get<std::string>() << " |\n";
      }
    }
  }
}

// Files not written and why, then the notes.
void md_notes(std::ostringstream& md, const nlohmann::json& report) {
  if (report.contains("not_exported") && !report.at("not_exported").empty()) {
    md << "\nnot written:";
    for (const auto& [file, why] : report.at("not_exported").items()) md << "\n- " << file << ": " << why.get<std::string>();
    md << "\n";
  }
  for (const auto& n : report.at("notes")) md << "\n- " << n.get<std::string>();
}

}  // namespace

nlohmann::json safe_for_report(const nlohmann::json& j) {
  auto safe = [](std::string s) {
    if (s.size() > kMaxReportText)
      s = s.substr(0, kReportTextKept) + "... (" + std::to_string(s.size()) + " bytes; cut for the report)";
    return find_invalid_utf8(s) == std::string::npos ? s : printable(s);
  };
  if (j.is_string()) return safe(j.get<std::string>());
  if (j.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& v : j) out.push_back(safe_for_report(v));
    return out;
  }
  if (j.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [k, v] : j.items()) out[safe(k)] = safe_for_report(v);
    return out;
  }
  return j;
}

std::string write_report_files(const nlohmann::json& unchecked, const Recipe& r, const std::string& out_dir) {
  // Text from files qforge did not write (a foreign dump's keys) may be any bytes.
  const nlohmann::json report = safe_for_report(unchecked);
  const fs::path json_path = fs::path(out_dir) / "report.json";
  io::write_text_atomically(json_path.string(), report.dump(2) + "\n");
  std::ostringstream md;
  md_summary(md, report, r.path, r.sha256);
  md_layers(md, report);
  md_layer_errors(md, report);
  md_search(md, report);
  md_ptq(md, report);
  md_notes(md, report);
  io::write_text_atomically((fs::path(out_dir) / "report.md").string(), md.str() + "\n");
  io::write_text_atomically((fs::path(out_dir) / "report.html").string(),
                            render_report_html(report, r.path, r.sha256, r.resolved_yaml));
  return json_path.string();
}

std::string headline_text(const nlohmann::json& report) {
  if (!report.contains("metrics") || !report.at("metrics").contains("float")) return {};
  const std::string metric = report.value("metric", std::string("accuracy"));
  const bool percent = metric == "accuracy";
  auto value = [&](const std::string& stage) { return report.at("metrics").at(stage).value(metric, 0.0); };
  auto shown = [&](double v) { return percent ? fmt(100.0 * v, 2) + " %" : fmt(v, 3); };
  std::string quantized;
  for (const char* stage : {"frozen", "qat", "ptq"})
    if (report.at("metrics").contains(stage)) {
      quantized = stage;
      break;
    }
  std::ostringstream os;
  os << "qtrain: " << metric << ": float " << shown(value("float"));
  if (quantized.empty()) {
    os << " (no quantized stage ran)";
  } else {
    const double d = value(quantized) - value("float");
    os << "  ->  " << quantized << (quantized == "frozen" ? " (integer kernels) " : " (fake-quant) ") << shown(value(quantized))
       << " (" << (d >= 0 ? "+" : "") << (percent ? fmt(100.0 * d, 2) + " point" : fmt(d, 3)) << ")";
  }
  os << "\n";
  const auto& sz = report.value("size_bytes", nlohmann::json::object());
  os << "qtrain: ";
  if (sz.contains("float") && sz.contains("frozen")) {
    const double f = sz.at("float").get<double>(), q = sz.at("frozen").get<double>();
    os << "size " << sz.at("float").get<int64_t>() << " -> " << sz.at("frozen").get<int64_t>() << " bytes ("
       << fmt(f / q, 2) << "x smaller); ";
  }
  const auto& t = report.value("timings_s", nlohmann::json::object());
  if (t.contains("total")) os << "whole run " << fmt(t.at("total").get<double>(), 0) << " s";
  if (t.contains("float")) os << " (float stage " << fmt(t.at("float").get<double>(), 0) << " s)";
  os << "\n";
  return os.str();
}

}  // namespace qforge
