// safetensors: Hugging Face's checkpoint format, read and written by qforge's own code.
// Layout: an 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}},
// then the raw little-endian tensor bytes (offsets relative to the end of the header).
// Reading validates every offset, size and overlap; F16/BF16 can be converted to float32 on read.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace qforge::io {

struct SafetensorsFile {
  std::map<std::string, at::Tensor> tensors;         // owned, contiguous CPU tensors
  std::map<std::string, std::string> metadata;       // the optional "__metadata__" object
};

struct SafetensorsReadOptions {
  // Convert F16 / BF16 / F64 tensors to float32 (what qforge's float models hold).
  bool to_float32 = true;
};

// Parses a whole file held in memory; `source` names it in error messages.
SafetensorsFile parse_safetensors(const std::vector<uint8_t>& bytes, const std::string& source,
                                  const SafetensorsReadOptions& options = {});

// Reads `path`. Throws qforge::Error for missing, truncated, foreign or inconsistent files.
SafetensorsFile read_safetensors(const std::string& path, const SafetensorsReadOptions& options = {});

// Serialises tensors (any of F64/F32/F16/BF16/I64/I32/I16/I8/U8/BOOL; moved to CPU, made
// contiguous) in key order, 8-byte aligned header as the reference implementation writes it.
std::vector<uint8_t> serialize_safetensors(const std::map<std::string, at::Tensor>& tensors,
                                           const std::map<std::string, std::string>& metadata = {});

// Writes to `path` through a temporary file and a rename, so a crash never leaves half a file.
void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace qforge::io
