// framework/format/safetensors: round trips and clear errors for truncated, foreign and inconsistent files.
#include "framework/format/safetensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "framework/core/error.h"

namespace qforge::io {
namespace {

std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

void expect_error(const std::vector<uint8_t>& bytes, const std::string& fragment) {
  try {
    parse_safetensors(bytes, "test.safetensors");
    FAIL() << "expected an error containing '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RoundTripKeepsValuesShapesDtypesAndMetadata) {
  at::manual_seed(1);
  std::map<std::string, at::Tensor> in = {
      {"a.weight", at::randn({3, 5})},
      {"b.half", at::randn({4}).to(at::kHalf)},
      {"c.bf16", at::randn({2, 2}).to(at::kBFloat16)},
      {"d.ids", at::arange(7, at::kLong)},
      {"e.flags", at::tensor({1, 0, 1}).to(at::kBool)},
      {"f.scalar", at::full({}, 2.5f)},
      {"g.empty", at::empty({0, 3})},
      {"h.transposed", at::randn({3, 4}).t()},  // non-contiguous input
  };
  const auto bytes = serialize_safetensors(in, {{"format", "pt"}});
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u) << "data section should start 8-byte aligned";

  const SafetensorsFile raw = parse_safetensors(bytes, "mem", {/*to_float32=*/false});
  EXPECT_EQ(raw.metadata.at("format"), "pt");
  ASSERT_EQ(raw.tensors.size(), in.size());
  for (const auto& [k, t] : in) {
    const at::Tensor& r = raw.tensors.at(k);
    EXPECT_EQ(r.scalar_type(), t.scalar_type()) << k;
    EXPECT_EQ(r.sizes(), t.sizes()) << k;
    EXPECT_TRUE(at::equal(r, t.contiguous())) << k;
  }
  const SafetensorsFile f32 = parse_safetensors(bytes, "mem");
  EXPECT_EQ(f32.tensors.at("b.half").scalar_type(), at::kFloat);
  EXPECT_EQ(f32.tensors.at("c.bf16").scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(f32.tensors.at("c.bf16"), in.at("c.bf16").to(at::kFloat)));
  EXPECT_EQ(f32.tensors.at("d.ids").scalar_type(), at::kLong);
}

TEST(Safetensors, FileRoundTripThroughWriteAndRead) {
  const auto path = (std::filesystem::temp_directory_path() / "qforge_st_roundtrip.safetensors").string();
  std::map<std::string, at::Tensor> in = {{"x", at::randn({17, 3})}};
  write_safetensors(path, in);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_TRUE(at::equal(read_safetensors(path).tensors.at("x"), in.at("x")));
  std::filesystem::remove(path);
}

TEST(Safetensors, ReadsAFileWrittenByTheReferenceLayout) {
  // Hand-built: F16 tensor [2] = {1.0, -2.0} (0x3C00, 0xC000), BF16 [1] = 0.5 (0x3F00).
  const std::string h = R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]},"__metadata__":{"k":"v"}})";
  auto bytes = make_file(h, 6);
  const uint8_t data[6] = {0x00, 0x3C, 0x00, 0xC0, 0x00, 0x3F};
  std::memcpy(bytes.data() + 8 + h.size(), data, 6);
  const auto f = parse_safetensors(bytes, "mem");
  EXPECT_TRUE(at::equal(f.tensors.at("h"), at::tensor({1.0f, -2.0f})));
  EXPECT_EQ(f.tensors.at("b").item<float>(), 0.5f);
  EXPECT_EQ(f.metadata.at("k"), "v");
}

TEST(Safetensors, TruncatedFilesAreErrors) {
  expect_error({1, 2, 3}, "fewer than the 8-byte header length");
  auto ok = serialize_safetensors({{"x", at::ones({4})}});
  expect_error(std::vector<uint8_t>(ok.begin(), ok.end() - 3), "truncated");
  expect_error(std::vector<uint8_t>(ok.begin(), ok.begin() + 20), "truncated");
}

TEST(Safetensors, ForeignFilesAreErrors) {
  const char kGzip[] = "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03 some compressed bytes";
  const std::string gzip(kGzip, sizeof kGzip - 1);
  expect_error(std::vector<uint8_t>(gzip.begin(), gzip.end()), "not a safetensors file");
  const std::string text = "hello world, this is a text file that is long enough";
  expect_error(std::vector<uint8_t>(text.begin(), text.end()), "not a safetensors file");
  expect_error(make_file("[1, 2, 3]", 0), "not a safetensors file");
  expect_error(make_file("{not json}", 0), "not valid JSON");
}

TEST(Safetensors, InconsistentHeadersAreErrors) {
  expect_error(make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4), "need 8");
  expect_error(make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})", 6),
               "overlaps");
  expect_error(make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "gap");
  expect_error(make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 9), "trailing bytes");
  expect_error(make_file(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "truncated");
  expect_error(make_file(R"({"x":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1), "unsupported dtype 'Q4'");
  expect_error(make_file(R"({"x":{"dtype":"F32","shape":[1]}})", 4), "needs dtype, shape and data_offsets");
  expect_error(make_file(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "bad dimension");
  expect_error(make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4), "begin > end");
  expect_error(make_file(R"({"__metadata__":{"k":1}})", 0), "not a string");
}

TEST(Safetensors, OverlappingEntriesAreRefusedBeforeAnythingIsAllocated) {
  // 2 000 entries over the same 1 MiB: 2 GiB of tensors from a 1 MiB file if entries were
  // allocated while the header is read. The process's peak memory must not move by that much.
  const size_t mib = size_t{1} << 20;
  std::string header = "{";
  for (int i = 0; i < 2000; ++i)
    header += (i ? ",\"t" : "\"t") + std::to_string(i) + R"(":{"dtype":"U8","shape":[1048576],"data_offsets":[0,1048576]})";
  header += "}";
  const std::vector<uint8_t> bytes = make_file(header, mib);
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  expect_error(bytes, "overlaps");
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 256 * 1024) << "peak resident KiB grew while rejecting the file";
}

TEST(Safetensors, MissingFileNamesThePath) {
  try {
    read_safetensors("/nonexistent/model.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.safetensors"), std::string::npos);
  }
}

}  // namespace
}  // namespace qforge::io
