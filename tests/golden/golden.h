// Golden vectors: JSON files written by tests/golden/gen_*.py with Debian's python3-torch (the
// PyTorch oracle). Tensors are {"shape": [...], "dtype": "float32"|"int64"|"int32"|"bool", "data": [...]}
// with data flattened row-major; float32 values are stored as exact decimal doubles.
#pragma once

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <string>

namespace qforge::golden {

// Parses tests/golden/<name> (e.g. "fake_quant.json"); fails the test with a clear message when
// the file is missing.
nlohmann::json load_golden(const std::string& name);

// A tensor from its JSON form.
at::Tensor golden_tensor(const nlohmann::json& j);

// Max |a-b| and a printable description, for assertion messages.
std::string describe_mismatch(const at::Tensor& actual, const at::Tensor& expected);

// Exact equality including shape; NaN equals NaN.
bool bit_equal(const at::Tensor& a, const at::Tensor& b);

}  // namespace qforge::golden
