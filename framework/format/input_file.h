// Files a user names as inputs (checkpoints, dumps, caches, safetensors): only regular files are
// read. A FIFO would block the reader forever, a device or directory gives no file to parse.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qforge::io {

// Throws qforge::Error naming `what` and `path` when `path` exists and is not a regular file
// (symbolic links are followed): "<what> <path> is a FIFO, not a regular file". A missing path
// passes (each reader says in its own words that the file is missing).
void require_regular_file(const std::string& path, const std::string& what);

// The whole file at `path` (a regular file, as above), for readers that parse from memory
// (safetensors, GGUF). Throws qforge::Error "<what> <path>: cannot open / error reading".
std::vector<uint8_t> read_regular_file(const std::string& path, const std::string& what);

}  // namespace qforge::io
