// qtrain's report: report.json (the stages' results as the pipeline records them) and report.md
// rendered from it (metrics per stage, sizes, the per-layer table, notes).
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "framework/recipe/recipe.h"

namespace qforge {

// The files write_report_files writes into the output directory.
inline constexpr const char* kReportFileNames[] = {"report.json", "report.md", "report.html"};

// Longest string or key a report copies whole; a longer one (a foreign file's 20 MB key) keeps
// its first kReportTextKept bytes and says how long it was.
inline constexpr size_t kMaxReportText = 16384;
inline constexpr size_t kReportTextKept = 256;

// `j` with every string and key that is not valid UTF-8 in its printable form (\xNN escapes,
// framework/core/utf8.h): JSON text is UTF-8 only.
// Strings and keys longer than kMaxReportText are cut first.
nlohmann::json safe_for_report(const nlohmann::json& j);

// Writes <out_dir>/report.json, report.md and report.html; returns the path of report.json.
// They are written from safe_for_report(report).
std::string write_report_files(const nlohmann::json& report, const Recipe& recipe, const std::string& out_dir);

// report.html: one self-contained page (the plotting library inlined, no network, no other file):
// the summary (metrics per stage, sizes, timings, headline), the per-layer table with the numeric
// suite's SQNR, and Vega-Lite plots of per-layer SQNR, each activation histogram with its clip
// range and grid, the loss curves, and the search's bit allocation and Pareto front; a section
// with nothing to draw says why. Then the resolved recipe. Plots report their drawing in the page:
// window.qforgePlots {total, drawn, failed} and <body data-plots="done" | "failed">.
std::string render_report_html(const nlohmann::json& report, const std::string& recipe_path,
                               const std::string& recipe_sha256, const std::string& resolved_yaml);

// Axis labels for layer names (report.html's bar charts): a name of at most 40 characters as it
// is, a longer one as its first 12 characters, "…" and its last path components within 27 bytes
// (a longer last component cut at a character), components added until no two names share a
// label (the full name is in the bar's tooltip).
std::map<std::string, std::string> distinct_axis_labels(const std::vector<std::string>& names);

// A hint when a static activation's values reach at most half of its integer grid's codes, e.g.
// "uses 128 of 256 codes: unsigned grid?" for a softmax output on a signed grid; "" otherwise.
// Codes used: round((min(max, clip_max) − max(min, clip_min)) / scale) + 1 for the observed
// [min, max] of report.json's "activations" entry.
std::string grid_use_hint(const nlohmann::json& activation);

// The run in two lines, for the end of qtrain's output: the metric of the float model beside the
// last quantized stage that ran (frozen when it did), the size ratio, and the wall time of the
// whole run with float training's share. Stages that did not run are not mentioned as if they had.
std::string headline_text(const nlohmann::json& report);

}  // namespace qforge
