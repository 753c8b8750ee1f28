// report.html as rendered from a report.json (issue 39 item 7): layer labels distinct with their
// tails kept, the grid-use hint, and the Pareto plot's scales, budget and drawing order.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "framework/core/utf8.h"
#include "framework/report/report_files.h"
#include "tests/apps/long_names_report.h"

namespace qforge {
namespace {

// The Vega-Lite specs the page draws, by plot id.
nlohmann::json plot_spec(const std::string& html, const std::string& id) {
  const std::string open = "<script type=\"application/json\" id=\"qforge-plots\">";
  const size_t b = html.find(open), e = html.find("</script>", b);
  EXPECT_NE(b, std::string::npos);
  for (const auto& p : nlohmann::json::parse(html.substr(b + open.size(), e - b - open.size())))
    if (p.at("id") == id) return p.at("spec");
  ADD_FAILURE() << "no plot " << id;
  return nullptr;
}

TEST(ReportHtml, Issue39Item7LabelsKeepTheTailAndAreDistinct) {
  const std::vector<std::string> names = {"bert.encoder.layer.1.attention.self.query",
                                          "bert.encoder.layer.1.attention.self.key",
                                          "bert.encoder.layer.1.attention.self.value", "fc",
                                          "bert.encoder.layer.10.attention.output.dense.weight_twin",
                                          "bert.encoder.layer.11.attention.output.dense.weight_twin"};
  const auto labels = distinct_axis_labels(names);
  std::set<std::string> seen;
  for (const std::string& n : names) {
    const std::string& l = labels.at(n);
    EXPECT_TRUE(seen.insert(l).second) << "two names share the label " << l;
    if (n.size() <= 40) {
      EXPECT_EQ(l, n);
      continue;
    }
    EXPECT_EQ(l.rfind("bert.encoder", 0), 0u) << l;  // the head
    EXPECT_NE(l.find("\u2026"), std::string::npos) << l;
    const std::string leaf = n.substr(n.rfind('.') + 1);
    EXPECT_EQ(l.substr(l.size() - leaf.size()), leaf) << l;  // the tail that tells them apart
  }
  EXPECT_LE(labels.at(names[0]).size(), 42u);  // 40 characters, "…" being 3 bytes
  // docs/reports.md's example: the tail starts at a path component, never inside a word.
  EXPECT_EQ(labels.at(names[0]), "bert.encoder\u20261.attention.self.query");
  // Names sharing a 40-character tail: the tail grows until they differ.
  EXPECT_NE(labels.at(names[4]), labels.at(names[5]));
}

TEST(ReportHtml, Issue39Item7LabelTailsAreWholePathComponents) {
  const std::vector<std::string> names = long_layer_names();
  const auto labels = distinct_axis_labels(names);
  std::set<std::string> seen;
  for (const std::string& n : names) {
    const std::string& l = labels.at(n);
    EXPECT_TRUE(seen.insert(l).second) << "two names share the label " << l;
    const size_t ell = l.find("\u2026");
    if (ell == std::string::npos) {
      EXPECT_EQ(l, n);
      continue;
    }
    const std::string tail = l.substr(ell + 3);
    ASSERT_GT(n.size(), tail.size());
    EXPECT_EQ(n.substr(n.size() - tail.size()), tail) << l;
    EXPECT_EQ(n[n.size() - tail.size() - 1], '.') << l << ": the tail starts inside a component";
  }
  // A last component longer than the tail is cut at a character, not dropped; the cut never
  // splits a UTF-8 character (20 "é" of 2 bytes: the 27-byte tail would start inside one).
  std::string leaf;
  for (int i = 0; i < 20; ++i) leaf += "\u00e9";
  const std::string l = distinct_axis_labels({"model.encoder.layer." + leaf}).begin()->second;
  EXPECT_EQ(find_invalid_utf8(l), std::string::npos) << l;
  EXPECT_EQ(l, "model.encode\u2026" + leaf.substr(leaf.size() - 28)) << l;
}

TEST(ReportHtml, Issue39Item7GridUseHintForAHalfUsedGrid) {
  // A softmax output (values in [0, 1]) on a signed symmetric int8 grid: 128 of 256 codes.
  nlohmann::json a = {{"path", "attn"}, {"point", "output"}, {"observer", "histogram"}, {"qtype", "qint8"},
                      {"scale", 1.0 / 127.0}, {"zero_point", 0.0}, {"clip_min", -128.0 / 127.0}, {"clip_max", 1.0},
                      {"min", 0.0}, {"max", 1.0}};
  EXPECT_EQ(grid_use_hint(a), "uses 128 of 256 codes: unsigned grid?");
  a["min"] = -1.0;  // the whole grid
  EXPECT_EQ(grid_use_hint(a), "");
  a["min"] = -0.2, a["max"] = 0.2;  // signed values in a fifth of the range
  EXPECT_EQ(grid_use_hint(a), "uses 52 of 256 codes: a narrower clip range?");
  a["qtype"] = "float8_e4m3";  // no integer grid
  EXPECT_EQ(grid_use_hint(a), "");
}

nlohmann::json report_with_search(nlohmann::json pareto) {
  nlohmann::json layers = nlohmann::json::array();
  for (const char* leaf : {"query", "key", "value"})
    layers.push_back({{"path", std::string("bert.encoder.layer.1.attention.self.") + leaf}, {"qtype", "qint4"}, {"bytes", 100}});
  return {{"metric", "accuracy"},
          {"search",
           {{"method", "hessian"}, {"budget", "size_mb: 0.5"}, {"budget_bytes", 500000.0}, {"budget_latency_ms", nullptr},
            {"pareto_axis", "bytes"}, {"layers", layers}, {"pareto", pareto}}}};
}

TEST(ReportHtml, Issue39Item7ParetoChosenLastLogAxesBudgetAndMeasuredAccuracy) {
  // The chosen point first in report.json and under another point; sensitivities over 4 decades.
  const nlohmann::json pareto = {{{"bytes", 400000}, {"latency_ms", 1.0}, {"predicted", 0.001}, {"chosen", true}, {"accuracy", 0.91}},
                                 {{"bytes", 400000}, {"latency_ms", 1.0}, {"predicted", 0.001}},
                                 {{"bytes", 200000}, {"latency_ms", 1.0}, {"predicted", 10.0}, {"accuracy", 0.52}},
                                 {{"bytes", 900000}, {"latency_ms", 1.0}, {"predicted", 0.0005}}};
  const std::string html = render_report_html(report_with_search(pareto), "r.yaml", "0", "");
  const nlohmann::json spec = plot_spec(html, "plot-pareto");
  ASSERT_TRUE(spec.contains("hconcat"));
  ASSERT_EQ(spec.at("hconcat").size(), 2u);  // predicted, and the measured accuracies
  const nlohmann::json& predicted = spec.at("hconcat")[0].at("layer");
  ASSERT_EQ(predicted.size(), 3u);
  EXPECT_EQ(predicted[0].at("data").at("values").size(), 3u);  // the front
  EXPECT_EQ(predicted[1].at("mark").at("type"), "rule");       // the budget
  EXPECT_EQ(predicted[1].at("data").at("values")[0].at("bytes"), 500000.0);
  const nlohmann::json& chosen = predicted.back();            // drawn last: on top
  ASSERT_EQ(chosen.at("data").at("values").size(), 1u);
  EXPECT_EQ(chosen.at("data").at("values")[0].at("chosen"), "chosen");
  EXPECT_EQ(chosen.at("encoding").at("y").at("scale").value("type", ""), "log");   // 0.0005 .. 10
  EXPECT_EQ(chosen.at("encoding").at("x").at("scale").value("type", ""), "");     // 200 kB .. 900 kB: linear
  const nlohmann::json& measured = spec.at("hconcat")[1].at("layer");
  EXPECT_EQ(measured[0].at("data").at("values").size(), 1u);  // the one measured front point
  EXPECT_EQ(measured.back().at("data").at("values")[0].at("accuracy"), 0.91);
  EXPECT_EQ(measured.back().at("encoding").at("y").at("field"), "accuracy");
  // The bit-allocation bars: distinct labels with the full name beside them for the tooltip.
  const nlohmann::json bits = plot_spec(html, "plot-bits");
  std::set<std::string> labels;
  for (const auto& v : bits.at("data").at("values")) {
    labels.insert(v.at("label").get<std::string>());
    EXPECT_EQ(v.at("layer").get<std::string>().substr(v.at("layer").get<std::string>().rfind('.')),
              v.at("label").get<std::string>().substr(v.at("label").get<std::string>().rfind('.')));
  }
  EXPECT_EQ(labels.size(), 3u);
  EXPECT_EQ(bits.at("encoding").at("y").at("field"), "label");
  // Linear axes when nothing spans a decade, and no rule without a budget on the axis.
  nlohmann::json narrow = report_with_search({{{"bytes", 400000}, {"latency_ms", 1.0}, {"predicted", 1.0}, {"chosen", true}},
                                              {{"bytes", 300000}, {"latency_ms", 1.0}, {"predicted", 2.0}}});
  narrow["search"]["budget_bytes"] = nullptr;
  const nlohmann::json n = plot_spec(render_report_html(narrow, "r.yaml", "0", ""), "plot-pareto");
  ASSERT_EQ(n.at("hconcat").size(), 1u);
  const nlohmann::json& nl = n.at("hconcat")[0].at("layer");
  ASSERT_EQ(nl.size(), 2u);
  EXPECT_EQ(nl.back().at("encoding").at("y").at("scale").value("type", ""), "");
}

TEST(ReportHtml, Issue39Item7LayerTableWrapsAndHintsAreShown) {
  nlohmann::json report = {{"metric", "accuracy"},
                           {"layers", {{{"name", "bert.encoder.layer.1.attention.self.query"}, {"type", "Linear"}, {"weights", "qint8"},
                                        {"activations", "qint8"}, {"kernel", "k"}, {"fallback_reason", ""}, {"bytes", 1}}}},
                           {"activations",
                            {{{"path", "attn"}, {"point", "output"}, {"observer", "minmax"}, {"qtype", "qint8"}, {"scale", 1.0 / 127.0},
                              {"zero_point", 0.0}, {"clip_min", -128.0 / 127.0}, {"clip_max", 1.0}, {"min", 0.0}, {"max", 1.0}}}}};
  const std::string html = render_report_html(report, "r.yaml", "0", "");
  EXPECT_NE(html.find("overflow-wrap:anywhere"), std::string::npos);
  EXPECT_NE(html.find("<td>bert.<wbr>encoder.<wbr>layer.<wbr>1.<wbr>attention.<wbr>self.<wbr>query</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>uses 128 of 256 codes: unsigned grid?</td>"), std::string::npos);
}

}  // namespace
}  // namespace qforge
