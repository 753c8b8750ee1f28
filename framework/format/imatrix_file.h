// llama.cpp's importance-matrix files (tools/imatrix, read by llama-quantize --imatrix), written
// and read by qforge's own code. Per weight tensor, named as in the model's GGUF file
// ("blk.0.attn_q.weight"): Σ x_k² over the input rows x its matmul saw, per input column k, and
// the row count. Two layouts, little-endian:
//   GGUF (llama.cpp's default): general.type = "imatrix", imatrix.datasets (string array),
//     imatrix.chunk_count and imatrix.chunk_size (uint32); per tensor "<name>.in_sum2" F32
//     ne = [K, 1] (Σ x²), "<name>.counts" F32 ne = [1, 1] (rows), "<name>.in_sum" F32 [K, 1] (Σ x).
//   legacy .dat: int32 entry count; per entry int32 name length, the name, int32 ncall, int32 K,
//     float32[K] = Σ x² / rows · ncall, with ncall = ceil(rows / chunk_size); then int32 chunk
//     count, int32 dataset-name length and the name. A reader recovers Σ x² = value · chunk_size
//     and rows = ncall · chunk_size, so only the mean Σ x² / rows survives exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/format/gguf.h"

namespace qforge::io {

struct ImatrixTensor {
  std::string name;             // GGUF weight name
  std::vector<double> sum_sq;   // [K] Σ x²
  std::vector<double> sum;      // [K] Σ x, or empty (the legacy layout has none)
  int64_t count = 0;            // rows
};

struct ImatrixFile {
  std::vector<ImatrixTensor> tensors;  // written sorted by name, as llama.cpp writes them
  int64_t chunk_size = 512;            // tokens per chunk (llama-imatrix's context length)
  int64_t chunk_count = 0;             // chunks the statistics cover
  std::vector<std::string> datasets;   // where the text came from (the legacy layout keeps the last)
};

GgufFile imatrix_gguf(const ImatrixFile& file);
ImatrixFile imatrix_from_gguf(const GgufFile& gguf, const std::string& source);
std::vector<uint8_t> serialize_imatrix_dat(const ImatrixFile& file);
// Every length and count is checked against the bytes: a truncated or foreign file is a
// qforge::Error naming `source`, never a read out of bounds.
ImatrixFile parse_imatrix_dat(const std::vector<uint8_t>& bytes, const std::string& source);

// ".dat" paths get the legacy layout, any other the GGUF one; written crash-safely.
void write_imatrix(const std::string& path, const ImatrixFile& file);
// Either layout (GGUF by its magic).
ImatrixFile read_imatrix(const std::string& path);

}  // namespace qforge::io
