// Codebook (look-up-table) weight-only Linear: the reference against a double-precision dot
// product of the expanded weight, every fast kernel bit for bit against the reference (each ISA
// level, 2/3/4 bits, per-row and per-group codebooks, ragged K and N), thread-count independence,
// and the errors of the packing constructor.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/kernel_choice.h"
#include "kernels/cpu/lut_linear.h"
#include "kernels/cpu/reference.h"

using namespace qforge::kernels;
using namespace qforge::kernels::testing;

namespace {

struct LutCase {
  int64_t M, N, K, group_size;
  int bits;
  bool bias;
};

std::string describe(const LutCase& c) {
  return "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
         " group_size=" + std::to_string(c.group_size) + " bits=" + std::to_string(c.bits) +
         (c.bias ? " bias" : " no bias");
}

struct LutData {
  std::vector<float> x, codebook, bias;
  std::vector<uint8_t> idx;
};

LutData make_data(const LutCase& c) {
  const uint32_t seed = static_cast<uint32_t>(c.M * 7 + c.N * 131 + c.K * 8191 + c.group_size * 3 + c.bits);
  const int64_t L = int64_t{1} << c.bits, G = c.K / c.group_size;
  LutData d;
  d.x = random_f32(c.M * c.K, -2.0f, 2.0f, seed);
  d.codebook = random_f32(c.N * G * L, -0.5f, 0.5f, seed + 1);
  d.bias = random_f32(c.N, -1.0f, 1.0f, seed + 2);
  const auto idx = random_s8(c.N * c.K, 0, static_cast<int>(L - 1), seed + 3);
  d.idx.assign(idx.begin(), idx.end());
  return d;
}

at::Tensor as_tensor(std::vector<float>& v, at::IntArrayRef shape) {
  return at::from_blob(v.data(), shape, at::kFloat).clone();
}

PackedLinearLut make_layer(const LutCase& c, LutData& d) {
  const int64_t L = int64_t{1} << c.bits, G = c.K / c.group_size;
  const at::Tensor idx = at::from_blob(d.idx.data(), {c.N, c.K}, at::kByte).clone();
  return PackedLinearLut(idx, as_tensor(d.codebook, {c.N, G, L}), c.group_size, c.bits,
                         c.bias ? as_tensor(d.bias, {c.N}) : at::Tensor());
}

// Runs every look-up-table entry of the kernel table this machine has, directly, and compares each
// with the reference bit for bit; then the layer at the current ISA cap, which must equal the
// reference up to kWeightOnlyMaxM rows (above them it runs the float GEMM entry, checked in
// kernel_table_test.cpp). Returns the kernel the layer ran.
std::string check_against_reference(const LutCase& c) {
  LutData d = make_data(c);
  const PackedLinearLut layer = make_layer(c, d);
  std::vector<float> y_ref(c.M * c.N), y(c.M * c.N);
  linear_f32_lut_reference(d.x.data(), c.M, d.idx.data(), d.codebook.data(), c.N, c.K, c.group_size, c.bits,
                           c.bias ? d.bias.data() : nullptr, y_ref.data());
  for (const KernelEntry<LutProblem>& e : lut_linear_kernels()) {
    if (!machine_has(e.isa) || std::string(e.name) == kDequantGemmKernel) continue;
    std::fill(y.begin(), y.end(), -1.0f);
    e.run(LutProblem{&layer, d.x.data(), c.M, y.data()});
    EXPECT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e.name << " " << describe(c);
  }
  RunInfo info;
  layer.run(d.x.data(), c.M, y.data(), &info);
  if (c.M <= kWeightOnlyMaxM) {
    EXPECT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << info.kernel << " " << describe(c);
  }
  return info.kernel;
}

// The entry the codebook op's kernel table gives at the capped level `isa` for M rows.
std::string planned_lut_kernel(qforge::Isa isa, int64_t M) {
  return choose_kernel(LinearOp::kF32Lut, isa, M).kernel;
}

// Per-row (group_size == K) shapes: K around the 32- and 64-value blocks, and deep.
const std::vector<int64_t>& per_row_ks() {
  static const std::vector<int64_t> k{1, 5, 16, 31, 32, 33, 48, 63, 64, 65, 100, 257};
  return k;
}

}  // namespace

TEST(LutLinearReference, MatchesDoublePrecisionDotProductOfExpandedWeight) {
  for (int bits : {2, 3, 4}) {
    for (const LutCase& c : {LutCase{3, 7, 100, 100, bits, true}, LutCase{2, 5, 256, 64, bits, false},
                             LutCase{1, 9, kDeepK, kDeepK, bits, true}}) {
      LutData d = make_data(c);
      const int64_t L = int64_t{1} << bits, G = c.K / c.group_size;
      std::vector<float> y(c.M * c.N);
      linear_f32_lut_reference(d.x.data(), c.M, d.idx.data(), d.codebook.data(), c.N, c.K, c.group_size, bits,
                               c.bias ? d.bias.data() : nullptr, y.data());
      for (int64_t m = 0; m < c.M; ++m) {
        for (int64_t n = 0; n < c.N; ++n) {
          double sum = c.bias ? d.bias[n] : 0.0, mag = std::abs(sum);
          for (int64_t k = 0; k < c.K; ++k) {
            const double w = d.codebook[(n * G + k / c.group_size) * L + d.idx[n * c.K + k]];
            sum += static_cast<double>(d.x[m * c.K + k]) * w;
            mag += std::abs(static_cast<double>(d.x[m * c.K + k]) * w);
          }
          ASSERT_NEAR(y[m * c.N + n], sum, 1e-6 * mag + 1e-6) << describe(c) << " at [" << m << ", " << n << "]";
        }
      }
    }
  }
}

TEST(LutLinear, EveryKernelMatchesReferenceBitForBitPerRow) {
  for (qforge::Isa isa : usable_isas()) {
    ScopedMaxIsa cap(isa);
    for (int bits : {2, 3, 4}) {
      for (int64_t M : {1, 3, 17}) {
        for (int64_t N : {1, 3, 4, 5, 9, 17}) {
          for (int64_t K : per_row_ks()) {
            const LutCase c{M, N, K, K, bits, (N + K + M) % 2 == 0};
            ASSERT_EQ(check_against_reference(c), planned_lut_kernel(isa, c.M)) << describe(c);
          }
        }
      }
      ASSERT_EQ(check_against_reference({1, 6, kDeepK, kDeepK, bits, true}), planned_lut_kernel(isa, 1));
    }
  }
}

TEST(LutLinear, EveryKernelMatchesReferenceBitForBitPerGroup) {
  for (qforge::Isa isa : usable_isas()) {
    ScopedMaxIsa cap(isa);
    for (int bits : {2, 3, 4}) {
      for (int64_t group : {64, 128}) {
        for (int64_t G : {1, 2, 5}) {
          for (int64_t M : {1, 3, 17}) {
            for (int64_t N : {1, 5, 7, 13}) {
              for (bool bias : {false, true}) {
                const LutCase c{M, N, group * G, group, bits, bias};
                ASSERT_EQ(check_against_reference(c), planned_lut_kernel(isa, c.M)) << describe(c);
              }
            }
          }
        }
      }
    }
  }
}

TEST(LutLinear, ResultsDoNotDependOnThreadCount) {
  const int threads = at::get_num_threads();
  for (int bits : {2, 4}) {
    const LutCase c{3, 1003, 1024, 128, bits, true};
    LutData d = make_data(c);
    const PackedLinearLut layer = make_layer(c, d);
    std::vector<float> y1(c.M * c.N), y2(c.M * c.N), y_ref(c.M * c.N);
    at::set_num_threads(1);
    layer.run(d.x.data(), c.M, y1.data());
    at::set_num_threads(2);
    layer.run(d.x.data(), c.M, y2.data());
    at::set_num_threads(threads);
    EXPECT_TRUE(bitwise_equal(y1.data(), y2.data(), y1.size())) << describe(c);
    linear_f32_lut_reference(d.x.data(), c.M, d.idx.data(), d.codebook.data(), c.N, c.K, c.group_size, c.bits,
                             d.bias.data(), y_ref.data());
    EXPECT_TRUE(bitwise_equal(y1.data(), y_ref.data(), y1.size())) << describe(c);
  }
}

TEST(LutLinear, TensorRunKeepsLeadingDimsAndMatchesFloatLinearOfExpandedWeight) {
  const int64_t N = 24, K = 96, g = 32, G = K / g, L = 8;
  const at::Tensor idx = at::randint(0, L, {N, K}).to(at::kByte);
  const at::Tensor cb = at::randn({N, G, L});
  const at::Tensor b = at::randn({N});
  const PackedLinearLut layer(idx, cb, g, 3, b);
  EXPECT_TRUE(at::equal(layer.indices(), idx));
  EXPECT_TRUE(at::equal(layer.codebook(), cb));
  EXPECT_EQ(layer.in_features(), K);
  EXPECT_EQ(layer.out_features(), N);
  EXPECT_EQ(layer.bits(), 3);
  EXPECT_EQ(layer.group_size(), g);
  // Packed indices N * K / 2 bytes (K a multiple of 32), tables N * G * 16 floats, bias.
  EXPECT_EQ(layer.bytes(), N * K / 2 + N * G * 16 * 4 + N * 4);
  const at::Tensor w = cb.gather(2, idx.to(at::kLong).view({N, G, g})).view({N, K});
  const at::Tensor x = at::randn({2, 3, K});
  RunInfo info;
  const at::Tensor y = layer.run(x, &info);
  EXPECT_EQ(y.sizes(), at::IntArrayRef({2, 3, N}));
  EXPECT_TRUE(at::allclose(y, at::linear(x, w, b), 1e-4, 1e-4));
  EXPECT_EQ(layer.run(at::randn({0, K})).sizes(), at::IntArrayRef({0, N}));
  EXPECT_THROW(layer.run(at::randn({2, K - 1})), qforge::Error);
}

TEST(LutLinear, CappedToReferenceSaysWhyFasterKernelsWereSkipped) {
  ScopedMaxIsa cap(qforge::Isa::kReference);
  const PackedLinearLut layer(at::zeros({4, 32}, at::kByte), at::randn({4, 1, 16}), 32, 4);
  RunInfo info;
  layer.run(at::randn({1, 32}), &info);
  EXPECT_EQ(info.kernel, "linear_f32lut_reference");
  EXPECT_NE(info.fallback.find("gemv_f32lut_avx512: "), std::string::npos) << info.fallback;
  EXPECT_NE(info.fallback.find("gemv_f32lut_avx2: "), std::string::npos) << info.fallback;
}

TEST(LutLinear, SupportsSaysWhichShapesTheKernelsTake) {
  std::string why;
  EXPECT_TRUE(PackedLinearLut::supports(4, 100, 100, &why));  // per-row: any K
  EXPECT_TRUE(PackedLinearLut::supports(3, 256, 32, &why));
  EXPECT_TRUE(PackedLinearLut::supports(2, 256, 64, &why));
  EXPECT_FALSE(PackedLinearLut::supports(2, 256, 32, &why));  // 2-bit blocks are 64 values
  EXPECT_NE(why.find("multiple of 64"), std::string::npos) << why;
  EXPECT_FALSE(PackedLinearLut::supports(4, 96, 48, &why));
  EXPECT_NE(why.find("multiple of 32"), std::string::npos) << why;
  EXPECT_FALSE(PackedLinearLut::supports(4, 100, 64, &why));
  EXPECT_NE(why.find("does not divide"), std::string::npos) << why;
  EXPECT_FALSE(PackedLinearLut::supports(5, 64, 64, &why));
  EXPECT_NE(why.find("2, 3 or 4 bits"), std::string::npos) << why;
  EXPECT_FALSE(PackedLinearLut::supports(1, 64, 64, nullptr));
}

namespace {

// The message of the qforge::Error that f throws ("" when it throws none).
template <typename F>
std::string error_of(const F& f) {
  try {
    f();
  } catch (const qforge::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(LutLinear, ConstructorRejectsBadInput) {
  const at::Tensor idx = at::randint(0, 4, {3, 64}).to(at::kByte);
  const at::Tensor cb = at::randn({3, 1, 4});
  EXPECT_NO_THROW(PackedLinearLut(idx, cb, 64, 2));

  at::Tensor bad_idx = idx.clone();
  bad_idx[1][5] = 4;
  std::string msg = error_of([&] { PackedLinearLut(bad_idx, cb, 64, 2); });
  EXPECT_NE(msg.find("index 4 at [1, 5]"), std::string::npos) << msg;

  msg = error_of([&] { PackedLinearLut(idx, at::randn({3, 1, 32}), 64, 5); });
  EXPECT_NE(msg.find("2, 3 or 4 bits, got 5"), std::string::npos) << msg;
  EXPECT_THROW(PackedLinearLut(idx, at::randn({3, 1, 2}), 64, 1), qforge::Error);

  // Two groups of 32: a 64-value block of 2-bit indices would straddle them.
  msg = error_of([&] { PackedLinearLut(idx, at::randn({3, 2, 4}), 32, 2); });
  EXPECT_NE(msg.find("multiple of 64"), std::string::npos) << msg;
  const at::Tensor idx96 = at::randint(0, 16, {3, 96}).to(at::kByte);
  msg = error_of([&] { PackedLinearLut(idx96, at::randn({3, 2, 16}), 48, 4); });
  EXPECT_NE(msg.find("multiple of 32"), std::string::npos) << msg;
  EXPECT_THROW(PackedLinearLut(idx96, at::randn({3, 2, 16}), 40, 4), qforge::Error);  // 40 does not divide 96

  at::Tensor nan_cb = cb.clone();
  nan_cb[2][0][3] = std::numeric_limits<float>::quiet_NaN();
  msg = error_of([&] { PackedLinearLut(idx, nan_cb, 64, 2); });
  EXPECT_NE(msg.find("[2, 0, 3]"), std::string::npos) << msg;
  at::Tensor inf_cb = cb.clone();
  inf_cb[0][0][0] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(PackedLinearLut(idx, inf_cb, 64, 2), qforge::Error);

  EXPECT_THROW(PackedLinearLut(idx, at::randn({3, 1, 8}), 64, 2), qforge::Error);     // L mismatch
  EXPECT_THROW(PackedLinearLut(idx, at::randn({4, 1, 4}), 64, 2), qforge::Error);     // N mismatch
  EXPECT_THROW(PackedLinearLut(idx.to(at::kChar), cb, 64, 2), qforge::Error);         // not uint8
  EXPECT_THROW(PackedLinearLut(idx, cb, 64, 2, at::randn({4})), qforge::Error);       // bias size
}

TEST(LutLinearReference, RejectsIndexOutOfRange) {
  const std::vector<uint8_t> idx{0, 1, 2, 4};
  const std::vector<float> cb{0.0f, 1.0f, 2.0f, 3.0f}, x{1.0f, 1.0f, 1.0f, 1.0f};
  float y = 0.0f;
  const std::string msg = error_of(
      [&] { linear_f32_lut_reference(x.data(), 1, idx.data(), cb.data(), 1, 4, 4, 2, nullptr, &y); });
  EXPECT_NE(msg.find("[0, 3]"), std::string::npos) << msg;
}
