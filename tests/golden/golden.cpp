// Golden vector loading for the test suites.
#include "tests/golden/golden.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tests/paths.h"

namespace qforge::golden {

nlohmann::json load_golden(const std::string& name) {
  const std::string path = std::string(QFORGE_GOLDEN_DIR) + "/" + name;
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "golden file " << path << " is missing; regenerate with tests/golden/generate.sh";
    return nlohmann::json::object();
  }
  return nlohmann::json::parse(in);
}

at::Tensor golden_tensor(const nlohmann::json& j) {
  const std::vector<int64_t> shape = j.at("shape").get<std::vector<int64_t>>();
  const std::string dtype = j.at("dtype").get<std::string>();
  const auto& data = j.at("data");
  at::Tensor t;
  if (dtype == "float32") {
    std::vector<float> v;
    v.reserve(data.size());
    for (const auto& x : data) v.push_back(static_cast<float>(x.get<double>()));
    t = at::tensor(v, at::kFloat);
  } else if (dtype == "int64" || dtype == "int32") {
    std::vector<int64_t> v = data.get<std::vector<int64_t>>();
    t = at::tensor(v, at::kLong).to(dtype == "int32" ? at::kInt : at::kLong);
  } else if (dtype == "bool") {
    std::vector<int64_t> v;
    for (const auto& x : data) v.push_back(x.get<bool>() ? 1 : 0);
    t = at::tensor(v, at::kLong).to(at::kBool);
  } else {
    ADD_FAILURE() << "golden tensor with unknown dtype " << dtype;
    return at::Tensor();
  }
  return t.reshape(shape);
}

std::string describe_mismatch(const at::Tensor& actual, const at::Tensor& expected) {
  std::ostringstream os;
  os << "actual shape " << actual.sizes() << ", expected shape " << expected.sizes();
  if (actual.sizes() == expected.sizes() && actual.numel() > 0) {
    const at::Tensor diff = (actual.to(at::kDouble) - expected.to(at::kDouble)).abs();
    const int64_t idx = diff.flatten().argmax().item<int64_t>();
    os << ", max |diff| " << diff.max().item<double>() << " at flat index " << idx << " (actual "
       << actual.flatten()[idx].item<double>() << ", expected "
       << expected.flatten()[idx].item<double>() << "), "
       << at::ne(actual.to(at::kDouble), expected.to(at::kDouble)).sum().item<int64_t>()
       << " elements differ";
  }
  return os.str();
}

bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  if (a.scalar_type() != b.scalar_type()) return false;
  return at::equal(a.contiguous(), b.contiguous()) ||
         (a.is_floating_point() &&
          at::logical_or(at::eq(a, b), at::logical_and(at::isnan(a), at::isnan(b))).all().item<bool>());
}

}  // namespace qforge::golden
