// The ISA translation units (compiled with their own -mavx* flags, kernels/cpu/CMakeLists.txt)
// include no ATen, c10 or torch header, directly or through the headers they include: LibTorch's
// inline code compiled with AVX-512 flags could be picked by the linker for baseline callers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/paths.h"

namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The sources listed in the qforge_kernels_isa_sources(...) calls of kernels/cpu/CMakeLists.txt.
std::vector<std::string> isa_sources(const fs::path& root) {
  const std::string cmake = read_text(root / "kernels/cpu/CMakeLists.txt");
  std::vector<std::string> out;
  const std::regex call(R"(qforge_kernels_isa_sources\(([^)]*)\))");
  const std::regex source(R"(([A-Za-z0-9_]+\.cpp))");
  for (auto it = std::sregex_iterator(cmake.begin(), cmake.end(), call); it != std::sregex_iterator(); ++it) {
    const std::string args = (*it)[1];
    for (auto s = std::sregex_iterator(args.begin(), args.end(), source); s != std::sregex_iterator(); ++s) {
      out.push_back("kernels/cpu/" + (*s)[1].str());
    }
  }
  return out;
}

// Appends to *bad "file: <header>" for every LibTorch include reachable from `file`.
void scan(const fs::path& root, const std::string& file, std::set<std::string>* seen, std::vector<std::string>* bad) {
  if (!seen->insert(file).second) return;
  const std::regex include(R"(^\s*#\s*include\s*([<"])([^>"]+)[>"])");
  std::istringstream lines(read_text(root / file));
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, include)) continue;
    const std::string header = m[2];
    if (header.rfind("ATen/", 0) == 0 || header.rfind("c10/", 0) == 0 || header.rfind("torch/", 0) == 0) {
      bad->push_back(file + ": " + header);
    } else if (m[1] == "\"" && fs::exists(root / header)) {
      scan(root, header, seen, bad);
    }
  }
}

}  // namespace

TEST(IsaSources, IncludeNoLibTorchHeaderDirectlyOrIndirectly) {
  const fs::path root = QFORGE_SOURCE_DIR;
  const std::vector<std::string> sources = isa_sources(root);
  ASSERT_GE(sources.size(), 10u) << "expected the ISA kernel files of kernels/cpu/CMakeLists.txt";
  std::set<std::string> seen;
  std::vector<std::string> bad;
  for (const std::string& s : sources) scan(root, s, &seen, &bad);
  std::string all;
  for (const std::string& b : bad) all += "\n  " + b;
  EXPECT_TRUE(bad.empty()) << "LibTorch headers reached from ISA translation units:" << all;
}
