// report.html: one self-contained page (report_files.h). Tables are rendered here; every plot is a
// Vega-Lite spec built here from report.json's values and drawn in the page by the inlined
// vega-embed. No network, no files beside the page.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "framework/core/qtype.h"
#include "framework/core/utf8.h"
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

// A dotted module path, escaped, with a line-break opportunity after each dot.
std::string breakable(const std::string& path) {
  std::string o;
  for (char c : esc(path)) o += c == '.' ? std::string(".<wbr>") : std::string(1, c);
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

// Axis labels of at most kLabelChars characters for layer names; the longest label the axis
// draws in full at its font.
constexpr size_t kLabelChars = 40, kLabelHead = 12;
constexpr int kLabelLimitPx = 320;

// `name` as its first `head` bytes, "…" and a tail of at most `tail` bytes that starts after a '.'
// (whole path components), or, when the last component alone is longer, at a UTF-8 character
// boundary; `name` itself when the label would not be shorter.
std::string middle_ellipsis(const std::string& name, size_t head, size_t tail) {
  if (name.size() <= head + tail + 1) return name;
  const size_t from = name.size() - tail;
  const size_t dot = name.find('.', from == 0 ? 0 : from - 1);
  const size_t start = dot != std::string::npos && dot + 1 < name.size() ? dot + 1 : utf8_cut_before(name, from);
  return name.substr(0, utf8_cut_before(name, head)) + "\u2026" + name.substr(start);
}

}  // namespace

std::map<std::string, std::string> distinct_axis_labels(const std::vector<std::string>& names) {
  // Names share their heads (bert.encoder.layer.1.attention.self.…) and differ at the tail, so a
  // label keeps the tail, lengthened only for the names whose labels still collide.
  std::map<std::string, size_t> tail;
  for (const std::string& n : names) tail[n] = kLabelChars - kLabelHead - 1;
  while (true) {
    std::map<std::string, std::string> labels;
    std::map<std::string, std::vector<std::string>> owners;  // label -> the names it stands for
    for (const auto& [n, t] : tail) owners[labels[n] = middle_ellipsis(n, kLabelHead, t)].push_back(n);
    bool grew = false;
    for (const auto& [label, ns] : owners)
      if (ns.size() > 1)
        for (const std::string& n : ns)
          if (tail[n] < n.size()) ++tail[n], grew = true;
    if (!grew) return labels;  // distinct (names at full length cannot collide)
  }
}

namespace {

nlohmann::json sqnr_spec(const nlohmann::json& layers, std::vector<std::string>* exact) {
  std::vector<std::string> names;
  for (const auto& l : layers) names.push_back(l.at("path").get<std::string>());
  const std::map<std::string, std::string> labels = distinct_axis_labels(names);
  nlohmann::json values = nlohmann::json::array();
  for (const auto& l : layers) {
    for (const char* kind : {"weight", "own", "accumulated"}) {
      const nlohmann::json& v = l.at(std::string(kind) + "_sqnr_db");
      if (v.is_number())
        values.push_back({{"label", labels.at(l.at("path").get<std::string>())}, {"layer", l.at("path")}, {"kind", kind},
                          {"sqnr_db", v}});
      else if (v.is_string() && v.get<std::string>() == "inf")
        exact->push_back(l.at("path").get<std::string>() + " (" + kind + ")");
    }
  }
  if (values.empty()) return nullptr;
  return {{"data", {{"values", values}}},
          {"mark", {{"type", "bar"}, {"tooltip", true}}},
          {"width", 640},
          {"encoding",
           {{"y", {{"field", "label"}, {"type", "nominal"}, {"sort", nullptr}, {"title", nullptr},
                   {"axis", {{"labelLimit", kLabelLimitPx}}}}},
            {"yOffset", {{"field", "kind"}, {"sort", {"weight", "own", "accumulated"}}}},
            {"x", {{"field", "sqnr_db"}, {"type", "quantitative"}, {"title", "SQNR (dB), higher is better"}}},
            {"color", {{"field", "kind"}, {"type", "nominal"}, {"sort", {"weight", "own", "accumulated"}}, {"title", "SQNR of"}}}}}};
}

}  // namespace

std::string grid_use_hint(const nlohmann::json& a) {
  if (!a.contains("min") || !a.contains("max") || a.at("qtype").get<std::string>().find("float") != std::string::npos)
    return "";
  const double clip_lo = a.at("clip_min").get<double>(), clip_hi = a.at("clip_max").get<double>();
  const double s = a.at("scale").get<double>();
  if (!(s > 0) || !std::isfinite(clip_lo) || !std::isfinite(clip_hi)) return "";
  const int64_t codes = std::llround((clip_hi - clip_lo) / s) + 1;
  const double lo = std::max(a.at("min").get<double>(), clip_lo), hi = std::min(a.at("max").get<double>(), clip_hi);
  if (codes < 4 || !(hi >= lo)) return "";
  const int64_t used = std::clamp<int64_t>(std::llround((hi - lo) / s) + 1, 1, codes);
  if (2 * used > codes + 2) return "";  // the zero code may sit on either half
  return "uses " + std::to_string(used) + " of " + std::to_string(codes) + " codes: " +
         (a.at("min").get<double>() >= 0 && clip_lo < 0 ? "unsigned grid?" : "a narrower clip range?");
}

namespace {

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
  const std::string hint = grid_use_hint(a);
  nlohmann::json subtitle = {a.at("observer").get<std::string>() + " observer, " + a.at("qtype").get<std::string>() +
                             "; red: clip range, green: " + grid_title};
  if (!hint.empty()) subtitle.push_back(hint);
  return {{"title", {{"text", a.at("path").get<std::string>() + " " + a.at("point").get<std::string>()},
                     {"subtitle", subtitle}}},
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
  std::vector<std::string> names;
  for (const auto& l : search.at("layers")) names.push_back(l.at("path").get<std::string>());
  const std::map<std::string, std::string> labels = distinct_axis_labels(names);
  nlohmann::json values = nlohmann::json::array();
  for (const auto& l : search.at("layers"))
    values.push_back({{"label", labels.at(l.at("path").get<std::string>())}, {"layer", l.at("path")}, {"qtype", l.at("qtype")},
                      {"bits", candidate_bits(l.at("qtype").get<std::string>())}, {"bytes", l.at("bytes")}});
  if (values.empty()) return nullptr;
  return {{"title", "bits chosen per layer"},
          {"data", {{"values", values}}},
          {"mark", {{"type", "bar"}, {"tooltip", true}}},
          {"width", 640},
          {"encoding",
           {{"y", {{"field", "label"}, {"type", "nominal"}, {"sort", nullptr}, {"title", nullptr},
                   {"axis", {{"labelLimit", kLabelLimitPx}}}}},
            {"x", {{"field", "bits"}, {"type", "quantitative"}, {"title", "weight bits"}}},
            {"color", {{"field", "qtype"}, {"type", "nominal"}}}}}};
}

// A quantitative scale: logarithmic when the values are positive and span a decade or more.
nlohmann::json axis_scale(const nlohmann::json& values, const std::string& field) {
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (const auto& v : values) {
    const double x = v.at(field).get<double>();
    if (!(x > 0)) return {{"zero", false}};
    lo = std::min(lo, x), hi = std::max(hi, x);
  }
  if (hi >= 10 * lo) return {{"type", "log"}};
  return {{"zero", false}};
}

// One panel of the Pareto plot: the front's points, the budget (a vertical rule) and the chosen
// point last, so it is drawn on top of any point at the same place.
nlohmann::json pareto_panel(const nlohmann::json& front, const nlohmann::json& chosen, const std::string& x,
                            const std::string& x_title, const std::string& y, const std::string& y_title,
                            const nlohmann::json& budget) {
  nlohmann::json all = front;
  for (const auto& c : chosen) all.push_back(c);
  const nlohmann::json enc = {{"x", {{"field", x}, {"type", "quantitative"}, {"title", x_title}, {"scale", axis_scale(all, x)}}},
                              {"y", {{"field", y}, {"type", "quantitative"}, {"title", y_title}, {"scale", axis_scale(all, y)}}}};
  nlohmann::json layers = nlohmann::json::array();
  if (!front.empty())
    layers.push_back({{"data", {{"values", front}}},
                      {"mark", {{"type", "point"}, {"filled", true}, {"size", 60}, {"color", "#4c78a8"}, {"tooltip", true}}},
                      {"encoding", enc}});
  if (!budget.is_null())
    layers.push_back({{"data", {{"values", {{{x, budget}, {"what", "budget"}}}}}},
                      {"mark", {{"type", "rule"}, {"color", "#e45756"}, {"strokeDash", {6, 4}}, {"tooltip", true}}},
                      {"encoding", {{"x", {{"field", x}, {"type", "quantitative"}}}}}});
  if (!chosen.empty())
    layers.push_back({{"data", {{"values", chosen}}},
                      {"mark", {{"type", "point"}, {"shape", "diamond"}, {"filled", true}, {"size", 160}, {"color", "#e45756"},
                                {"stroke", "black"}, {"tooltip", true}}},
                      {"encoding", enc}});
  return {{"width", 400}, {"height", 220}, {"layer", layers}};
}

// The search's Pareto front along its axis (bytes or latency): predicted sensitivity, and the
// measured metric where the run evaluated points; the budget on that axis as a dashed red rule.
nlohmann::json pareto_spec(const nlohmann::json& search, const std::string& metric) {
  const std::string x = search.value("pareto_axis", std::string("bytes"));
  const std::string x_title = x == "latency_ms" ? "predicted latency of the layer kernels (ms)" : "model bytes after freeze";
  const nlohmann::json budget = search.value(x == "latency_ms" ? "budget_latency_ms" : "budget_bytes", nlohmann::json());
  nlohmann::json front = nlohmann::json::array(), chosen = nlohmann::json::array();
  nlohmann::json measured_front = nlohmann::json::array(), measured_chosen = nlohmann::json::array();
  for (const auto& p : search.at("pareto")) {
    nlohmann::json v = p;
    const bool is_chosen = p.value("chosen", false);
    v["chosen"] = is_chosen ? "chosen" : "front";
    (is_chosen ? chosen : front).push_back(v);
    if (p.contains(metric) && p.at(metric).is_number()) (is_chosen ? measured_chosen : measured_front).push_back(v);
  }
  if (front.empty() && chosen.empty()) return nullptr;
  nlohmann::json panels = nlohmann::json::array();
  panels.push_back(pareto_panel(front, chosen, x, x_title, "predicted", "predicted sensitivity (lower is better)", budget));
  if (!measured_front.empty() || !measured_chosen.empty())
    panels.push_back(pareto_panel(measured_front, measured_chosen, x, x_title, metric, "measured " + metric + " (test split)", budget));
  return {{"title", {{"text", std::string("Pareto front against ") + (x == "latency_ms" ? "latency" : "size")},
                     {"subtitle", "red diamond: the chosen point; dashed red: the budget"}}},
          {"hconcat", panels}};
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
       // overflow-wrap:anywhere lets a table shrink below its longest name: every table fits the page.
       "table{border-collapse:collapse;margin:0.5em 0 1em;max-width:100%}table.layers{width:100%;table-layout:fixed}"
       "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:14px;overflow-wrap:anywhere}"
       ".hint{color:#b35900;margin:0 0 1em}"
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
    // Fixed column shares: the table is the page's width whatever its names and kernels hold.
    p.h << "<table class=\"layers\"><colgroup><col style=\"width:22%\"><col style=\"width:7%\"><col style=\"width:14%\">"
           "<col style=\"width:14%\"><col style=\"width:12%\"><col style=\"width:15%\"><col style=\"width:5%\">"
           "<col style=\"width:5.5%\"><col style=\"width:5.5%\"></colgroup>\n"
           "<tr><th>layer</th><th>type</th><th>weights</th><th>activations</th><th>kernel</th><th>fallback</th>"
           "<th>bytes</th><th>own SQNR dB</th><th>accumulated SQNR dB</th></tr>\n";
    for (const auto& l : report.at("layers")) {
      const std::string name = l.at("name").get<std::string>();
      const auto e = errors_by_path.find(name);
      p.h << "<tr><td>" << breakable(name) << "</td><td>" << cell(l.at("type")) << "</td><td>" << cell(l.at("weights")) << "</td><td>"
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
      const std::string id = "plot-hist-" + std::to_string(drawn++);
      p.plot_or(id, histogram_spec(a), "");
      const std::string hint = grid_use_hint(a);
      if (!hint.empty())
        p.h << "<p class=\"hint\" id=\"" << id << "-hint\">" << esc(a.at("path").get<std::string>() + " " + a.at("point").get<std::string>())
          << " " << esc(hint) << "</p>\n";
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
    p.h << "<table><tr><th>point</th><th>observer</th><th>min</th><th>max</th><th>clip min</th><th>clip max</th><th>grid</th></tr>\n";
    for (const auto& a : report.at("activations"))
      if (!a.contains("histogram"))
        p.h << "<tr><td>" << esc(a.at("path").get<std::string>() + " " + a.at("point").get<std::string>()) << "</td><td>"
          << cell(a.at("observer")) << "</td><td class=\"n\">" << cell(a.value("min", nlohmann::json()), 4) << "</td><td class=\"n\">"
          << cell(a.value("max", nlohmann::json()), 4) << "</td><td class=\"n\">" << cell(a.at("clip_min"), 4)
          << "</td><td class=\"n\">" << cell(a.at("clip_max"), 4) << "</td><td>" << esc(grid_use_hint(a)) << "</td></tr>\n";
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
    p.plot_or("plot-pareto", pareto_spec(se, report.value("metric", std::string("accuracy"))), "the search kept no Pareto front");
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
       "  })).then(function () {\n"
       "    // What the page measures once drawn, for a test (or a reader): the widest element's right edge.\n"
       "    document.body.setAttribute('data-page-width', document.documentElement.scrollWidth);\n"
       "    document.body.setAttribute('data-plots', state.failed.length ? 'failed' : 'done');\n"
       "  });\n"
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
