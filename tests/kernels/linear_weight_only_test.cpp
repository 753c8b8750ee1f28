// Weight-only linears (float activations x packed int8 / int4): bit-exact with the references.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/gemv_s4.h"
#include "kernels/cpu/linear_weight_only.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/reference.h"
#include "kernel_test_util.h"

using namespace qforge::kernels;
using namespace qforge::kernels::testing;

namespace {

std::string check_s8(int64_t M, int64_t N, int64_t K, bool bias_on) {
  const uint32_t seed = static_cast<uint32_t>(M * 7 + N * 131 + K * 8191);
  const auto x = random_f32(M * K, -2.0f, 2.0f, seed);
  const auto W = random_s8(N * K, -128, 127, seed + 1);
  const auto ws = random_f32(N, 0.001f, 0.1f, seed + 2);
  const auto b = random_f32(N, -1.0f, 1.0f, seed + 3);
  std::vector<int8_t> packed(round_up(N, 16) * round_up(K, 4));
  std::vector<int32_t> colsum(round_up(N, 16));
  pack_s8_n16k4_reference(W.data(), N, K, packed.data(), colsum.data());
  const S8N16K4View v{packed.data(), colsum.data(), N, K, round_up(K, 4)};
  std::vector<float> y_ref(M * N), y(M * N);
  linear_f32_s8_reference(x.data(), W.data(), ws.data(), bias_on ? b.data() : nullptr,
                          y_ref.data(), M, N, K);
  RunInfo info;
  linear_f32s8f32(x.data(), M, v, ws.data(), bias_on ? b.data() : nullptr, y.data(), &info);
  EXPECT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size()))
      << info.kernel << " M=" << M << " N=" << N << " K=" << K;
  return info.kernel;
}

std::string check_s4(int64_t M, int64_t N, int64_t K, int64_t g, int qmin, bool zp) {
  const uint32_t seed = static_cast<uint32_t>(M * 7 + N * 131 + K * 8191 + g);
  const int64_t G = num_groups(K, g);
  const auto x = random_f32(M * K, -2.0f, 2.0f, seed);
  const auto W = random_s8(N * K, qmin, qmin + 15, seed + 1);
  const auto ws = random_f16_exact(N * G, 0.001f, 0.1f, seed + 2);
  const auto b = random_f32(N, -1.0f, 1.0f, seed + 3);
  const auto z8 = random_s8(N * G, qmin, qmin + 15, seed + 4);
  const std::vector<int32_t> z(z8.begin(), z8.end());
  const int64_t np = round_up(N, 16), kp = round_up(K, 8);
  std::vector<uint8_t> packed(np * kp / 2);
  std::vector<Fp16Bits> scales(np * G);
  std::vector<int8_t> zeros(np * G);
  pack_s4_n16k8_reference(W.data(), N, K, qmin, packed.data());
  pack_s4_group_meta(ws.data(), zp ? z.data() : nullptr, N, G, qmin, scales.data(), zeros.data());
  const S4N16K8View v{packed.data(), scales.data(), zeros.data(), N, K, kp, g, G};
  std::vector<float> y_ref(M * N), y(M * N);
  linear_f32_s4_reference(x.data(), W.data(), ws.data(), zp ? z.data() : nullptr, g, b.data(),
                          y_ref.data(), M, N, K);
  RunInfo info;
  linear_f32s4f32(x.data(), M, v, b.data(), y.data(), &info);
  EXPECT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size()))
      << info.kernel << " M=" << M << " N=" << N << " K=" << K << " g=" << g;
  return info.kernel;
}

}  // namespace

TEST(LinearF32S8, EveryKernelMatchesReferenceExactly) {
  for (Isa isa : usable_isas()) {
    ScopedMaxIsa cap(isa);
    const char* expected = isa >= Isa::kAvx512 ? "gemv_f32s8f32_n16k4_avx512" : "reference";
    for (int64_t M : sweep_rows()) {
      for (int64_t N : {1, 5, 16, 17, 33}) {
        for (int64_t K : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{31}, int64_t{64}, kDeepK}) {
          ASSERT_EQ(check_s8(M, N, K, (N + K) % 2 == 0), expected);
        }
      }
    }
  }
}

TEST(LinearF32S4, EveryKernelMatchesReferenceExactly) {
  for (Isa isa : usable_isas()) {
    ScopedMaxIsa cap(isa);
    const char* expected = isa >= Isa::kAvx512 ? "gemv_f32s4f32_n16k8_avx512" : "reference";
    for (int64_t M : sweep_rows()) {
      for (int64_t N : {1, 5, 16, 17, 33}) {
        for (int64_t K : {int64_t{1}, int64_t{8}, int64_t{31}, int64_t{64}, kDeepK}) {
          for (int64_t g : {int64_t{8}, int64_t{32}, K}) {
            if (g % 8 != 0) continue;
            const bool zp = (N + K) % 2 == 0;
            ASSERT_EQ(check_s4(M, N, K, g, zp ? 0 : -8, zp), expected);
          }
        }
      }
    }
  }
}

TEST(LinearF32S4, GroupSizeNotMultipleOf8FallsBackToReference) {
  EXPECT_EQ(check_s4(3, 17, 36, 12, -8, true), "reference");
}

TEST(PackedLinearS4, RunWeightOnlyMatchesReferenceAndDequantizedFloatLinear) {
  const int64_t M = 3, N = 40, K = 96, g = 32, G = K / g;
  const at::Tensor w = at::randint(-8, 8, {N, K}).to(at::kChar);
  const at::Tensor s = (at::rand({N, G}) * 0.1 + 0.01).to(at::kHalf).to(at::kFloat);
  const at::Tensor b = at::randn({N});
  const PackedLinearS4 layer(w, s, {}, g, b);
  const at::Tensor x = at::randn({M, K});
  RunInfo info;
  const at::Tensor y = layer.run_weight_only(x, &info);
  const at::Tensor w_f = w.to(at::kFloat) * s.repeat_interleave(g, 1);
  EXPECT_TRUE(at::allclose(y, at::linear(x, w_f, b), 1e-4, 1e-4));
  EXPECT_EQ(info.kernel, isa_usable(Isa::kAvx512) ? "gemv_f32s4f32_n16k8_avx512" : "reference");
}

TEST(PackedLinearS8, RunWeightOnlyMatchesDequantizedFloatLinear) {
  const at::Tensor w = at::randint(-128, 128, {24, 50}).to(at::kChar);
  const at::Tensor s = at::rand({24}) * 0.01 + 0.001;
  const PackedLinearS8 layer(w, s);
  const at::Tensor x = at::randn({2, 5, 50});
  const at::Tensor y = layer.run_weight_only(x);
  EXPECT_TRUE(at::allclose(y, at::linear(x, w.to(at::kFloat) * s.unsqueeze(1)), 1e-4, 1e-4));
  EXPECT_THROW(layer.run_weight_only(at::randn({2, 49})), qforge::Error);
}
