// The calibration's importance matrix as llama.cpp's imatrix file, beside a GGUF export: each
// Linear's statistics under its GGUF weight name (gguf_weight_name), for llama-quantize --imatrix.
#pragma once

#include <string>
#include <vector>

#include "framework/core/imatrix.h"
#include "framework/format/imatrix_file.h"

namespace qforge::models {

// Layers without a GGUF name are left out and listed in `skipped` (when given). `chunk_size`:
// tokens per calibration sequence (llama.cpp's chunk), which the legacy layout's ncall counts.
io::ImatrixFile gguf_imatrix_file(const Imatrix& imatrix, const std::string& dataset, int64_t chunk_size,
                                  std::vector<std::string>* skipped = nullptr);

}  // namespace qforge::models
