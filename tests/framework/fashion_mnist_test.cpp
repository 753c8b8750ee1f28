// Fashion-MNIST IDX reader on the real Debian files, and its errors on bad files.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "framework/core/error.h"
#include "framework/data/fashion_mnist.h"
#include "tests/error_of.h"

using namespace qforge;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("qforge_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

}  // namespace

using qforge::testing::error_of;

TEST(FashionMnist, ReadsTheDebianPackageFiles) {
  if (!std::filesystem::is_directory(data::kFashionMnistDir))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist)";
  const data::FashionMnist d = data::load_fashion_mnist(5000, 1);
  EXPECT_EQ(d.train.size(), 55000);
  EXPECT_EQ(d.validation.size(), 5000);
  EXPECT_EQ(d.test.size(), 10000);
  EXPECT_EQ(d.test.images.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_GE(d.test.images.min().item<float>(), 0.0f);
  EXPECT_LE(d.test.images.max().item<float>(), 1.0f);
  // The test split is balanced: 1000 images per class.
  EXPECT_TRUE(at::equal(at::bincount(d.test.labels), at::full({10}, 1000, at::kLong)));
  // Same seed, same split; another seed, another split.
  const data::FashionMnist again = data::load_fashion_mnist(5000, 1);
  EXPECT_TRUE(at::equal(again.validation.labels, d.validation.labels));
  const data::FashionMnist other = data::load_fashion_mnist(5000, 2);
  EXPECT_FALSE(at::equal(other.validation.labels, d.validation.labels));
}

TEST(FashionMnist, MissingDirectoryNamesTheDebianPackage) {
  const std::string msg = error_of([] { data::load_fashion_mnist(10, 0, "/nonexistent/fashion"); });
  EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
}

TEST(IdxReader, TruncatedAndForeignFilesGiveClearErrors) {
  const std::string truncated = temp_path("truncated.gz");
  write_gz(truncated, {0, 0, 8, 1, 0, 0, 0, 10, 1, 2, 3});  // declares 10 labels, has 3
  std::string msg = error_of([&] { data::read_idx_u8(truncated); });
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find(truncated), std::string::npos) << msg;

  const std::string foreign = temp_path("foreign.gz");
  write_gz(foreign, {'P', 'K', 3, 4, 0, 0, 0, 0});
  msg = error_of([&] { data::read_idx_u8(foreign); });
  EXPECT_NE(msg.find("not a uint8 IDX file"), std::string::npos) << msg;

  const std::string ok = temp_path("ok.gz");
  write_gz(ok, {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6});
  const at::Tensor t = data::read_idx_u8(ok);
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t[1][2].item<int>(), 6);
  for (const auto& p : {truncated, foreign, ok}) std::filesystem::remove(p);
}

// Issue 39 item 24 (idx_fuzz, 2026-11-27): 39 bytes declaring 8 x 50331648 x 8 elements (3 GB)
// were allocated before the data was read; now the read fails at the end of the file first.
TEST(IdxReader, Issue39Item24AShortFileDeclaringGigabytesFailsWithoutAllocatingThem) {
  const std::string lying = temp_path("lying.gz");
  write_gz(lying, {0, 0, 8, 3, 0, 0, 0, 8, 3, 0, 0, 0, 0, 0, 0, 8, 1, 2, 3});  // 8 x 50331648 x 8, 3 bytes of data
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = error_of([&] { data::read_idx_u8(lying); });
  EXPECT_NE(msg.find("truncated or corrupt while reading the IDX data (3 of 3221225472 bytes"), std::string::npos) << msg;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  // A file longer than the first chunk still reads whole, in order.
  const std::string big = temp_path("big.gz");
  const int64_t n = (int64_t{1} << 24) + 5;  // the first chunk is 16 MiB
  std::vector<uint8_t> bytes = {0, 0, 8, 1, 0x01, 0x00, 0x00, 0x05};
  bytes.resize(8 + n, 0);
  bytes[8 + (int64_t{1} << 24) - 1] = 7;
  bytes[8 + n - 1] = 42;
  write_gz(big, bytes);
  const at::Tensor t = data::read_idx_u8(big);
  ASSERT_EQ(t.numel(), n);
  EXPECT_EQ(t[(int64_t{1} << 24) - 1].item<int>(), 7);
  EXPECT_EQ(t[n - 1].item<int>(), 42);
  EXPECT_EQ(t.sum().item<int64_t>(), 49);
  for (const auto& p : {lying, big}) std::filesystem::remove(p);
}
