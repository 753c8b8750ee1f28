// Runs the qtrain binary as a user does (from the source tree, stderr with stdout), for the tests
// that drive it end to end (QFORGE_SOURCE_DIR and QTRAIN_BIN from tests/paths.h).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <nlohmann/json.hpp>

#include "tests/paths.h"

namespace qforge::testing {

struct QtrainRun {
  int code;
  std::string output;
};

inline QtrainRun qtrain(const std::string& args) {
  const std::string cmd = std::string("cd ") + QFORGE_SOURCE_DIR + " && " + QTRAIN_BIN + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// An empty output directory for one run of this test process: $TMPDIR/qforge_qtrain_<pid>_<name>.
inline std::string out_dir(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / ("qforge_qtrain_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  return d.string();
}

// The run's report.json.
inline nlohmann::json report(const std::string& dir) {
  std::ifstream in(dir + "/report.json");
  return nlohmann::json::parse(in);
}

}  // namespace qforge::testing
