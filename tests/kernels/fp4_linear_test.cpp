// MXFP4 / NVFP4 weight-only Linear (kernels/cpu/fp4_linear.h): the reference against a double
// dot product of the expanded weight, every fast kernel bit for bit against the reference (each ISA
// level, blocks of 16 and 32, ragged N and M, deep K), the planned kernel, and bad packing input.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/core/qtype.h"
#include "kernel_test_util.h"
#include "kernels/cpu/fp4_linear.h"
#include "kernels/cpu/kernel_choice.h"
#include "kernels/cpu/linear_weight_only.h"

using namespace qforge::kernels;
using namespace qforge::kernels::testing;

namespace {

struct Fp4Case {
  int64_t M, N, K, block;
  bool bias;
};

std::string fp4_describe(const Fp4Case& c) {
  return "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
         " block=" + std::to_string(c.block) + (c.bias ? " bias" : "");
}

struct Fp4CaseData {
  std::vector<float> x, scales, bias;
  std::vector<uint8_t> codes;
};

Fp4CaseData fp4_data(const Fp4Case& c) {
  const uint32_t seed = static_cast<uint32_t>(c.M * 7 + c.N * 131 + c.K * 8191 + c.block);
  Fp4CaseData d;
  d.x = random_f32(c.M * c.K, -2.0f, 2.0f, seed);
  d.scales = random_f32(c.N * c.K / c.block, 0.01f, 0.5f, seed + 1);
  d.bias = random_f32(c.N, -1.0f, 1.0f, seed + 2);
  const auto codes = random_s8(c.N * c.K, 0, 15, seed + 3);
  d.codes.assign(codes.begin(), codes.end());
  return d;
}

PackedLinearFp4 fp4_layer(const Fp4Case& c, Fp4CaseData& d) {
  return PackedLinearFp4(at::from_blob(d.codes.data(), {c.N, c.K}, at::kByte).clone(),
                         at::from_blob(d.scales.data(), {c.N, c.K / c.block}, at::kFloat).clone(), c.block,
                         c.bias ? at::from_blob(d.bias.data(), {c.N}, at::kFloat).clone() : at::Tensor());
}

// Every entry of the table this machine has, run directly, bit for bit against the reference; then
// the layer at the current cap (the reference order up to kWeightOnlyMaxM rows). Returns its kernel.
std::string fp4_check(const Fp4Case& c) {
  Fp4CaseData d = fp4_data(c);
  const PackedLinearFp4 layer = fp4_layer(c, d);
  std::vector<float> y_ref(c.M * c.N), y(c.M * c.N);
  linear_f32fp4_reference(d.x.data(), c.M, d.codes.data(), d.scales.data(), c.N, c.K, c.block,
                          c.bias ? d.bias.data() : nullptr, y_ref.data());
  for (const KernelEntry<Fp4Problem>& e : fp4_linear_kernels()) {
    if (!machine_has(e.isa) || std::string(e.name) == kDequantGemmKernel) continue;
    std::fill(y.begin(), y.end(), -1.0f);
    e.run(Fp4Problem{&layer, d.x.data(), c.M, y.data()});
    EXPECT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e.name << " " << fp4_describe(c);
  }
  RunInfo info;
  layer.run(d.x.data(), c.M, y.data(), &info);
  if (c.M <= kWeightOnlyMaxM) {
    EXPECT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << info.kernel << " " << fp4_describe(c);
  }
  return info.kernel;
}

}  // namespace

TEST(Mxfp4Nvfp4LinearReference, MatchesDoublePrecisionDotProductOfExpandedWeight) {
  for (const Fp4Case& c : {Fp4Case{3, 7, 96, 32, true}, Fp4Case{2, 5, 256, 16, false}, Fp4Case{1, 9, 4096, 32, true}}) {
    Fp4CaseData d = fp4_data(c);
    std::vector<float> y(c.M * c.N);
    linear_f32fp4_reference(d.x.data(), c.M, d.codes.data(), d.scales.data(), c.N, c.K, c.block,
                            c.bias ? d.bias.data() : nullptr, y.data());
    for (int64_t m = 0; m < c.M; ++m) {
      for (int64_t n = 0; n < c.N; ++n) {
        double sum = c.bias ? d.bias[n] : 0.0, mag = std::abs(sum);
        for (int64_t k = 0; k < c.K; ++k) {
          const double w = static_cast<double>(qforge::kE2M1Values[d.codes[n * c.K + k]]) *
                           d.scales[n * (c.K / c.block) + k / c.block];
          sum += static_cast<double>(d.x[m * c.K + k]) * w;
          mag += std::abs(static_cast<double>(d.x[m * c.K + k]) * w);
        }
        ASSERT_NEAR(y[m * c.N + n], sum, 1e-6 * mag + 1e-7) << fp4_describe(c) << " at [" << m << ", " << n << "]";
      }
    }
  }
}

TEST(Mxfp4Nvfp4Linear, EveryKernelMatchesReferenceBitForBit) {
  for (qforge::Isa isa : usable_isas()) {
    qforge::ScopedMaxIsa cap(isa);
    for (const int64_t block : {16, 32}) {
      for (const int64_t M : {1, 2, 5, 16, 17}) {
        for (const int64_t N : {1, 3, 8, 17}) {
          for (const int64_t K : std::vector<int64_t>{block, 2 * block, 96, 160, 256}) {
            if (K % block != 0) continue;
            const Fp4Case c{M, N, K, block, (N + K + M) % 2 == 0};
            ASSERT_EQ(fp4_check(c), choose_kernel(LinearOp::kF32Fp4, isa, M).kernel) << fp4_describe(c);
          }
        }
      }
      fp4_check(Fp4Case{1, 6, 4096, block, true});
    }
  }
}

TEST(Mxfp4Nvfp4Linear, LargeCallsRunTheDequantizedGemm) {
  const Fp4Case c{40, 9, 128, 32, true};
  Fp4CaseData d = fp4_data(c);
  const PackedLinearFp4 layer = fp4_layer(c, d);
  std::vector<float> y(c.M * c.N), y_ref(c.M * c.N);
  RunInfo info;
  layer.run(d.x.data(), c.M, y.data(), &info);
  EXPECT_EQ(info.kernel, kDequantGemmKernel);
  linear_f32fp4_reference(d.x.data(), c.M, d.codes.data(), d.scales.data(), c.N, c.K, c.block, d.bias.data(),
                          y_ref.data());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], y_ref[i], 1e-4f) << i;
}

TEST(Mxfp4Nvfp4Linear, PackingRoundTripsAndRefusesBadInput) {
  const Fp4Case c{1, 4, 64, 16, false};
  Fp4CaseData d = fp4_data(c);
  const PackedLinearFp4 layer = fp4_layer(c, d);
  EXPECT_TRUE(at::equal(layer.codes(), at::from_blob(d.codes.data(), {4, 64}, at::kByte)));
  EXPECT_EQ(layer.bytes(), 4 * 64 / 2 + 4 * 4 * 4);
  const at::Tensor codes = at::zeros({4, 64}, at::kByte), scales = at::ones({4, 4});
  EXPECT_THROW(PackedLinearFp4(codes, scales, 24), qforge::Error);                    // not a multiple of 16
  EXPECT_THROW(PackedLinearFp4(at::zeros({4, 40}, at::kByte), at::ones({4, 2}), 16), qforge::Error);  // 40 % 16
  EXPECT_THROW(PackedLinearFp4(codes, at::ones({4, 2}), 16), qforge::Error);          // scale shape
  EXPECT_THROW(PackedLinearFp4(codes, at::zeros({4, 4}), 16), qforge::Error);         // scale 0
  EXPECT_THROW(PackedLinearFp4(at::full({4, 64}, 16, at::kByte), scales, 16), qforge::Error);  // code 16
}
