// The folder tree is the architecture: every #include "..." of qforge's own sources points down
// the layers of docs/architecture.md, never up or sideways. This reads every source file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/paths.h"

namespace {

namespace fs = std::filesystem;

// The layer a repository path belongs to: "framework/core", "framework/api" (framework/api/,
// framework/nn/ and framework/cuda/, which the public API and the layers share: the layers run
// their CUDA paths through framework/cuda), "framework/io", ..., or the
// top-level folder.
std::string layer_of(const std::string& path) {
  const size_t slash = path.find('/');
  if (slash == std::string::npos) return "";
  const std::string top = path.substr(0, slash);
  if (top != "framework") return top;
  const std::string rest = path.substr(slash + 1);
  const size_t next = rest.find('/');
  if (next == std::string::npos) return "framework";  // no loose files: every file has a room
  const std::string sub = rest.substr(0, next);
  if (sub == "nn" || sub == "cuda") return "framework/api";
  return "framework/" + sub;
}

// What each layer may include besides itself (docs/architecture.md, "Layers").
const std::map<std::string, std::set<std::string>>& allowed() {
  static const std::map<std::string, std::set<std::string>> kAllowed = [] {
    const std::set<std::string> lower{"framework/core", "observers", "fake_quant", "kernels"};
    auto with = [&](std::set<std::string> extra) {
      std::set<std::string> s = lower;
      s.insert(extra.begin(), extra.end());
      return s;
    };
    std::map<std::string, std::set<std::string>> m;
    m["framework/core"] = {};
    m["observers"] = {"framework/core"};
    m["fake_quant"] = {"framework/core"};
    m["kernels"] = {"framework/core"};
    m["framework/data"] = {"framework/core"};
    m["framework/format"] = {"framework/core"};
    m["framework/text"] = {"framework/core", "framework/format"};
    m["framework/api"] = lower;
    m["framework/io"] = with({"framework/api", "framework/format"});
    m["framework/train"] = with({"framework/api", "framework/data"});
    m["framework/models"] = with({"framework/api", "framework/format", "framework/io"});
    m["framework/search"] = with({"framework/api", "framework/format", "framework/io"});
    m["framework/ptq"] = with({"framework/api", "framework/models"});  // rotate.h turns Llama models
    m["framework/dist"] = with({"framework/api"});
    m["framework/jit"] = with({"framework/api", "framework/format", "framework/io"});
    m["framework/onnx"] = with({"framework/api", "framework/format", "framework/io", "framework/models"});
    m["framework/recipe"] = with({"framework/api", "framework/data", "framework/format", "framework/io", "framework/train",
                                  "framework/models", "framework/search", "framework/ptq", "framework/onnx",
                                  "framework/dist", "framework/text", "framework/jit"});
    // report.json's sections and renderers sit above the recipe and below the stages that fill them.
    m["framework/report"] = with({"framework/api", "framework/format", "framework/io", "framework/train", "framework/search",
                                  "framework/ptq", "framework/onnx", "framework/recipe"});
    m["framework/pipeline"] = with({"framework/api", "framework/data", "framework/format", "framework/io", "framework/train",
                                    "framework/models", "framework/search", "framework/ptq", "framework/onnx",
                                    "framework/dist", "framework/recipe", "framework/report"});
    m["apps"] = with({"framework/api", "framework/data", "framework/format", "framework/io", "framework/train",
                      "framework/models", "framework/search", "framework/ptq", "framework/onnx", "framework/recipe",
                      "framework/dist", "framework/report", "framework/pipeline", "framework/text"});
    return m;
  }();
  return kAllowed;
}

bool is_source(const fs::path& p) {
  const std::string e = p.extension().string();
  return e == ".h" || e == ".cpp" || e == ".cu" || e == ".cuh" || e == ".inc";
}

}  // namespace

TEST(Architecture, IncludeDirection) {
  const fs::path root = QFORGE_SOURCE_DIR;
  const std::regex include_re(R"(^\s*#\s*include\s*"([^"]+)\")");
  std::vector<std::string> violations;
  int files = 0;
  for (const std::string top : {"framework", "observers", "fake_quant", "kernels", "apps"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      if (!entry.is_regular_file() || !is_source(entry.path())) continue;
      const std::string rel = fs::relative(entry.path(), root).generic_string();
      const std::string from = layer_of(rel);
      const auto rule = allowed().find(from);
      ASSERT_NE(rule, allowed().end()) << rel << ": folder '" << from
                                       << "' has no rule in this test; add it to docs/architecture.md and here";
      ++files;
      std::ifstream in(entry.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        std::smatch m;
        if (!std::regex_search(line, m, include_re)) continue;
        const std::string inc = m[1];
        if (inc.find('/') == std::string::npos) continue;  // same-folder include (none in tree today)
        const std::string to = layer_of(inc);
        if (to == from || rule->second.count(to)) continue;
        violations.push_back(rel + ":" + std::to_string(n) + ": " + from + " includes " + inc + " (" + to + ")");
      }
    }
  }
  EXPECT_GT(files, 100);  // the walk really read the tree
  std::string all;
  for (const std::string& v : violations) all += "\n  " + v;
  EXPECT_TRUE(violations.empty()) << violations.size() << " include(s) against the layer order:" << all;
}

TEST(Architecture, LayerOfNamesTheLayer) {
  EXPECT_EQ(layer_of("framework/core/qtype.h"), "framework/core");
  EXPECT_EQ(layer_of("framework/api/quantize.h"), "framework/api");
  EXPECT_EQ(layer_of("framework/nn/linear.h"), "framework/api");
  EXPECT_EQ(layer_of("framework/cuda/linear_cuda.h"), "framework/api");
  EXPECT_EQ(layer_of("framework/io/checkpoint.h"), "framework/io");
  EXPECT_EQ(layer_of("kernels/cpu/isa.h"), "kernels");
  EXPECT_EQ(allowed().at("kernels").count("fake_quant"), 0u);
  EXPECT_EQ(allowed().at("framework/core").size(), 0u);
  EXPECT_EQ(layer_of("framework/pipeline/stage.h"), "framework/pipeline");
  EXPECT_EQ(allowed().at("framework/recipe").count("framework/pipeline"), 0u);
  EXPECT_EQ(allowed().at("framework/report").count("framework/pipeline"), 0u);
}
