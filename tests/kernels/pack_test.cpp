// Dense sub-byte packing and the blocked n16k4 / n16k8 layouts: byte positions and round trips.
#include <gtest/gtest.h>

#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/reference.h"
#include "kernel_test_util.h"

using namespace qforge::kernels;
using namespace qforge::kernels::testing;

TEST(PackS4, LowNibbleFirstTwosComplement) {
  const std::vector<int8_t> v{1, -1, -8, 7, 3};
  std::vector<uint8_t> p(3);
  pack_s4_reference(v.data(), 5, p.data());
  EXPECT_EQ(p[0], 0xF1);
  EXPECT_EQ(p[1], 0x78);
  EXPECT_EQ(p[2], 0x03);  // unused high nibble is 0
}

TEST(PackS2, FourPerByteLowBitsFirst) {
  const std::vector<int8_t> v{1, -2, -1, 0, 1};
  std::vector<uint8_t> p(2);
  pack_s2_reference(v.data(), 5, p.data());
  EXPECT_EQ(p[0], 0x01 | (0x2 << 2) | (0x3 << 4) | (0x0 << 6));
  EXPECT_EQ(p[1], 0x01);
}

TEST(PackS4, RoundTripsEveryLengthAndValue) {
  for (int64_t n : sweep_sizes()) {
    const auto s4 = random_s8(n, -8, 7, 1 + n);
    const auto u4 = random_s8(n, 0, 15, 2 + n);
    const auto s2 = random_s8(n, -2, 1, 3 + n);
    const auto u2 = random_s8(n, 0, 3, 4 + n);
    std::vector<uint8_t> p((n + 1) / 2), p2((n + 3) / 4);
    std::vector<int8_t> back(n);
    pack_s4_reference(s4.data(), n, p.data());
    unpack_s4_reference(p.data(), n, back.data());
    EXPECT_TRUE(exact_equal(back, s4)) << "s4 n=" << n;
    pack_u4_reference(u4.data(), n, p.data());
    unpack_u4_reference(p.data(), n, back.data());
    EXPECT_TRUE(exact_equal(back, u4)) << "u4 n=" << n;
    pack_s2_reference(s2.data(), n, p2.data());
    unpack_s2_reference(p2.data(), n, back.data());
    EXPECT_TRUE(exact_equal(back, s2)) << "s2 n=" << n;
    pack_u2_reference(u2.data(), n, p2.data());
    unpack_u2_reference(p2.data(), n, back.data());
    EXPECT_TRUE(exact_equal(back, u2)) << "u2 n=" << n;
  }
}

TEST(PackS4, OutOfRangeValueThrows) {
  const std::vector<int8_t> v{8};
  std::vector<uint8_t> p(1);
  EXPECT_THROW(pack_s4_reference(v.data(), 1, p.data()), qforge::Error);
  const std::vector<int8_t> u{-1};
  EXPECT_THROW(pack_u4_reference(u.data(), 1, p.data()), qforge::Error);
  const std::vector<int8_t> t{2};
  EXPECT_THROW(pack_s2_reference(t.data(), 1, p.data()), qforge::Error);
  const std::vector<int8_t> w{4};
  EXPECT_THROW(pack_u2_reference(w.data(), 1, p.data()), qforge::Error);
}

TEST(PackS8N16K4, ByteLayoutAndColumnSums) {
  const int64_t N = 17, K = 5;  // Np = 32, Kp = 8
  std::vector<int8_t> W(N * K);
  for (int64_t i = 0; i < N * K; ++i) W[i] = static_cast<int8_t>(i % 251 - 125);
  std::vector<int8_t> packed(32 * 8);
  std::vector<int32_t> colsum(32);
  pack_s8_n16k4_reference(W.data(), N, K, packed.data(), colsum.data());
  // W[n=3, k=2]: block (nb 0, kb 0), byte 3 * 4 + 2.
  EXPECT_EQ(packed[3 * 4 + 2], W[3 * K + 2]);
  // W[n=5, k=4]: block (nb 0, kb 1) at 64, byte 5 * 4 + 0.
  EXPECT_EQ(packed[64 + 5 * 4], W[5 * K + 4]);
  // W[n=16, k=1]: block (nb 1, kb 0) at (1 * 8 / 4 + 0) * 64 = 128, byte 0 * 4 + 1.
  EXPECT_EQ(packed[128 + 1], W[16 * K + 1]);
  EXPECT_EQ(packed[64 + 5 * 4 + 1], 0);  // k = 5 is padding
  int32_t sum = 0;
  for (int64_t k = 0; k < K; ++k) sum += W[16 * K + k];
  EXPECT_EQ(colsum[16], sum);
  EXPECT_EQ(colsum[17], 0);
}

TEST(PackS8N16K4, RoundTripsShapeSweep) {
  for (int64_t N : sweep_sizes()) {
    for (int64_t K : sweep_sizes()) {
      const auto W = random_s8(N * K, -128, 127, static_cast<uint32_t>(N * 1000 + K));
      std::vector<int8_t> packed(round_up(N, 16) * round_up(K, 4));
      std::vector<int32_t> colsum(round_up(N, 16));
      pack_s8_n16k4_reference(W.data(), N, K, packed.data(), colsum.data());
      std::vector<int8_t> back(N * K);
      unpack_s8_n16k4_reference(packed.data(), N, K, back.data());
      ASSERT_TRUE(exact_equal(back, W)) << "N=" << N << " K=" << K;
    }
  }
}

TEST(PackS4N16K8, ByteLayoutLowNibbleKThenHighNibbleKPlus4) {
  const int64_t N = 2, K = 9;  // Kp = 16
  std::vector<int8_t> W(N * K);
  for (int64_t i = 0; i < N * K; ++i) W[i] = static_cast<int8_t>(i % 16 - 8);
  std::vector<uint8_t> packed(16 * 16 / 2);
  pack_s4_n16k8_reference(W.data(), N, K, -8, packed.data());
  // Byte j * 4 + i of block kb: low nibble k = 8kb + i, high nibble k = 8kb + 4 + i (codes w + 8).
  EXPECT_EQ(packed[1 * 4 + 2] & 0x0F, W[1 * K + 2] + 8);
  EXPECT_EQ(packed[1 * 4 + 2] >> 4, W[1 * K + 6] + 8);
  EXPECT_EQ(packed[64 + 1 * 4 + 0] & 0x0F, W[1 * K + 8] + 8);
  EXPECT_EQ(packed[64 + 1 * 4 + 0] >> 4, 0);  // k = 12 is padding
}

TEST(PackS4N16K8, RoundTripsShapeSweepForBothGrids) {
  for (int qmin : {-8, 0}) {
    for (int64_t N : sweep_sizes()) {
      for (int64_t K : sweep_sizes()) {
        const auto W = random_s8(N * K, qmin, qmin + 15, static_cast<uint32_t>(N * 1000 + K));
        std::vector<uint8_t> packed(round_up(N, 16) * round_up(K, 8) / 2);
        pack_s4_n16k8_reference(W.data(), N, K, qmin, packed.data());
        std::vector<int8_t> back(N * K);
        unpack_s4_n16k8_reference(packed.data(), N, K, qmin, back.data());
        ASSERT_TRUE(exact_equal(back, W)) << "N=" << N << " K=" << K << " qmin=" << qmin;
      }
    }
  }
}

TEST(PackS4N16K8, OutOfGridWeightThrows) {
  const std::vector<int8_t> W{7, 8};
  std::vector<uint8_t> packed(64);
  EXPECT_THROW(pack_s4_n16k8_reference(W.data(), 1, 2, -8, packed.data()), qforge::Error);
}
