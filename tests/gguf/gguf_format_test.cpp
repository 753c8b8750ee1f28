// GGUF container and ggml block encodings: metadata of every type and tensors round-trip, the
// layout matches the specification byte for byte, Q8_0 / Q4_0 follow ggml's reference quantizers
// (scalar twins written here from ggml-quants.c), and truncated or crafted files are refused.
#include <ATen/ATen.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "framework/core/error.h"
#include "framework/format/gguf.h"
#include "framework/format/gguf_blocks.h"

namespace qforge::io {
namespace {

GgufFile sample_file() {
  GgufFile f;
  f.metadata = {
      {"general.architecture", GgufValue::str("test")},
      {"a.u8", GgufValue::u8(200)},           {"a.i8", GgufValue::i8(-100)},
      {"a.u16", GgufValue::u16(60000)},       {"a.i16", GgufValue::i16(-30000)},
      {"a.u32", GgufValue::u32(4000000000u)}, {"a.i32", GgufValue::i32(-2000000000)},
      {"a.u64", GgufValue::u64(1ull << 60)},  {"a.i64", GgufValue::i64(-(1ll << 60))},
      {"a.f32", GgufValue::f32(0.25f)},       {"a.f64", GgufValue::f64(1e-300)},
      {"a.bool", GgufValue::boolean(true)},   {"a.empty", GgufValue::array(GgufValueType::kString, {})},
      {"a.strings", GgufValue::array(GgufValueType::kString, {GgufValue::str("x"), GgufValue::str("\xc4\xa0")})},
      {"a.nested", GgufValue::array(GgufValueType::kArray,
                                    {GgufValue::array(GgufValueType::kInt32, {GgufValue::i32(1), GgufValue::i32(-2)})})},
  };
  at::manual_seed(3);
  f.tensors.push_back(encode_gguf_tensor("w.f32", at::randn({3, 5}), GgmlType::kF32));
  f.tensors.push_back(encode_gguf_tensor("w.f16", at::randn({7}), GgmlType::kF16));
  f.tensors.push_back(encode_gguf_tensor("w.q8", at::randn({2, 64}), GgmlType::kQ8_0));
  f.tensors.push_back(encode_gguf_tensor("w.q4", at::randn({3, 32}), GgmlType::kQ4_0));
  return f;
}

TEST(GgufFormat, MetadataOfEveryTypeAndTensorsRoundTrip) {
  const GgufFile f = sample_file();
  const GgufFile g = parse_gguf(serialize_gguf(f), "sample");
  ASSERT_EQ(g.metadata.size(), f.metadata.size());
  for (size_t i = 0; i < f.metadata.size(); ++i) {
    EXPECT_EQ(g.metadata[i].first, f.metadata[i].first);
    EXPECT_TRUE(g.metadata[i].second == f.metadata[i].second) << f.metadata[i].first;
  }
  ASSERT_EQ(g.tensors.size(), f.tensors.size());
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    EXPECT_EQ(g.tensors[i].name, f.tensors[i].name);
    EXPECT_EQ(g.tensors[i].ne, f.tensors[i].ne);
    EXPECT_EQ(g.tensors[i].type, f.tensors[i].type);
    EXPECT_EQ(g.tensors[i].data, f.tensors[i].data);
  }
  EXPECT_EQ(g.at("a.u64").as_uint("a.u64"), 1ull << 60);
  EXPECT_EQ(g.at("a.i16").as_int("a.i16"), -30000);
  EXPECT_THROW(g.at("a.f32").as_string("a.f32"), Error);
  EXPECT_THROW(g.at("missing"), Error);
}

TEST(GgufFormat, LayoutFollowsTheSpecificationByteForByte) {
  GgufFile f;
  f.metadata = {{"k", GgufValue::u32(7)}};
  f.tensors.push_back(encode_gguf_tensor("t", at::tensor({1.5f, -2.0f}), GgmlType::kF32));
  const std::vector<uint8_t> b = serialize_gguf(f);
  auto u32 = [&](size_t at) { uint32_t v; std::memcpy(&v, b.data() + at, 4); return v; };
  auto u64 = [&](size_t at) { uint64_t v; std::memcpy(&v, b.data() + at, 8); return v; };
  EXPECT_EQ(std::string(b.begin(), b.begin() + 4), "GGUF");
  EXPECT_EQ(u32(4), 3u);    // version
  EXPECT_EQ(u64(8), 1u);    // tensors
  EXPECT_EQ(u64(16), 1u);   // metadata
  EXPECT_EQ(u64(24), 1u);   // key length
  EXPECT_EQ(b[32], 'k');
  EXPECT_EQ(u32(33), 4u);   // UINT32
  EXPECT_EQ(u32(37), 7u);
  EXPECT_EQ(u64(41), 1u);   // name length
  EXPECT_EQ(b[49], 't');
  EXPECT_EQ(u32(50), 1u);   // n_dims
  EXPECT_EQ(u64(54), 2u);   // ne[0]
  EXPECT_EQ(u32(62), 0u);   // F32
  EXPECT_EQ(u64(66), 0u);   // offset
  ASSERT_EQ(b.size(), 128u);  // header and infos 74 bytes, padded to 96; 8 bytes of data, padded to 128
  float x;
  std::memcpy(&x, b.data() + 96, 4);
  EXPECT_EQ(x, 1.5f);
}

TEST(GgufFormat, AlignmentIsHonouredForEveryTensor) {
  GgufFile f = sample_file();
  f.metadata.emplace_back("general.alignment", GgufValue::u32(64));
  const std::vector<uint8_t> b = serialize_gguf(f);
  const GgufFile g = parse_gguf(b, "aligned");
  EXPECT_EQ(g.alignment(), 64u);
  EXPECT_EQ(b.size() % 64, 0u);
  f.metadata.back().second = GgufValue::u32(12);
  EXPECT_THROW(serialize_gguf(f), Error);
}

// ggml-quants.c's quantize_row_q8_0_ref / quantize_row_q4_0_ref, scalar, per block.
std::vector<float> reference_q8_0(const float* x) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127, id = d ? 1 / d : 0;
  const float dh = static_cast<float>(c10::Half(d));
  std::vector<float> y(32);
  for (int j = 0; j < 32; ++j) y[j] = std::roundf(x[j] * id) * dh;
  return y;
}
std::vector<float> reference_q4_0(const float* x) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j)
    if (amax < std::fabs(x[j])) amax = std::fabs(x[j]), max = x[j];
  const float d = max / -8, id = d ? 1 / d : 0;
  const float dh = static_cast<float>(c10::Half(d));
  std::vector<float> y(32);
  for (int j = 0; j < 32; ++j) y[j] = (std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f))) - 8) * dh;
  return y;
}

TEST(GgufBlocks, Q8_0AndQ4_0MatchGgmlsReferenceQuantizers) {
  at::manual_seed(5);
  at::Tensor w = at::randn({4, 96});
  w[1].zero_();  // an all-zero block: d = 0
  w[2][40] = 50.0f;
  for (auto [type, ref] : {std::pair{GgmlType::kQ8_0, &reference_q8_0}, std::pair{GgmlType::kQ4_0, &reference_q4_0}}) {
    const at::Tensor got = decode_gguf_tensor(encode_gguf_tensor("w", w, type));
    ASSERT_EQ(got.sizes(), w.sizes());
    for (int64_t b = 0; b < w.numel() / 32; ++b) {
      const std::vector<float> want = ref(w.data_ptr<float>() + b * 32);
      for (int j = 0; j < 32; ++j) ASSERT_EQ(got.data_ptr<float>()[b * 32 + j], want[j]) << ggml_type_name(type) << b;
    }
  }
  EXPECT_THROW(encode_gguf_tensor("odd", at::randn({2, 40}), GgmlType::kQ8_0), Error);
  at::Tensor bad = at::randn({1, 32});
  bad[0][3] = NAN;
  EXPECT_THROW(encode_gguf_tensor("nan", bad, GgmlType::kF16), Error);
}

TEST(GgufBlocks, CodesAreKeptAndOnlyScalesRoundToFp16) {
  at::manual_seed(6);
  const at::Tensor q8 = at::randint(-128, 128, {3, 64}, at::kInt);
  const at::Tensor q4 = at::randint(-8, 8, {3, 64}, at::kInt);
  const at::Tensor s = at::rand({3, 2}) + 0.01;
  const at::Tensor s16 = s.to(at::kHalf).to(at::kFloat).repeat_interleave(32, 1);
  EXPECT_TRUE(at::equal(decode_gguf_tensor(encode_gguf_codes("a", q8, s, GgmlType::kQ8_0)), q8.to(at::kFloat) * s16));
  EXPECT_TRUE(at::equal(decode_gguf_tensor(encode_gguf_codes("b", q4, s, GgmlType::kQ4_0)), q4.to(at::kFloat) * s16));
  EXPECT_THROW(encode_gguf_codes("c", q8, s, GgmlType::kQ4_0), Error);  // codes past [-8, 7]
  EXPECT_THROW(encode_gguf_codes("d", q4, s.narrow(1, 0, 1), GgmlType::kQ4_0), Error);
  // F16 is IEEE half with round to nearest even.
  const at::Tensor x = at::tensor({1.0f + 1.0f / 4096, 65504.0f, -3.0e-8f});
  EXPECT_TRUE(at::equal(decode_gguf_tensor(encode_gguf_tensor("h", x, GgmlType::kF16)), x.to(at::kHalf).to(at::kFloat)));
}

TEST(GgufFormat, EveryTruncationIsAClearError) {
  const std::vector<uint8_t> b = serialize_gguf(sample_file());
  // The last tensor ends before the final padding: cutting only padding leaves a whole file.
  const GgufFile whole = parse_gguf(b, "whole");
  const size_t end = b.size() - (32 - whole.tensors.back().data.size() % 32) % 32;
  for (size_t n = 0; n < end; ++n) {
    const std::vector<uint8_t> cut(b.begin(), b.begin() + n);
    try {
      parse_gguf(cut, "cut");
      FAIL() << "a file cut to " << n << " of " << b.size() << " bytes parsed";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_TRUE(m.find("truncated") != std::string::npos || m.find("not a GGUF file") != std::string::npos) << n << m;
    }
  }
}

// What parsing `bytes` says: the error's message, or "parsed".
std::string message(const std::vector<uint8_t>& bytes) {
  try {
    parse_gguf(bytes, "crafted");
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string("parsed");
}

std::vector<uint8_t> with_u64(std::vector<uint8_t> b, size_t at, uint64_t v) {
  std::memcpy(b.data() + at, &v, 8);
  return b;
}

TEST(GgufFormat, CraftedFilesAreRefusedWithTheReason) {
  GgufFile f;
  f.metadata = {{"k", GgufValue::array(GgufValueType::kUint8, {GgufValue::u8(1)})}};
  f.tensors.push_back(encode_gguf_tensor("t", at::ones({32}), GgmlType::kF32));
  const std::vector<uint8_t> b = serialize_gguf(f);
  EXPECT_NE(message(with_u64(b, 8, 1ull << 62)).find("tensor count"), std::string::npos);  // huge counts
  EXPECT_NE(message(with_u64(b, 16, 1ull << 62)).find("metadata count"), std::string::npos);
  EXPECT_NE(message(with_u64(b, 24, 1ull << 63)).find("truncated"), std::string::npos);  // key length
  EXPECT_NE(message(with_u64(b, 41, 1ull << 61)).find("elements"), std::string::npos);   // array count
  std::vector<uint8_t> v = b;
  v[4] = 2;
  EXPECT_NE(message(v).find("version 2"), std::string::npos);
  v = b;
  v[0] = 'X';
  EXPECT_NE(message(v).find("not a GGUF file"), std::string::npos);
  // Tensor info: name at 58, n_dims at 59, ne[0] at 63, type at 71, offset at 75.
  EXPECT_NE(message(with_u64(b, 63, 1ull << 40)).find("truncated"), std::string::npos);
  EXPECT_NE(message(with_u64(b, 75, 4096)).find("truncated"), std::string::npos);
  EXPECT_NE(message(with_u64(b, 75, 8)).find("alignment"), std::string::npos);
  v = b;
  v[71] = 10;  // Q2_K
  EXPECT_NE(message(v).find("not one qforge reads"), std::string::npos);
  v = b;
  v[59] = 9;
  EXPECT_NE(message(v).find("dimensions"), std::string::npos);
}

// general.alignment must be a power of two from 8 to 2^16 (a huge one would wrap the data start);
// overlapping tensors are refused whatever their order in the header, a zero-size one included.
TEST(GgufFormat, AlignmentAndOverlapsAreChecked) {
  GgufFile f;
  f.metadata = {{"general.alignment", GgufValue::u32(32)}};
  for (const char* name : {"a", "b", "c"}) f.tensors.push_back(encode_gguf_tensor(name, at::ones({32}), GgmlType::kF32));
  f.tensors[2] = encode_gguf_tensor("c", at::ones({0}), GgmlType::kF32);
  const std::vector<uint8_t> b = serialize_gguf(f);
  auto at_of = [&](const std::string& s) {  // the byte after the first occurrence of `s`
    return static_cast<size_t>(std::search(b.begin(), b.end(), s.begin(), s.end()) - b.begin()) + s.size();
  };
  ASSERT_EQ(message(b), "parsed");
  const size_t align = at_of("general.alignment") + 4;  // after the value type
  for (uint32_t a : {24u, 4u, 1u << 20, 0u}) {
    std::vector<uint8_t> v = b;
    std::memcpy(v.data() + align, &a, 4);
    EXPECT_NE(message(v).find("is not a power of two from 8 to 65536"), std::string::npos) << a;
  }
  // Tensor info: name, n_dims (4), ne[0] (8), type (4), offset (8). "a" at 0, "b" at 128, "c" (size 0) after.
  auto offset_at = [&](const char* name) { return at_of(std::string("\x01\0\0\0\0\0\0\0", 8) + name) + 16; };
  EXPECT_NE(message(with_u64(b, offset_at("b"), 0)).find("overlap"), std::string::npos);
  EXPECT_NE(message(with_u64(b, offset_at("a"), 128)).find("overlap"), std::string::npos);
  EXPECT_NE(message(with_u64(b, offset_at("c"), 64)).find("tensors 'a' and 'c' overlap"), std::string::npos);
  EXPECT_EQ(message(with_u64(b, offset_at("c"), 128)), "parsed");  // size 0 at the start of b
}

TEST(GgufFormat, AFailedWriteLeavesThePreviousFile) {
  const std::string dir = ::testing::TempDir() + "gguf_atomic";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/m.gguf";
  write_gguf(path, sample_file());
  const std::vector<uint8_t> before = serialize_gguf(sample_file());
  GgufFile bad = sample_file();
  bad.tensors[0].data.pop_back();  // size disagrees with the shape: refused before anything is written
  EXPECT_THROW(write_gguf(path, bad), Error);
  bad = sample_file();
  bad.metadata.push_back(bad.metadata[0]);  // duplicate key
  EXPECT_THROW(write_gguf(path, bad), Error);
  const GgufFile g = read_gguf(path);
  EXPECT_EQ(serialize_gguf(g), before);
  std::filesystem::remove_all(dir);
}

// ggml's dequantize_row_q6_K, loop for loop: the decoder and the quantizer's packing are checked against it.
std::vector<float> ggml_dequantize_q6_k(const std::vector<uint8_t>& data, int64_t n) {
  std::vector<float> out(n);
  float* y = out.data();
  for (int64_t i = 0; i < n / 256; ++i) {
    GgmlBlockQ6_K b;
    std::memcpy(&b, data.data() + i * sizeof(b), sizeof(b));
    const float d = static_cast<float>(c10::Half(b.d, c10::Half::from_bits()));
    const uint8_t* ql = b.ql;
    const uint8_t* qh = b.qh;
    const int8_t* sc = b.scales;
    for (int n128 = 0; n128 < 256; n128 += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int8_t q1 = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int8_t q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int8_t q3 = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int8_t q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128, ql += 64, qh += 32, sc += 8;
    }
  }
  return out;
}

TEST(GgufBlocks, Q6KDecodesAsGgmlAndQuantizesWithinAFewPercent) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({3, 512}) * at::linspace(0.01, 2.0, 512);
  const GgufTensor t = encode_gguf_tensor("w", x, GgmlType::kQ6_K);
  EXPECT_EQ(t.data.size(), 3u * 2 * 210);
  const at::Tensor y = decode_gguf_tensor(t);
  const std::vector<float> ref = ggml_dequantize_q6_k(t.data, x.numel());
  EXPECT_TRUE(at::equal(y.flatten(), at::from_blob(const_cast<float*>(ref.data()), {x.numel()}, at::kFloat)));
  // Six bits per value under two-level scales: about 1 % of the signal's RMS.
  EXPECT_LT(((x - y).norm() / x.norm()).item<double>(), 0.02);
  EXPECT_THROW(encode_gguf_tensor("w", at::randn({2, 128}), GgmlType::kQ6_K), Error);  // rows of 256 only
  EXPECT_EQ(ggml_type_named("q6_k"), GgmlType::kQ6_K);
}

// ggml's dequantize_row_q4_K with get_scale_min_k4, loop for loop.
std::vector<float> ggml_dequantize_q4_k(const std::vector<uint8_t>& data, int64_t n) {
  auto scale_min = [](int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
    if (j < 4) {
      *d = q[j] & 63, *m = q[j + 4] & 63;
    } else {
      *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
      *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
  };
  std::vector<float> out(n);
  float* y = out.data();
  for (int64_t i = 0; i < n / 256; ++i) {
    GgmlBlockQ4_K b;
    std::memcpy(&b, data.data() + i * sizeof(b), sizeof(b));
    const float d = static_cast<float>(c10::Half(b.d, c10::Half::from_bits()));
    const float min = static_cast<float>(c10::Half(b.dmin, c10::Half::from_bits()));
    const uint8_t* q = b.qs;
    int is = 0;
    uint8_t sc, m;
    for (int j = 0; j < 256; j += 64) {
      scale_min(is + 0, b.scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      scale_min(is + 1, b.scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32, is += 2;
    }
  }
  return out;
}

TEST(GgufBlocks, Q4KDecodesAsGgmlAndQuantizesWithinItsStep) {
  at::manual_seed(4);
  const at::Tensor x = at::randn({3, 512}) * at::linspace(0.01, 2.0, 512) + 0.1;
  const GgufTensor t = encode_gguf_tensor("w", x, GgmlType::kQ4_K);
  EXPECT_EQ(t.data.size(), 3u * 2 * 144);
  const at::Tensor y = decode_gguf_tensor(t);
  const std::vector<float> ref = ggml_dequantize_q4_k(t.data, x.numel());
  EXPECT_TRUE(at::equal(y.flatten(), at::from_blob(const_cast<float*>(ref.data()), {x.numel()}, at::kFloat)));
  // Four bits per value under 6-bit sub-block scales and mins: each value within about one step
  // (range / 15) of its sub-block, a few percent of the signal's RMS overall.
  const at::Tensor sub = x.reshape({-1, 32});
  const at::Tensor step = (sub.amax(1, true) - sub.amin(1, true).clamp_max(0)) / 15;
  EXPECT_TRUE(((x.reshape({-1, 32}) - y.reshape({-1, 32})).abs() <= 1.1 * step + 1e-6).all().item<bool>());
  const double rel = ((x - y).norm() / x.norm()).item<double>();
  std::printf("Q4_K relative RMS error %.4f\n", rel);
  EXPECT_LT(rel, 0.12);
  // A constant, an all-zero and an all-negative row stay exact or within the step.
  const at::Tensor special = at::stack({at::full({256}, 0.5), at::zeros({256}), -at::rand({256})});
  EXPECT_LT((decode_gguf_tensor(encode_gguf_tensor("s", special, GgmlType::kQ4_K)) - special).abs().max().item<double>(), 0.05);
  EXPECT_THROW(encode_gguf_tensor("w", at::randn({2, 128}), GgmlType::kQ4_K), Error);  // rows of 256 only
  EXPECT_EQ(ggml_type_named("q4_k"), GgmlType::kQ4_K);
}

}  // namespace
}  // namespace qforge::io
