// This process's memory as the kernel counts it, from /proc/self/status (Linux): the resident set
// now (VmRSS) and its peak (VmHWM), beside the tensor bytes the tools compute themselves.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace qforge::apps {

// A field of /proc/self/status in KiB ("VmRSS", "VmHWM"); -1 where the file or field is absent.
inline int64_t status_kib(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + key.size());
  return -1;
}

}  // namespace qforge::apps
