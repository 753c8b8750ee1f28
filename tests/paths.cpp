#include "tests/paths.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace qforge::testing {

// Name, value, name, value, ..., nullptr: written by tests/CMakeLists.txt into the build tree.
extern const char* const kConfiguredPaths[];

const char* path(const char* name) {
  for (const char* const* p = kConfiguredPaths; *p != nullptr; p += 2) {
    if (std::strcmp(*p, name) == 0) return p[1];
  }
  std::fprintf(stderr, "qforge tests: no path %s configured (tests/CMakeLists.txt writes them)\n", name);
  std::abort();
}

}  // namespace qforge::testing
