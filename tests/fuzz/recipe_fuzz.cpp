// Fuzzes qforge::load_recipe on arbitrary YAML text. The input is written as recipes/fuzz.yaml in
// a scratch copy of the repository's recipes/ and configs/, so `include: ../configs/...` resolves
// and includes, merges and overrides are exercised; each comment line "#set key=value" of the
// input is also passed as a --set override. Any input must load or throw; never crash, hang or
// leak. Seeds: recipes/*.yaml, configs/**/*.yaml (tests/fuzz/corpus/recipe).
#include <cstdint>
#include <exception>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "framework/recipe/recipe.h"
#include "tests/fuzz/fuzz_file.h"

namespace {

namespace fs = std::filesystem;

// "#set " lines of the input, as qtrain's --set values.
std::vector<std::string> overrides_in(const std::string& text) {
  constexpr const char* kPrefix = "#set ";
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(kPrefix, 0) == 0) out.push_back(line.substr(std::char_traits<char>::length(kPrefix)));
  return out;
}

const fs::path& recipe_path() {
  static const fs::path path = [] {
    const fs::path root = qforge::fuzz::scratch_dir() / "repo";
    fs::create_directories(root / "recipes");
    fs::copy(fs::path(QFORGE_FUZZ_SOURCE_DIR) / "configs", root / "configs", fs::copy_options::recursive);
    return root / "recipes" / "fuzz.yaml";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path& path = recipe_path();
  qforge::fuzz::write_file(path, data, size);
  try {
    (void)qforge::load_recipe(path.string(), overrides_in(std::string(data, data + size)));
  } catch (const std::exception&) {
  }
  return 0;
}
