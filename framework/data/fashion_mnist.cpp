// IDX (gzip) reader and Fashion-MNIST splits.
#include "framework/data/fashion_mnist.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "framework/core/error.h"

namespace qforge::data {
namespace {

// IDX magic: two zero bytes, the element type (0x08 = uint8), the number of dimensions.
constexpr uint8_t kIdxTypeU8 = 0x08;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// `bytes` from f into dst; `offset` and `total` place them in a longer read for the message.
void read_exact(gzFile_s* f, void* dst, size_t bytes, const std::string& path, const char* what, size_t offset = 0,
                size_t total = 0) {
  if (total == 0) total = bytes;
  size_t done = 0;
  auto* out = static_cast<char*>(dst);
  while (done < bytes) {
    const size_t chunk = std::min<size_t>(bytes - done, size_t{1} << 30);
    const int got = gzread(f, out + done, static_cast<unsigned>(chunk));
    if (got <= 0) {
      int err = 0;
      const char* msg = gzerror(f, &err);
      throw Error(detail::str_cat("data: ", path, " is truncated or corrupt while reading ", what, " (", offset + done,
                                  " of ", total, " bytes", err ? std::string(", ") + msg : std::string(), ")"));
    }
    done += static_cast<size_t>(got);
  }
}

}  // namespace

constexpr size_t kIdxFirstChunkBytes = size_t{1} << 24;

at::Tensor read_idx_u8(const std::string& path) {
  GzFile f(gzopen(path.c_str(), "rb"));
  QF_REQUIRE(f, "data: cannot open ", path);
  uint8_t magic[4];
  read_exact(f.get(), magic, 4, path, "the IDX header");
  QF_REQUIRE(magic[0] == 0 && magic[1] == 0 && magic[2] == kIdxTypeU8 && magic[3] >= 1 && magic[3] <= 3,
             "data: ", path, " is not a uint8 IDX file (magic ", int(magic[0]), " ", int(magic[1]), " ",
             int(magic[2]), " ", int(magic[3]), ")");
  std::vector<int64_t> dims(magic[3]);
  int64_t numel = 1;
  for (auto& d : dims) {
    uint8_t be[4];
    read_exact(f.get(), be, 4, path, "the IDX dimensions");
    d = (int64_t{be[0]} << 24) | (int64_t{be[1]} << 16) | (int64_t{be[2]} << 8) | int64_t{be[3]};
    QF_REQUIRE(d > 0 && d < (int64_t{1} << 28), "data: ", path, " has an implausible dimension ", d);
    numel *= d;
  }
  QF_REQUIRE(numel < (int64_t{1} << 32), "data: ", path, " declares ", numel, " elements, too many");
  // The buffer grows with the bytes that arrive: a header declaring gigabytes over a short file
  // (fuzzing found one of 39 bytes asking for 3 GB) fails at the file's end, not in an allocation.
  const auto total = static_cast<size_t>(numel);
  std::vector<uint8_t> data;
  while (data.size() < total) {
    const size_t offset = data.size();
    const size_t chunk = std::min(total - offset, std::max(offset, kIdxFirstChunkBytes));
    data.resize(offset + chunk);
    read_exact(f.get(), data.data() + offset, chunk, path, "the IDX data", offset, total);
  }
  at::Tensor t = at::empty(dims, at::kByte);
  std::memcpy(t.data_ptr<uint8_t>(), data.data(), total);
  uint8_t extra;
  QF_REQUIRE(gzread(f.get(), &extra, 1) == 0, "data: ", path, " has trailing bytes after ", numel, " elements");
  return t;
}

FashionMnist load_fashion_mnist(int64_t validation_size, uint64_t seed, const std::string& dir) {
  namespace fs = std::filesystem;
  QF_REQUIRE(fs::is_directory(dir), "data: Fashion-MNIST not found at ", dir,
             "; install it with: apt-get install ", kFashionMnistPackage);
  auto load = [&](const char* images, const char* labels) {
    const at::Tensor x = read_idx_u8(dir + "/" + images);
    const at::Tensor y = read_idx_u8(dir + "/" + labels);
    QF_REQUIRE(x.dim() == 3 && x.size(1) == 28 && x.size(2) == 28, "data: ", images, " has shape ", x.sizes(),
               ", expected [N, 28, 28]");
    QF_REQUIRE(y.dim() == 1 && y.size(0) == x.size(0), "data: ", labels, " has ", y.numel(), " labels for ",
               x.size(0), " images");
    QF_REQUIRE(y.max().item<int64_t>() < 10, "data: ", labels, " has a label above 9");
    return LabelledImages{x.to(at::kFloat).div_(255.0).unsqueeze(1), y.to(at::kLong)};
  };
  FashionMnist out;
  const LabelledImages full = load("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz");
  out.test = load("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz");
  QF_REQUIRE(validation_size >= 0 && validation_size < full.size(), "data: validation_size ", validation_size,
             " must be in [0, ", full.size(), ")");
  const at::Tensor perm = at::randperm(full.size(), at::detail::createCPUGenerator(seed), at::kLong);
  const at::Tensor val_idx = perm.narrow(0, 0, validation_size);
  const at::Tensor train_idx = perm.narrow(0, validation_size, full.size() - validation_size);
  out.validation = {full.images.index_select(0, val_idx), full.labels.index_select(0, val_idx)};
  out.train = {full.images.index_select(0, train_idx), full.labels.index_select(0, train_idx)};
  return out;
}

const char* fashion_mnist_class_name(int64_t label) {
  static const char* kNames[] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  QF_REQUIRE(label >= 0 && label < 10, "data: Fashion-MNIST label ", label, " out of range");
  return kNames[label];
}

}  // namespace qforge::data
