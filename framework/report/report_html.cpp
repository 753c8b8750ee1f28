// report.html: one self-contained page (report_files.h). Tables are rendered here; every plot is a
// Vega-Lite spec built here from report.json's values and drawn in the page by the inlined
// vega-embed. No network, no files beside the page.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "framework/core/qtype.h"
#include "framework/report/report_files.h"
#include "framework/report/report_assets.h"

namespace qforge {

namespace {

std::string esc(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v, int prec) {
  if (std::isnan(v)) return "-";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(prec);
  os << v;
  return os.str();
}

std::string cell(const nlohmann::json& v, int prec = 1) {
  if (v.is_number()) return num(v.get<double>(), prec);
  if (v.is_string()) return esc(v.get<std::string>());
  return "-";
}

// JSON inside <script type="application/json">: '<' only occurs in strings, where \u003c is the
// same character, so no "</script>" or "<!--" can end or bend the script element.
std::string script_json(const nlohmann::json& j) {
  std::string s = j.dump();
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    if (c == '<') o += "\\u003c";
    else o += c;
  }
  return o;
}

struct Plot {
  std::string id;
  nlohmann::json spec;
};

// Bits of a search candidate ("qint4 per_channel", "float") for the bit-allocation plot (float: 32).
int64_t candidate_bits(const std::string& name) {
  try {
    return qtype_from_name(name.substr(0, name.find(' '))).bits;
  } catch (const std::exception&) {
    return 32;
  }
}

nlohmann::json sqnr_spec(const nlohmann::json& layers, std::vector<std::string>* exact) {
  nlohmann::json values = nlohmann::json::array();
  for (const auto& l : layers) {
    for (const char* kind : {"weight", "own", "accumulated"}) {
      const nlohmann::json& v = l.at(std::string(kind) + "_sqnr_db");
      if (v.is_number()) values.push_back({{"layer", l.at("path")}, {"kind", kind}, {"sqnr_db", v}});
      else if (v.is_string() && v.get<std::string>() == "inf")
        exact->push_back(l.at("path").get<std::string>() + " (" + kind + ")");
    }
  }
  if (values.empty()) return nullptr;
  return {{"data", {{"values", values}}},
          {"mark", {{"type", "bar"}, {"tooltip", true}}},
          {"width", 640},
          {"encoding",
           {{"y", {{"field", "layer"}, {"type", "nominal"}, {"sort", nullptr}, {"title", nullptr}}},
            {"yOffset", {{"field", "kind"}, {"sort", {"weight", "own", "accumulated"}}}},
            {"x", {{"field", "sqnr_db"}, {"type", "quantitative"}, {"title", "SQNR (dB), higher is better"}}},
            {"color", {{"field", "kind"}, {"type", "nominal"}, {"sort", {"weight", "own", "accumulated"}}, {"title", "SQNR of"}}}}}};
}

nlohmann::json histogram_spec(const nlohmann::json& a) {
  const double clip_lo = a.at("clip_min").get<double>(), clip_hi = a.at("clip_max").get<double>();
  const double s = a.at("scale").get<double>();
  // The grid: every representable value inside the clip range, thinned to at most 64 ticks.
  const auto levels = static_cast<int64_t>(std::llround((clip_hi - clip_lo) / s)) + 1;
  const int64_t every = std::max<int64_t>(1, (levels + 63) / 64);
  nlohmann::json grid = nlohmann::json::array();
  const bool integer_grid = a.at("qtype").get<std::string>().find("float") == std::string::npos;
  if (integer_grid)
    for (int64_t q = 0; q < levels; q += every) grid.push_back({{"x", clip_lo + s * static_cast<double>(q)}});
  const std::string grid_title =
      integer_grid ? "grid (every " + std::to_string(every) + (every == 1 ? "st" : "th") + " level)" : "grid";
  nlohmann::json layers = nlohmann::json::array();
  layers.push_back({{"data", {{"values", a.at("histogram")}}},
                    {"mark", {{"type", "bar"}, {"color", "#4c78a8"}, {"tooltip", true}}},
                    {"encoding",
                     {{"x", {{"field", "x0"}, {"type", "quantitative"}, {"title", "value"}}},
                      {"x2", {{"field", "x1"}}},
                      {"y", {{"field", "count"}, {"type", "quantitative"}, {"scale", {{"type", "sqrt"}}}, {"title", "count (sqrt scale)"}}},
                      // A bar from x0 to x1 needs its baseline spelled out (else it is a thin band at y).
                      {"y2", {{"datum", 0}}}}}});
  layers.push_back({{"data", {{"values", {{{"x", clip_lo}, {"edge", "clip min"}}, {{"x", clip_hi}, {"edge", "clip max"}}}}}},
                    {"mark", {{"type", "rule"}, {"color", "#e45756"}, {"strokeWidth", 2}, {"tooltip", true}}},
                    {"encoding", {{"x", {{"field", "x"}, {"type", "quantitative"}}}}}});
  if (!grid.empty())
    layers.push_back({{"data", {{"values", grid}}},
                      {"mark", {{"type", "rule"}, {"color", "#54a24b"}}},
                      {"encoding", {{"x", {{"field", "x"}, {"type", "quantitative"}}}, {"y", {{"value", 150}}}, {"y2", {{"value", 160}}}}}});
  return {{"title", {{"text", a.at("path").get<std::string>() + " " + a.at("point").get<std::string>()},
                     {"subtitle", a.at("observer").get<std::string>() + " observer, " + a.at("qtype").get<std::string>() +
                                      "; red: clip range, green: " + grid_title}}},
          {"width", 600},
          {"height", 160},
          {"layer", layers}};
}

nlohmann::json loss_spec(const nlohmann::json& curves) {
  nlohmann::json charts = nlohmann::json::array();
  for (const char* stage : {"float", "qat"}) {
    if (!curves.contains(stage) || curves.at(stage).empty()) continue;
    charts.push_back({{"title", std::string(stage) + " training"},
                      {"data", {{"values", curves.at(stage)}}},
                      {"mark", {{"type", "line"}, {"tooltip", true}}},
                      {"width", 320},
                      {"encoding",
                       {{"x", {{"field", "step"}, {"type", "quantitative"}, {"title", "step"}}},
                        {"y", {{"field", "loss"}, {"type", "quantitative"}, {"title", "loss (mean over the span)"}}}}}});
  }
  if (charts.empty()) return nullptr;
  return {{"hconcat", charts}};
}

nlohmann::json bits_spec(const nlohmann::json& search) {
  nlohmann::json values = nlohmann::json::array();
  for (const auto& l : search.at("layers"))
    values.push_back({{"layer", l.at("path")}, {"qtype", l.at("qtype")}, {"bits", candidate_bits(l.at("qtype").get<std::string>())},
                      {"bytes", l.at("bytes")}});
  if (values.empty()) return nullptr;
  return {{"title", "bits chosen per layer"},
          {"data", {{"values", values}}},
          {"mark", {{"type", "bar"}, {"tooltip", true}}},
          {"width", 640},
          {"encoding",
           {{"y", {{"field", "layer"}, {"type", "nominal"}, {"sort", nullptr}, {"title", nullptr}}},
            {"x", {{"field", "bits"}, {"type", "quantitative"}, {"title", "weight bits"}}},
            {"color", {{"field", "qtype"}, {"type", "nominal"}}}}}};
}

nlohmann::json pareto_spec(const nlohmann::json& search) {
  nlohmann::json values = nlohmann::json::array();
  for (const auto& p : search.at("pareto")) {
    nlohmann::json v = p;
    v["chosen"] = p.value("chosen", false) ? "chosen" : "front";
    values.push_back(v);
  }
  if (values.empty()) return nullptr;
  return {{"title", "Pareto front: predicted sensitivity against size"},
          {"data", {{"values", values}}},
          {"mark", {{"type", "point"}, {"filled", true}, {"size", 60}, {"tooltip", true}}},
          {"width", 480},
          {"encoding",
           {{"x", {{"field", "bytes"}, {"type", "quantitative"}, {"title", "weight bytes"}}},
            {"y", {{"field", "predicted"}, {"type", "quantitative"}, {"title", "predicted sensitivity (lower is better)"}}},
            {"color", {{"field", "chosen"}, {"type", "nominal"}, {"title", nullptr}}}}}};
}

constexpr int64_t kMaxHistogramPlots = 48;

// The page being written and the plots its script draws.
struct Page {
  std::ostringstream h;
  std::vector<Plot> plots;
  // A plot's place in the page, or the sentence saying why there is nothing to draw.
  void plot_or(const std::string& id, const nlohmann::json& spec, const std::string& empty) {
    if (spec.is_null()) {
      h << "<p class=\"empty\" id=\"" << id << "-empty\">" << esc(empty) << "</p>\n";
      return;
    }
    plots.push_back({id, spec});
    h << "<div class=\"plot\" id=\"" << id << "\"></div>\n";
  }
};

// The document head with the inlined plotting library, the title and the headline.
void html_head(Page& p, const nlohmann::json& report, const std::string& recipe_path, const std::string& recipe_sha256) {
  p.h << "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>qtrain report: " << esc(recipe_path)
    << "</title>\n<style>\n"
       "body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}"
       "table{border-collapse:collapse;margin:0.5em 0 1em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:14px}"
       "th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}.empty{color:#777;font-style:italic}"
       "pre{background:#f7f7f7;padding:1em;overflow:auto;font-size:13px}.plot{margin:0.5em 0 1.5em}\n"
       "</style>\n";
  // Before the library: any script error or console.error ends up on <html data-errors>, where a
  // test (or a user's devtools) finds it.
  p.h << "<script>(function () {\n"
       "  function note(m) { var d = document.documentElement; d.setAttribute('data-errors', (d.getAttribute('data-errors') || '') + m + '\\n'); }\n"
       "  window.addEventListener('error', function (e) { note('error: ' + e.message); });\n"
       "  window.addEventListener('unhandledrejection', function (e) { note('rejection: ' + e.reason); });\n"
       "  var ce = console.error; console.error = function () { note('console.error: ' + Array.prototype.join.call(arguments, ' ')); ce.apply(console, arguments); };\n"
       "})();</script>\n";
  p.h << "<script>" << report_assets::vega_js() << "</script>\n";
  p.h << "<script>" << report_assets::vega_lite_js() << "</script>\n";
  p.h << "<script>" << report_assets::vega_embed_js() << "</script>\n";
  p.h << "</head>\n<body>\n<h1>qtrain report</h1>\n<p>recipe <code>" << esc(recipe_path) << "</code>, sha256 <code>"
    << esc(recipe_sha256) << "</code></p>\n";
  const std::string headline = headline_text(report);
  if (!headline.empty()) p.h << "<pre id=\"headline\">" << esc(headline) << "</pre>\n";
}

// Metrics per stage, sizes, timings.
void html_summary(Page& p, const nlohmann::json& report) {
  const std::string metric = report.value("metric", std::string("metric"));
  // Summary: metrics per stage, sizes, timings.
  p.h << "<section id=\"summary\">\n<h2>Summary</h2>\n<table><tr><th>stage</th><th>" << esc(metric) << "</th><th>loss</th></tr>\n";
  for (const char* stage : {"float", "ptq", "qat", "frozen"}) {
    if (!report.contains("metrics") || !report.at("metrics").contains(stage)) continue;
    const auto& m = report.at("metrics").at(stage);
    p.h << "<tr><td>" << stage << "</td><td class=\"n\">" << cell(m.value(metric, nlohmann::json()), 4) << "</td><td class=\"n\">"
      << cell(m.value("loss", nlohmann::json()), 4) << "</td></tr>\n";
  }
  p.h << "</table>\n";
  if (report.contains("size_bytes") && !report.at("size_bytes").empty()) {
    p.h << "<table><tr><th>size</th><th>bytes</th></tr>\n";
    for (const auto& [k, v] : report.at("size_bytes").items()) p.h << "<tr><td>" << esc(k) << "</td><td class=\"n\">" << cell(v, 0) << "</td></tr>\n";
    p.h << "</table>\n";
  }
  if (report.contains("timings_s")) {
    p.h << "<table><tr><th>step</th><th>wall s</th></tr>\n";
    for (const auto& [k, v] : report.at("timings_s").items()) p.h << "<tr><td>" << esc(k) << "</td><td class=\"n\">" << cell(v, 2) << "</td></tr>\n";
    p.h << "</table>\n";
  }
  p.h << "</section>\n";
}

// Per-layer table with the numeric suite's SQNR beside the plan.
void html_layers(Page& p, const nlohmann::json& report) {
  // Per-layer table with the numeric suite's SQNR beside the plan.
  std::map<std::string, const nlohmann::json*> errors_by_path;
  if (report.contains("layer_errors"))
    for (const auto& l : report.at("layer_errors").at("layers")) errors_by_path[l.at("path").get<std::string>()] = &l;
  p.h << "<section id=\"layers\">\n<h2>Layers</h2>\n";
  if (!report.contains("layers") || report.at("layers").empty()) {
    p.h << "<p class=\"empty\">no quantizable layers in the report</p>\n";
  } else {
    p.h << "<table><tr><th>layer</th><th>type</th><th>weights</th><th>activations</th><th>kernel</th><th>fallback</th>"
         "<th>bytes</th><th>own SQNR dB</th><th>accumulated SQNR dB</th></tr>\n";
    for (const auto& l : report.at("layers")) {
      const std::string name = l.at("name").get<std::string>();
      const auto e = errors_by_path.find(name);
      p.h << "<tr><td>" << esc(name) << "</td><td>" << cell(l.at("type")) << "</td><td>" << cell(l.at("weights")) << "</td><td>"
        << cell(l.at("activations")) << "</td><td>" << cell(l.at("kernel")) << "</td><td>" << cell(l.at("fallback_reason"))
        << "</td><td class=\"n\">" << cell(l.at("bytes"), 0) << "</td><td class=\"n\">"
        << (e == errors_by_path.end() ? "-" : cell(e->second->at("own_sqnr_db"))) << "</td><td class=\"n\">"
        << (e == errors_by_path.end() ? "-" : cell(e->second->at("accumulated_sqnr_db"))) << "</td></tr>\n";
    }
    p.h << "</table>\n";
  }
  p.h << "</section>\n";
}

// The per-layer SQNR plot.
void html_sqnr(Page& p, const nlohmann::json& report) {
  p.h << "<section id=\"sqnr\">\n<h2>Per-layer SQNR</h2>\n";
  std::vector<std::string> exact;
  const nlohmann::json sq = report.contains("layer_errors") ? sqnr_spec(report.at("layer_errors").at("layers"), &exact) : nullptr;
  p.plot_or("plot-sqnr", sq,
          report.contains("layer_errors") ? "the numeric suite measured no finite SQNR (every compared output was exact)"
                                          : "no quantized stage ran, so no per-layer error was measured");
  if (!exact.empty()) {
    p.h << "<p>exact (infinite SQNR, not drawn):";
    for (const std::string& x : exact) p.h << " " << esc(x) << ";";
    p.h << "</p>\n";
  }
  p.h << "</section>\n";
}

// Activation histograms with their clip ranges; a table where only min/max were kept.
void html_histograms(Page& p, const nlohmann::json& report) {
  p.h << "<section id=\"histograms\">\n<h2>Activation ranges</h2>\n";
  int64_t drawn = 0, without = 0;
  if (report.contains("activations"))
    for (const auto& a : report.at("activations")) {
      if (!a.contains("histogram")) {
        ++without;
        continue;
      }
      if (drawn >= kMaxHistogramPlots) continue;
      p.plot_or("plot-hist-" + std::to_string(drawn++), histogram_spec(a), "");
    }
  if (drawn == 0)
    p.h << "<p class=\"empty\" id=\"plot-hist-empty\">"
      << (report.contains("activations") && !report.at("activations").empty()
              ? "no activation histograms: the observers keep min/max only (ranges in the table below)"
              : "no static activations were calibrated (weight-only or dynamic activations): no ranges to draw")
      << "</p>\n";
  const int64_t hist_total = report.contains("activations") ? static_cast<int64_t>(report.at("activations").size()) - without : 0;
  if (hist_total > drawn) p.h << "<p>" << hist_total - drawn << " more histograms not drawn (first " << kMaxHistogramPlots << " shown)</p>\n";
  if (without > 0) {
    p.h << "<table><tr><th>point</th><th>observer</th><th>min</th><th>max</th><th>clip min</th><th>clip max</th></tr>\n";
    for (const auto& a : report.at("activations"))
      if (!a.contains("histogram"))
        p.h << "<tr><td>" << esc(a.at("path").get<std::string>() + " " + a.at("point").get<std::string>()) << "</td><td>"
          << cell(a.at("observer")) << "</td><td class=\"n\">" << cell(a.value("min", nlohmann::json()), 4) << "</td><td class=\"n\">"
          << cell(a.value("max", nlohmann::json()), 4) << "</td><td class=\"n\">" << cell(a.at("clip_min"), 4)
          << "</td><td class=\"n\">" << cell(a.at("clip_max"), 4) << "</td></tr>\n";
    p.h << "</table>\n";
  }
  p.h << "</section>\n";
}

// Loss curves of float training and QAT.
void html_loss(Page& p, const nlohmann::json& report) {
  p.h << "<section id=\"loss\">\n<h2>Loss curves</h2>\n";
  p.plot_or("plot-loss", report.contains("loss_curves") ? loss_spec(report.at("loss_curves")) : nlohmann::json(nullptr),
          "no training ran in this run (float weights loaded, and no QAT)");
  p.h << "</section>\n";
}

// The search's bit allocation and Pareto front.
void html_search(Page& p, const nlohmann::json& report) {
  p.h << "<section id=\"search\">\n<h2>Mixed-precision search</h2>\n";
  if (report.contains("search")) {
    const auto& se = report.at("search");
    p.h << "<p>" << esc(se.value("method", std::string())) << " sensitivities, budget <code>" << esc(se.value("budget", std::string()))
      << "</code></p>\n";
    p.plot_or("plot-bits", bits_spec(se), "the search chose no layer");
    p.plot_or("plot-pareto", pareto_spec(se), "the search kept no Pareto front");
  } else {
    p.h << "<p class=\"empty\" id=\"plot-search-empty\">no mixed-precision search in this run</p>\n";
  }
  p.h << "</section>\n";
}

// Notes, the resolved recipe, and the script that draws the plots.
void html_tail(Page& p, const nlohmann::json& report, const std::string& resolved_yaml) {
  if (report.contains("notes") && !report.at("notes").empty()) {
    p.h << "<section id=\"notes\">\n<h2>Notes</h2>\n<ul>\n";
    for (const auto& n : report.at("notes")) p.h << "<li>" << cell(n) << "</li>\n";
    p.h << "</ul>\n</section>\n";
  }
  p.h << "<section id=\"recipe\">\n<h2>Recipe (resolved)</h2>\n<pre>" << esc(resolved_yaml) << "</pre>\n</section>\n";
  p.h << "<p class=\"empty\">plots drawn in the page by " << report_assets::versions() << " (inlined)</p>\n";

  nlohmann::json specs = nlohmann::json::array();
  for (const Plot& plot : p.plots) specs.push_back({{"id", plot.id}, {"spec", plot.spec}});
  p.h << "<script type=\"application/json\" id=\"qforge-plots\">" << script_json(specs) << "</script>\n";
  p.h << "<script>\n"
       "(function () {\n"
       "  const plots = JSON.parse(document.getElementById('qforge-plots').textContent);\n"
       "  const state = {total: plots.length, drawn: 0, failed: []};\n"
       "  window.qforgePlots = state;\n"
       "  Promise.all(plots.map(function (p) {\n"
       "    return vegaEmbed('#' + p.id, p.spec, {mode: 'vega-lite', actions: false, renderer: 'svg'})\n"
       "      .then(function () { state.drawn++; })\n"
       "      .catch(function (e) { state.failed.push(p.id + ': ' + e); console.error('qforge plot ' + p.id + ': ' + e); });\n"
       "  })).then(function () { document.body.setAttribute('data-plots', state.failed.length ? 'failed' : 'done'); });\n"
       "})();\n"
       "</script>\n</body>\n</html>\n";
}

}  // namespace

std::string render_report_html(const nlohmann::json& report, const std::string& recipe_path, const std::string& recipe_sha256,
                               const std::string& resolved_yaml) {
  Page p;
  html_head(p, report, recipe_path, recipe_sha256);
  html_summary(p, report);
  html_layers(p, report);
  html_sqnr(p, report);
  html_histograms(p, report);
  html_loss(p, report);
  html_search(p, report);
  html_tail(p, report, resolved_yaml);
  return p.h.str();
}

}  // namespace qforge
