// The reference kernels' formulas on small hand-checked cases.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/reference.h"

using namespace qforge::kernels;

TEST(ReferenceGemm, S8S8S32IsDotProductOfRowsWithWeightRows) {
  const std::vector<int8_t> A{1, -2, 3, -128, 127, 0};  // [2, 3]
  const std::vector<int8_t> W{4, 5, -6, -128, -128, 1};  // [2, 3]
  std::vector<int32_t> C(4);
  gemm_s8s8s32_reference(A.data(), W.data(), C.data(), 2, 2, 3);
  EXPECT_EQ(C[0], 1 * 4 - 2 * 5 - 3 * 6);
  EXPECT_EQ(C[1], 1 * -128 - 2 * -128 + 3 * 1);
  EXPECT_EQ(C[2], -128 * 4 + 127 * 5);
  EXPECT_EQ(C[3], -128 * -128 + 127 * -128);
}

TEST(ReferenceGemm, U8S8S32SubtractsActivationZeroPoint) {
  const std::vector<uint8_t> A{0, 255, 128};
  const std::vector<int8_t> W{1, 2, 3};
  std::vector<int32_t> C(1);
  gemm_u8s8s32_reference(A.data(), 128, W.data(), C.data(), 1, 1, 3);
  EXPECT_EQ(C[0], -128 * 1 + 127 * 2 + 0 * 3);
}

TEST(ReferenceEpilogue, ScalesPerRowAndPerChannelThenAddsBias) {
  const std::vector<int32_t> acc{10, -20, 30, 40};
  const std::vector<float> a_scale{0.5f, 2.0f}, w_scale{0.25f, 4.0f}, bias{1.0f, -1.0f};
  std::vector<float> y(4);
  dequantize_s32_f32_reference(acc.data(), a_scale.data(), w_scale.data(), bias.data(), y.data(), 2, 2);
  EXPECT_FLOAT_EQ(y[0], 10 * 0.25f * 0.5f + 1.0f);
  EXPECT_FLOAT_EQ(y[1], -20 * 4.0f * 0.5f - 1.0f);
  EXPECT_FLOAT_EQ(y[2], 30 * 0.25f * 2.0f + 1.0f);
  EXPECT_FLOAT_EQ(y[3], 40 * 4.0f * 2.0f - 1.0f);
}

TEST(ReferenceGemm, S8S4F32ScalesEachGroupsPartialSum) {
  // K = 5, group_size = 2 -> groups [0,2), [2,4), [4,5).
  const std::vector<int8_t> A{1, 2, 3, 4, 5};
  const std::vector<int8_t> W{1, -1, 2, 2, 7};
  const std::vector<float> s{0.5f, 0.25f, 2.0f};
  const std::vector<int32_t> z{0, 1, -1};
  const float a_scale = 0.1f, bias = 3.0f;
  float y = 0;
  gemm_s8s4f32_reference(A.data(), &a_scale, W.data(), s.data(), z.data(), 2, &bias, &y, 1, 1, 5);
  const float acc0 = 1 * 1 + 2 * -1, acc1 = 3 * (2 - 1) + 4 * (2 - 1), acc2 = 5 * (7 + 1);
  float t = std::fma(acc0, 0.5f, 0.0f);
  t = std::fma(acc1, 0.25f, t);
  t = std::fma(acc2, 2.0f, t);
  EXPECT_EQ(y, std::fma(t, a_scale, bias));
}

TEST(ReferenceLinear, F32S8DequantizesPerChannel) {
  const std::vector<float> x{1.0f, -2.0f};
  const std::vector<int8_t> W{3, 4, -5, 6};
  const std::vector<float> s{0.5f, 0.25f}, b{1.0f, 2.0f};
  std::vector<float> y(2);
  linear_f32_s8_reference(x.data(), W.data(), s.data(), b.data(), y.data(), 1, 2, 2);
  EXPECT_FLOAT_EQ(y[0], (3 - 8) * 0.5f + 1.0f);
  EXPECT_FLOAT_EQ(y[1], (-5 - 12) * 0.25f + 2.0f);
}

TEST(ReferenceLinear, F32S4UsesGroupScalesAndZeroPoints) {
  const std::vector<float> x{1.0f, 2.0f, 3.0f};
  const std::vector<int8_t> W{4, 5, 15};  // quint4 grid values
  const std::vector<float> s{0.5f, 0.125f};
  const std::vector<int32_t> z{8, 7};
  float y = 0;
  linear_f32_s4_reference(x.data(), W.data(), s.data(), z.data(), 2, nullptr, &y, 1, 1, 3);
  EXPECT_FLOAT_EQ(y, (1 * -4.0f + 2 * -3.0f) * 0.5f + (3 * 8.0f) * 0.125f);
}

TEST(ReferenceGemm, NonPositiveGroupSizeThrows) {
  EXPECT_THROW(num_groups(16, 0), qforge::Error);
  EXPECT_EQ(num_groups(17, 8), 3);
  EXPECT_EQ(num_groups(16, 100), 1);
}
