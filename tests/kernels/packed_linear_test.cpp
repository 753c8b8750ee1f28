// PackedLinearS8 / PackedLinearS4: whole-layer results equal the reference chain bit for bit on
// every path (GEMV kernels, oneDNN), the chosen kernel is reported, bad input throws.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/reference.h"
#include "kernel_test_util.h"

using namespace qforge::kernels;
using namespace qforge::kernels::testing;

namespace {

at::Tensor s8_tensor(const std::vector<int8_t>& v, int64_t rows, int64_t cols) {
  return at::from_blob(const_cast<int8_t*>(v.data()), {rows, cols}, at::kChar).clone();
}
at::Tensor f32_tensor(const std::vector<float>& v, std::vector<int64_t> shape) {
  return at::from_blob(const_cast<float*>(v.data()), shape, at::kFloat).clone();
}

// quantize_rows_s8 -> gemm_s8s8s32 -> dequantize, all reference.
std::vector<float> reference_s8(const std::vector<float>& x, const std::vector<int8_t>& W,
                                const std::vector<float>& ws, const float* bias, int64_t M,
                                int64_t N, int64_t K, ActScale mode) {
  std::vector<int8_t> q(M * K);
  std::vector<float> as(M), y(M * N);
  std::vector<int32_t> acc(M * N);
  quantize_rows_s8_reference(x.data(), M, K, mode, q.data(), K, as.data());
  gemm_s8s8s32_reference(q.data(), W.data(), acc.data(), M, N, K);
  dequantize_s32_f32_reference(acc.data(), as.data(), ws.data(), bias, y.data(), M, N);
  return y;
}

}  // namespace

TEST(PackedLinearS8, EveryPathMatchesReferenceChainExactly) {
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes{
      {1, 1, 1}, {2, 17, 33}, {7, 64, 100}, {16, 33, 4099}, {31, 40, 70},
      {32, 48, 64}, {33, 17, 129}, {128, 65, 257}};
  for (Isa isa : usable_isas()) {
    ScopedMaxIsa cap(isa);
    for (auto [M, N, K] : shapes) {
      for (ActScale mode : {ActScale::kPerRow, ActScale::kPerTensor}) {
        const uint32_t seed = static_cast<uint32_t>(M * 100 + N * 10 + K);
        const auto x = random_f32(M * K, -2.0f, 2.0f, seed);
        const auto W = random_s8(N * K, -128, 127, seed + 1);
        const auto ws = random_f32(N, 0.001f, 0.05f, seed + 2);
        const auto b = random_f32(N, -0.5f, 0.5f, seed + 3);
        const PackedLinearS8 layer(s8_tensor(W, N, K), f32_tensor(ws, {N}), f32_tensor(b, {N}));
        RunInfo info;
        const at::Tensor y = layer.run(f32_tensor(x, {M, K}), &info, mode);
        const auto y_ref = reference_s8(x, W, ws, b.data(), M, N, K, mode);
        ASSERT_TRUE(bitwise_equal(y.data_ptr<float>(), y_ref.data(), y_ref.size()))
            << info.kernel << " M=" << M << " N=" << N << " K=" << K;
        if (M >= layer.onednn_min_m() && isa == Isa::kAvx512Vnni && layer.has_onednn()) {
          EXPECT_EQ(info.kernel, "gemm_s8s8s32_onednn");
        }
        if (isa == Isa::kReference) {
          EXPECT_EQ(info.kernel, "reference");
          EXPECT_FALSE(info.fallback.empty());
        }
      }
    }
  }
}

TEST(PackedLinearS8, OneDnnIsUsedForLargeMAndReportedOtherwise) {
  if (!isa_usable(Isa::kAvx512Vnni)) GTEST_SKIP() << "oneDNN path needs AVX-512 VNNI";
  const int64_t M = 64, N = 32, K = 48;
  const auto W = random_s8(N * K, -128, 127, 1);
  const auto ws = random_f32(N, 0.01f, 0.02f, 2);
  const PackedLinearS8 with(s8_tensor(W, N, K), f32_tensor(ws, {N}));
  ASSERT_TRUE(with.has_onednn()) << with.onednn_status();
  const PackedLinearS8 without(s8_tensor(W, N, K), f32_tensor(ws, {N}), {}, PackOptions{false});
  const at::Tensor x = at::randn({M, K});
  RunInfo a, b;
  const at::Tensor ya = with.run(x, &a), yb = without.run(x, &b);
  EXPECT_EQ(a.kernel, "gemm_s8s8s32_onednn");
  EXPECT_TRUE(a.fallback.empty()) << a.fallback;
  EXPECT_EQ(b.kernel, "gemv_u8s8s32_n16k4_avx512vnni");
  EXPECT_NE(b.fallback.find("PackOptions::onednn"), std::string::npos) << b.fallback;
  EXPECT_TRUE(at::equal(ya, yb));
  EXPECT_GT(with.bytes(), without.bytes());
}

TEST(PackedLinearS8, KeepsLeadingDimensionsAndRoundTripsWeight) {
  const auto W = random_s8(24 * 10, -128, 127, 3);
  const PackedLinearS8 layer(s8_tensor(W, 24, 10), at::full({24}, 0.1f));
  const at::Tensor y = layer.run(at::randn({2, 3, 10}));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 3, 24}));
  EXPECT_TRUE(at::equal(layer.weight(), s8_tensor(W, 24, 10)));
  EXPECT_EQ(layer.in_features(), 10);
  EXPECT_EQ(layer.out_features(), 24);
  EXPECT_GE(layer.bytes(), 24 * 12 + 24 * 4);
}

TEST(PackedLinearS8, BadInputThrows) {
  const PackedLinearS8 layer(at::zeros({8, 16}, at::kChar), at::ones({8}));
  EXPECT_THROW(layer.run(at::randn({2, 15})), qforge::Error);               // K mismatch
  EXPECT_THROW(layer.run(at::randn({2, 16}).to(at::kDouble)), qforge::Error);  // dtype
  EXPECT_THROW(layer.run(at::Tensor()), qforge::Error);                     // undefined
  EXPECT_THROW(layer.run(nullptr, 2, nullptr), qforge::Error);               // null
  EXPECT_THROW(PackedLinearS8(at::zeros({8, 16}, at::kChar), at::ones({7})), qforge::Error);
  EXPECT_THROW(PackedLinearS8(at::zeros({8, 16}), at::ones({8})), qforge::Error);  // not int8
  EXPECT_THROW(PackedLinearS8(at::zeros({0, 16}, at::kChar), at::ones({0})), qforge::Error);
  EXPECT_THROW(PackedLinearS8(at::zeros({8, 16}, at::kChar), at::ones({8}), at::ones({9})),
               qforge::Error);
  EXPECT_THROW(PackedLinearS8().run(at::randn({1, 16})), qforge::Error);
  at::Tensor x = at::randn({1, 16});
  x[0][3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(layer.run(x), qforge::Error);
  EXPECT_EQ(layer.run(at::randn({0, 16})).sizes(), (std::vector<int64_t>{0, 8}));
}

TEST(PackedLinearS4, EveryPathMatchesReferenceChainExactly) {
  const std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> shapes{
      {1, 1, 8, 8}, {1, 17, 33, 16}, {3, 64, 100, 32}, {16, 33, 4099, 128}, {7, 5, 12, 12},
      {40, 20, 64, 64}};
  for (Isa isa : usable_isas()) {
    ScopedMaxIsa cap(isa);
    for (auto [M, N, K, g] : shapes) {
      for (const qforge::QType& qt : {qforge::qint4, qforge::quint4}) {
        const uint32_t seed = static_cast<uint32_t>(M * 100 + N * 10 + K + g);
        const int64_t G = num_groups(K, g);
        const auto x = random_f32(M * K, -2.0f, 2.0f, seed);
        const auto W = random_s8(N * K, qt.quant_min, qt.quant_max, seed + 1);
        const auto ws = random_f16_exact(N * G, 0.001f, 0.05f, seed + 2);
        const auto z8 = random_s8(N * G, qt.quant_min, qt.quant_max, seed + 3);
        const std::vector<int32_t> z(z8.begin(), z8.end());
        const bool use_zero = qt.quant_min == 0;
        const PackedLinearS4 layer(
            s8_tensor(W, N, K), f32_tensor(ws, {N, G}),
            use_zero ? at::from_blob(const_cast<int32_t*>(z.data()), {N, G}, at::kInt).clone()
                     : at::Tensor(),
            g, {}, qt);
        RunInfo info;
        const at::Tensor y = layer.run(f32_tensor(x, {M, K}), &info);

        std::vector<int8_t> q(M * K);
        std::vector<float> as(M), y_ref(M * N);
        quantize_rows_s8_reference(x.data(), M, K, ActScale::kPerRow, q.data(), K, as.data());
        gemm_s8s4f32_reference(q.data(), as.data(), W.data(), ws.data(),
                               use_zero ? z.data() : nullptr, g, nullptr, y_ref.data(), M, N, K);
        ASSERT_TRUE(bitwise_equal(y.data_ptr<float>(), y_ref.data(), y_ref.size()))
            << info.kernel << " M=" << M << " N=" << N << " K=" << K << " g=" << g << " " << qt.name;
        EXPECT_TRUE(at::equal(layer.weight(), s8_tensor(W, N, K)));
      }
    }
  }
}

TEST(PackedLinearS4, StorageIsHalfAByteAWeightPlusGroupMetadata) {
  const int64_t N = 64, K = 256, g = 32;
  const PackedLinearS4 layer(at::zeros({N, K}, at::kChar), at::ones({N, K / g}), {}, g);
  EXPECT_EQ(layer.bytes(), N * K / 2 + N * (K / g) * (2 + 1));  // fp16 scale + int8 zero code
  EXPECT_EQ(layer.groups(), K / g);
}

TEST(PackedLinearS4, Int4Group128With4096SquareIsAtMost4Point2BitsPerWeight) {
  const int64_t N = 4096, K = 4096, g = 128;
  const at::Tensor scale = at::full({N, K / g}, 0.01f).to(at::kHalf).to(at::kFloat);
  const PackedLinearS4 layer(at::zeros({N, K}, at::kChar), scale, {}, g, at::zeros({N}));
  const double bits_per_weight = 8.0 * static_cast<double>(layer.bytes()) / (N * K);
  EXPECT_LE(bits_per_weight, 4.2) << layer.bytes() << " bytes";
  EXPECT_GE(32.0 / bits_per_weight, 7.5) << "fp32 / int4 size ratio";
  EXPECT_EQ(layer.bytes(), N * K / 2 + N * (K / g) * 3 + 4 * N);
}

TEST(PackedLinearS4, ScaleNotExactInFloat16ThrowsNamingTheGroup) {
  const at::Tensor w = at::zeros({20, 16}, at::kChar);
  at::Tensor s = at::full({20, 2}, 0.125f);
  PackedLinearS4(w, s, {}, 8);  // 1/8 is exact in fp16
  s[17][1] = 0.1f;              // fp16 rounds it to 0.0999755859375
  try {
    PackedLinearS4(w, s, {}, 8);
    ADD_FAILURE() << "0.1f is not an fp16 value";
  } catch (const qforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("w_scale[17, 1]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("float16"), std::string::npos) << e.what();
  }
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                    65520.0f /* rounds to fp16 inf */, 1e-8f /* under the fp16 subnormals */}) {
    s = at::full({20, 2}, 0.125f);
    s[0][0] = bad;
    EXPECT_THROW(PackedLinearS4(w, s, {}, 8), qforge::Error) << bad;
  }
  // fp16 subnormals and negative values are exact, hence accepted.
  s = at::full({20, 2}, std::ldexp(1.0f, -24));
  s[3][0] = -2.5f;
  PackedLinearS4(w, s, {}, 8);
}

TEST(PackedLinearS4, BadInputThrows) {
  EXPECT_THROW(PackedLinearS4(at::full({4, 8}, 8, at::kChar), at::ones({4, 1}), {}, 8),
               qforge::Error);  // 8 is outside qint4
  EXPECT_THROW(PackedLinearS4(at::zeros({4, 8}, at::kChar), at::ones({4, 2}), {}, 8),
               qforge::Error);  // scale shape vs groups
  EXPECT_THROW(PackedLinearS4(at::zeros({4, 8}, at::kChar), at::ones({4, 1}), {}, 0),
               qforge::Error);  // group size
  EXPECT_THROW(PackedLinearS4(at::zeros({4, 8}, at::kChar), at::ones({4, 1}),
                              at::full({4, 1}, 9, at::kInt), 8),
               qforge::Error);  // zero point outside the grid
  EXPECT_THROW(PackedLinearS4(at::zeros({4, 8}, at::kChar), at::ones({4, 1}), {}, 8, {}, qforge::qint8),
               qforge::Error);
  const PackedLinearS4 layer(at::zeros({4, 8}, at::kChar), at::ones({4}), {}, 8);
  EXPECT_THROW(layer.run(at::randn({3, 9})), qforge::Error);
}

// A frozen layer is const and its scratch is per thread: calls from several threads at once, of
// different sizes, give each the result it gets alone.
TEST(PackedLinear, ConcurrentCallsFromSeveralThreadsMatchSequentialOnes) {
  constexpr int64_t N = 70, K = 200;
  const at::Tensor w8 = at::randint(-127, 128, {N, K}, at::kChar);
  const PackedLinearS8 s8(w8, at::rand({N}) * 0.01 + 0.001, at::randn({N}));
  const at::Tensor scale = (at::rand({N, 5}) * 0.1 + 0.01).to(at::kHalf).to(at::kFloat);
  const PackedLinearS4 s4(at::randint(-8, 8, {N, K}, at::kChar), scale, {}, 40, at::randn({N}));
  constexpr int kThreads = 4, kCalls = 20;
  std::vector<at::Tensor> xs;
  for (int t = 0; t < kThreads; ++t) xs.push_back(at::randn({1 + 7 * t, K}));  // 22 rows: the float GEMM entry
  std::vector<std::vector<at::Tensor>> expected(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    expected[t] = {s8.run(xs[t]), s4.run(xs[t]), s8.run_weight_only(xs[t]), s4.run_weight_only(xs[t])};
  }
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        const std::vector<at::Tensor> got{s8.run(xs[t]), s4.run(xs[t]), s8.run_weight_only(xs[t]),
                                          s4.run_weight_only(xs[t])};
        for (size_t j = 0; j < got.size(); ++j) mismatches[t] += at::equal(got[j], expected[t][j]) ? 0 : 1;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// GGUF Q4_0's grid (symmetric qint4, groups of 32, fp16 scales) packed n16b32: Q4_0's 18 bytes per
// 32 weights in one stream (an odd block count pads one block), nothing else held but the bias;
// the codes and scales read back exactly;
// both weight-only paths give the n16k8 form's results bit for bit, at every usable ISA level.
TEST(PackedLinearS4, GgufQ4_0OneStreamFormHolds18BytesPer32WeightsAndComputesTheSame) {
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes{
      {1, 40, 96}, {3, 17, 4099}, {20, 33, 64}, {2, 16, 128}};
  for (auto [M, N, K] : shapes) {
    const uint32_t seed = static_cast<uint32_t>(M * 100 + N * 10 + K);
    const int64_t G = num_groups(K, 32);
    const at::Tensor W = s8_tensor(random_s8(N * K, -8, 7, seed), N, K);
    const at::Tensor ws = f32_tensor(random_f16_exact(N * G, 0.001f, 0.05f, seed + 1), {N, G});
    const at::Tensor bias = f32_tensor(random_f32(N, -1.0f, 1.0f, seed + 2), {N});
    const PackedLinearS4 k8(W, ws, {}, 32, bias);
    const PackedLinearS4 b32(W, ws, at::zeros({N, G}, at::kInt), 32, bias, qforge::qint4, S4Layout::kN16B32);
    ASSERT_EQ(b32.layout(), S4Layout::kN16B32) << b32.layout_status();
    EXPECT_EQ(b32.bytes(), round_up(N, 16) / 16 * ((G + 1) / 2) * 576 + N * 4);
    EXPECT_EQ(b32.view().scales, nullptr);
    EXPECT_EQ(b32.view().zeros, nullptr);
    EXPECT_TRUE(at::equal(b32.weight(), W));
    EXPECT_TRUE(at::equal(b32.w_scale(), ws));
    const at::Tensor x = f32_tensor(random_f32(M * K, -2.0f, 2.0f, seed + 3), {M, K});
    for (Isa isa : usable_isas()) {
      ScopedMaxIsa cap(isa);
      RunInfo info;
      EXPECT_TRUE(at::equal(b32.run_decode(x, &info), k8.run_decode(x))) << info.kernel << " M=" << M;
      EXPECT_TRUE(at::equal(b32.run_weight_only(x, &info), k8.run_weight_only(x))) << info.kernel << " M=" << M;
    }
  }
}

// A Q4_0 file from llama.cpp's quantizer (d = max / -8: negative in about half the blocks), as gguf
// load keeps it (those blocks as codes -c - 1, zero point -1, scale |d|), packs n16b32 with the sign
// folded back into the stored fp16 scale: Q4_0's 18 bytes per 32 weights, every code 0..15 in both
// kinds of block, the decode and weight-only paths (GEMV and, at M = 20, GEMM) bit for bit the n16k8
// form's at every usable ISA level, and weight(), w_scale(), w_zero() give back what was packed.
TEST(PackedLinearS4, GgufQ4_0NegativeBlockScalesFoldIntoTheOneStreamFormExactly) {
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes{
      {1, 40, 96}, {3, 17, 4099}, {20, 33, 64}, {16, 16, 8192}, {2, 9, 20}};
  for (auto [M, N, K] : shapes) {
    const uint32_t seed = static_cast<uint32_t>(M * 100 + N * 10 + K + 7);
    const int64_t G = num_groups(K, 32);
    std::vector<int8_t> w = random_s8(N * K, -8, 7, seed);
    const std::vector<int8_t> zero_codes = random_s8(N * G, -1, 0, seed + 4);
    for (int64_t n = 0; n < N; ++n) {  // codes 0 and 15 (values -8 and 7) in every block
      for (int64_t g = 0; g < G; ++g) {
        const int64_t k0 = g * 32, k1 = std::min(K, k0 + 32);
        w[n * K + k0] = -8;
        if (k1 - k0 > 1) w[n * K + k1 - 1] = 7;
      }
    }
    const at::Tensor W = s8_tensor(w, N, K);
    const at::Tensor ws = f32_tensor(random_f16_exact(N * G, 0.001f, 0.05f, seed + 1), {N, G});
    const at::Tensor zp = s8_tensor(zero_codes, N, G).to(at::kInt);
    ASSERT_TRUE(zp.eq(-1).any().item<bool>() && zp.eq(0).any().item<bool>());
    const at::Tensor bias = f32_tensor(random_f32(N, -1.0f, 1.0f, seed + 2), {N});
    const PackedLinearS4 k8(W, ws, zp, 32, bias);
    const PackedLinearS4 b32(W, ws, zp, 32, bias, qforge::qint4, S4Layout::kN16B32);
    ASSERT_EQ(b32.layout(), S4Layout::kN16B32) << b32.layout_status();
    EXPECT_EQ(b32.bytes(), round_up(N, 16) / 16 * ((G + 1) / 2) * 576 + N * 4);
    EXPECT_TRUE(at::equal(b32.weight(), W));
    EXPECT_TRUE(at::equal(b32.w_scale(), ws));
    EXPECT_TRUE(at::equal(b32.w_zero(), zp));
    EXPECT_TRUE(at::equal(k8.w_zero(), zp));
    // The stream holds the file's form: codes c = ~(-c - 1), scales -|d| where the zero point was -1.
    const S4Unpacked stored = unpack_s4(b32.view());
    EXPECT_TRUE(at::equal(at::tensor(stored.scale, at::kFloat).reshape({N, G}), at::where(zp.eq(-1), -ws, ws)));
    const at::Tensor x = f32_tensor(random_f32(M * K, -2.0f, 2.0f, seed + 3), {M, K});
    for (Isa isa : usable_isas()) {
      ScopedMaxIsa cap(isa);
      RunInfo info;
      EXPECT_TRUE(at::equal(b32.run_decode(x, &info), k8.run_decode(x))) << info.kernel << " M=" << M << " K=" << K;
      EXPECT_TRUE(at::equal(b32.run_weight_only(x, &info), k8.run_weight_only(x))) << info.kernel << " M=" << M;
    }
  }
}

TEST(PackedLinearS4, GgufQ4_0OneStreamFormFallsBackToN16K8NamingWhy) {
  const int64_t N = 16, K = 64;
  const at::Tensor W = at::zeros({N, K}, at::kChar), s = at::ones({N, 2});
  const PackedLinearS4 zeros(W, s, at::ones({N, 2}, at::kInt), 32, {}, qforge::qint4, S4Layout::kN16B32);
  EXPECT_EQ(zeros.layout(), S4Layout::kN16K8);
  EXPECT_EQ(zeros.layout_status(), "zero points other than 0 and -1");
  const PackedLinearS4 signed_minus_one(W, s.index_fill(1, at::tensor({1}, at::kLong), -1.0f),
                                        at::full({N, 2}, -1, at::kInt), 32, {}, qforge::qint4, S4Layout::kN16B32);
  EXPECT_EQ(signed_minus_one.layout_status(), "zero points -1 beside negative scales");
  const PackedLinearS4 unsigned4(W, s, {}, 32, {}, qforge::quint4, S4Layout::kN16B32);
  EXPECT_EQ(unsigned4.layout_status(), "the grid is quint4, not qint4");
  const PackedLinearS4 g64(W, at::ones({N, 1}), {}, 64, {}, qforge::qint4, S4Layout::kN16B32);
  EXPECT_EQ(g64.layout_status(), "group_size=64, not 32");
  EXPECT_EQ(g64.bytes(), N * K / 2 + N * 3);
}
