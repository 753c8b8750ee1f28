// Fashion-MNIST from Debian's dataset-fashion-mnist package: an IDX reader that reads the gzip
// files directly, and a deterministic train/validation split.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace qforge::data {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr const char* kFashionMnistPackage = "dataset-fashion-mnist";

struct LabelledImages {
  at::Tensor images;  // float32 [N, 1, 28, 28], pixel / 255
  at::Tensor labels;  // int64 [N]
  int64_t size() const { return labels.numel(); }
};

struct FashionMnist {
  LabelledImages train;       // the training file minus the validation rows
  LabelledImages validation;  // `validation_size` rows drawn from the training file by `seed`
  LabelledImages test;        // the official test file
};

// Reads an IDX file (optionally gzip-compressed): uint8 data with 1 (labels) or 3 (images)
// dimensions. Throws qforge::Error naming the file for a missing, truncated or foreign file.
at::Tensor read_idx_u8(const std::string& path);

// Loads all splits. A missing directory gives an error naming the Debian package to install.
FashionMnist load_fashion_mnist(int64_t validation_size = 5000, uint64_t seed = 0,
                                const std::string& dir = kFashionMnistDir);

// The ten class names, in label order.
const char* fashion_mnist_class_name(int64_t label);

}  // namespace qforge::data
