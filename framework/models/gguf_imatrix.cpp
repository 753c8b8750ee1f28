// gguf_imatrix_file: qforge module paths -> GGUF weight names, float64 sums -> the file's entries.
#include "framework/models/gguf_imatrix.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "framework/core/error.h"
#include "framework/models/gguf_export.h"

namespace qforge::models {

namespace {

std::vector<double> values(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

}  // namespace

io::ImatrixFile gguf_imatrix_file(const Imatrix& imatrix, const std::string& dataset, int64_t chunk_size,
                                  std::vector<std::string>* skipped) {
  QF_REQUIRE(chunk_size > 0, "imatrix: chunk_size must be > 0, got ", chunk_size);
  io::ImatrixFile f;
  f.chunk_size = chunk_size;
  if (!dataset.empty()) f.datasets.push_back(dataset);
  int64_t rows = 0;
  for (const auto& [path, e] : imatrix) {
    const std::string name = gguf_weight_name(path);
    if (name.empty()) {
      if (skipped) skipped->push_back(path);
      continue;
    }
    io::ImatrixTensor t;
    t.name = name;
    t.sum_sq = values(e.sum_sq);
    if (e.sum.defined()) t.sum = values(e.sum);
    t.count = e.count;
    rows = std::max(rows, e.count);
    f.tensors.push_back(std::move(t));
  }
  f.chunk_count = rows / chunk_size;
  return f;
}

}  // namespace qforge::models
