// Writes the crafted long-name report (long_names_report.h) through write_report_files, so the
// browser test loads a page of BERT-length layer names as qtrain would write it.
//   report_html_tool OUT_DIR -> OUT_DIR/report.json, report.md, report.html
#include <cstdio>
#include <exception>
#include <filesystem>

#include "framework/report/report_files.h"
#include "tests/apps/long_names_report.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: report_html_tool OUT_DIR\n");
    return 2;
  }
  try {
    std::filesystem::create_directories(argv[1]);
    qforge::Recipe recipe;
    recipe.path = "long_names.yaml";
    recipe.resolved_yaml = "model:\n  arch: bert\n";
    recipe.sha256 = "0";
    qforge::write_report_files(qforge::long_names_report(), recipe, argv[1]);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "report_html_tool: %s\n", e.what());
    return 1;
  }
}
