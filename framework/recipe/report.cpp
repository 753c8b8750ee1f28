// Rendering of qtrain's report.json / report.md.
#include "framework/recipe/report.h"

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

}  // namespace

std::string write_report_files(const nlohmann::json& report, const Recipe& r, const std::string& out_dir) {
  const fs::path json_path = fs::path(out_dir) / "report.json";
  std::ofstream(json_path) << report.dump(2) << "\n";
  std::ostringstream md;
  md << "# qtrain report\n\nrecipe `" << r.path << "` (sha256 `" << r.sha256 << "`)\n\n| stage | ";
  const std::string metric = report.value("metric", std::string("metric"));
  md << metric << " | loss |\n|---|---|---|\n";
  for (const char* stage : {"float", "ptq", "qat", "frozen"}) {
    if (!report.at("metrics").contains(stage)) continue;
    const auto& m = report.at("metrics")[stage];
    md << "| " << stage << " | " << fmt(m.value(metric, 0.0)) << " | " << fmt(m.value("loss", 0.0)) << " |\n";
  }
  if (report.at("size_bytes").contains("float"))
    md << "\nsize: " << report.at("size_bytes")["float"].get<int64_t>() << " bytes float"
       << (report.at("size_bytes").contains("frozen")
               ? ", " + std::to_string(report.at("size_bytes")["frozen"].get<int64_t>()) + " bytes frozen"
               : std::string())
       << "\n";
  if (report.contains("layers")) {
    md << "\n| layer | type | weights | activations | kernel | fallback |\n|---|---|---|---|---|---|\n";
    for (const auto& l : report.at("layers"))
      md << "| " << l["name"].get<std::string>() << " | " << l["type"].get<std::string>() << " | "
         << l["weights"].get<std::string>() << " | " << l["activations"].get<std::string>() << " | "
         << l["kernel"].get<std::string>() << " | " << l["fallback_reason"].get<std::string>() << " |\n";
  }
  for (const auto& n : report.at("notes")) md << "\n- " << n.get<std::string>();
  std::ofstream(fs::path(out_dir) / "report.md") << md.str() << "\n";
  return json_path.string();
}

}  // namespace qforge
