// Runs the qtrain binary as a user does (from the source tree, stderr with stdout), for the tests
// that drive it end to end (QFORGE_SOURCE_DIR and QTRAIN_BIN from tests/paths.h).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

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

}  // namespace qforge::testing
