// Dynamic activation quantization: formula, rounding, padding, errors, fast == reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/quantize_rows_s8.h"
#include "kernel_test_util.h"

using namespace qforge::kernels;
using namespace qforge::kernels::testing;

TEST(QuantizeRowsS8, ScaleIsRowMaxAbsOver127AndRoundsHalfToEven) {
  // amax = 127 -> scale 1, inv 1: values land exactly on .5 and round to even.
  const std::vector<float> x{0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 127.0f, -3.49f};
  std::vector<int8_t> q(8, 99);
  float scale = 0;
  quantize_rows_s8_reference(x.data(), 1, 7, ActScale::kPerRow, q.data(), 8, &scale);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(std::vector<int8_t>(q.begin(), q.begin() + 7),
            (std::vector<int8_t>{0, 2, 2, 0, -2, 127, -3}));
  EXPECT_EQ(q[7], 0);  // padding column
}

TEST(QuantizeRowsS8, NeverProducesMinus128) {
  const std::vector<float> x{-1.0f, 1.0f, -0.99999f};
  std::vector<int8_t> q(3);
  float scale = 0;
  quantize_rows_s8_reference(x.data(), 1, 3, ActScale::kPerRow, q.data(), 3, &scale);
  EXPECT_EQ(q[0], -127);
  EXPECT_EQ(q[1], 127);
}

TEST(QuantizeRowsS8, ZeroRowGetsScaleOne) {
  const std::vector<float> x(5, 0.0f);
  std::vector<int8_t> q(5, 1);
  float scale = 0;
  quantize_rows_s8_reference(x.data(), 1, 5, ActScale::kPerRow, q.data(), 5, &scale);
  EXPECT_EQ(scale, 1.0f);
  for (int8_t v : q) EXPECT_EQ(v, 0);
}

TEST(QuantizeRowsS8, PerTensorUsesOneScaleForAllRows) {
  const std::vector<float> x{1.0f, -2.0f, 4.0f, 0.5f};
  std::vector<int8_t> q(4);
  std::vector<float> s(2);
  quantize_rows_s8_reference(x.data(), 2, 2, ActScale::kPerTensor, q.data(), 2, s.data());
  EXPECT_EQ(s[0], 4.0f / 127.0f);
  EXPECT_EQ(s[1], s[0]);
  EXPECT_EQ(q[2], 127);
}

TEST(QuantizeRowsS8, NonFiniteInputThrows) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    for (Isa isa : usable_isas()) {
      ScopedMaxIsa cap(isa);
      std::vector<float> x(40, 1.0f);
      x[33] = bad;
      std::vector<int8_t> q(40);
      std::vector<float> s(2);
      EXPECT_THROW(quantize_rows_s8(x.data(), 2, 20, ActScale::kPerRow, q.data(), 20, s.data()),
                   qforge::Error)
          << isa_name(isa);
    }
  }
}

TEST(QuantizeRowsS8, NonFiniteLastRowLeavesOutputsUntouched) {
  // The finite rows come first, so a kernel that writes row results before checking every row fails.
  for (ActScale mode : {ActScale::kPerRow, ActScale::kPerTensor}) {
    for (Isa isa : usable_isas()) {
      ScopedMaxIsa cap(isa);
      std::vector<float> x(3 * 37, 2.0f);
      x[2 * 37 + 36] = std::numeric_limits<float>::quiet_NaN();
      std::vector<int8_t> q(3 * 40, 99);
      std::vector<float> s(3, -7.0f);
      EXPECT_THROW(quantize_rows_s8(x.data(), 3, 37, mode, q.data(), 40, s.data()), qforge::Error) << isa_name(isa);
      EXPECT_EQ(s, std::vector<float>(3, -7.0f)) << isa_name(isa);
      EXPECT_EQ(q, std::vector<int8_t>(3 * 40, 99)) << isa_name(isa);
    }
  }
}

TEST(QuantizeRowsS8, EveryKernelMatchesReferenceExactly) {
  for (Isa isa : usable_isas()) {
    ScopedMaxIsa cap(isa);
    for (ActScale mode : {ActScale::kPerRow, ActScale::kPerTensor}) {
      for (int64_t M : sweep_rows()) {
        for (int64_t K : {int64_t{1}, int64_t{7}, int64_t{16}, int64_t{33}, int64_t{100}, kDeepK}) {
          auto x = random_f32(M * K, -3.0f, 3.0f, static_cast<uint32_t>(M * 7919 + K));
          if (M > 1) x[K] = 0.5f * (x[0] + x[1]);  // something ordinary in row 1
          const int64_t ldq = K + 5;
          std::vector<int8_t> q_ref(M * ldq, 7), q(M * ldq, 9);
          std::vector<float> s_ref(M), s(M);
          quantize_rows_s8_reference(x.data(), M, K, mode, q_ref.data(), ldq, s_ref.data());
          RunInfo info;
          quantize_rows_s8(x.data(), M, K, mode, q.data(), ldq, s.data(), &info);
          ASSERT_TRUE(exact_equal(q, q_ref)) << info.kernel << " M=" << M << " K=" << K;
          ASSERT_TRUE(bitwise_equal(s.data(), s_ref.data(), M)) << info.kernel;
        }
      }
    }
  }
}

// Narrower grids (qmax 7, 3, 1: W4A4's rows as int8 codes) and clipped rows (range clip · amax):
// the formula written out here, and every kernel equal to the reference, padding included.
TEST(QuantizeRowsS8, NarrowerGridsAndClippedRowsMatchTheFormulaAtEveryIsa) {
  for (Isa isa : usable_isas()) {
    ScopedMaxIsa cap(isa);
    for (const auto& [qmax, clip] : {std::pair<int, float>{7, 1.0f}, {3, 1.0f}, {1, 1.0f}, {7, 0.9f}, {127, 0.5f},
                                     {7, 1e-6f}}) {
      for (int64_t K : {int64_t{1}, int64_t{17}, int64_t{64}, int64_t{100}}) {
        const int64_t M = 3, ldq = K + 3;
        auto x = random_f32(M * K, -3.0f, 3.0f, static_cast<uint32_t>(K * 31 + qmax));
        std::vector<int8_t> q_ref(M * ldq, 7), q(M * ldq, 9);
        std::vector<float> s_ref(M), s(M);
        quantize_rows_s8_reference(x.data(), M, K, ActScale::kPerRow, q_ref.data(), ldq, s_ref.data(), qmax, clip);
        RunInfo info;
        quantize_rows_s8(x.data(), M, K, ActScale::kPerRow, q.data(), ldq, s.data(), &info, qmax, clip);
        ASSERT_TRUE(exact_equal(q, q_ref)) << info.kernel << " qmax=" << qmax << " clip=" << clip << " K=" << K;
        ASSERT_TRUE(bitwise_equal(s.data(), s_ref.data(), M)) << info.kernel;
        for (int64_t m = 0; m < M; ++m) {
          float amax = 0;
          for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(x[m * K + k]));
          const float range = clip == 1.0f ? amax : amax * clip, scale = range / static_cast<float>(qmax);
          ASSERT_EQ(s_ref[m], scale);
          for (int64_t k = 0; k < K; ++k) {
            const float r = std::nearbyint(x[m * K + k] * (1.0f / scale));
            ASSERT_EQ(q_ref[m * ldq + k], static_cast<int8_t>(std::min(std::max(r, -float(qmax)), float(qmax))));
          }
          for (int64_t k = K; k < ldq; ++k) ASSERT_EQ(q[m * ldq + k], 0);
        }
      }
    }
  }
  std::vector<float> x(4, 1.0f), s(1);
  std::vector<int8_t> q(4);
  EXPECT_THROW(quantize_rows_s8(x.data(), 1, 4, ActScale::kPerRow, q.data(), 4, s.data(), nullptr, 0), qforge::Error);
  EXPECT_THROW(quantize_rows_s8(x.data(), 1, 4, ActScale::kPerRow, q.data(), 4, s.data(), nullptr, 7, 0.0f),
               qforge::Error);
}
