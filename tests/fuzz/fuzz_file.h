// Shared by the reader fuzzers: a per-process scratch directory and a file in it that each fuzz
// input is written to, for readers that take a path (HDF5, gzip IDX, recipes).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace qforge::fuzz {

// $TMPDIR/qforge-fuzz-<pid>/, removed at exit (scripts/fuzz points TMPDIR at its work dir).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::filesystem::path d = std::filesystem::path(tmp && *tmp ? tmp : "/tmp") /
                              ("qforge-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return dir;
}

// Replaces the file at `path` with `size` bytes of `data`; aborts when it cannot (a harness bug,
// not a reader finding).
inline void write_file(const std::filesystem::path& path, const uint8_t* data, size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  f.close();
  if (!f) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

}  // namespace qforge::fuzz
