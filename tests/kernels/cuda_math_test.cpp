// The host/device formulas of kernels/cuda, compiled by the host C++ compiler and checked bit for
// bit against the CPU reference kernels that define the results (kernels/cpu/reference.h), plus
// the pure-host cuBLASLt, fused-Linear and int8 GEMV shape rules. No GPU is needed (none exists here): the CUDA kernels
// evaluate exactly these functions per element, so this is the test of their arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <algorithm>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/reference.h"
#include "kernels/cuda/cublaslt_int8_rules.h"
#include "kernels/cuda/epilogue_math.h"
#include "kernels/cuda/gemv_s8_rules.h"
#include "kernels/cuda/linear_s8_fused_rules.h"
#include "kernels/cuda/quantize_rows_s8_math.h"
#include "kernels/cuda/unpack_s4_math.h"

namespace qforge::cuda {
namespace {

using kernels::testing::random_f16_exact;
using kernels::testing::random_f32;
using kernels::testing::random_s8;
using kernels::testing::sweep_rows;
using kernels::testing::sweep_sizes;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::vector<int32_t> random_s32(size_t n, int32_t lo, int32_t hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(lo, hi);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ---- dequantizing epilogue ----

void expect_epilogue_matches(int64_t M, int64_t N, int32_t acc_range, bool with_bias, uint32_t seed) {
  const auto acc = random_s32(M * N, -acc_range, acc_range, seed);
  const auto a_scale = random_f32(M, 1e-4f, 0.05f, seed + 1);
  const auto w_scale = random_f32(N, 1e-4f, 0.05f, seed + 2);
  const auto bias = random_f32(N, -2.0f, 2.0f, seed + 3);
  std::vector<float> ref(M * N);
  kernels::dequantize_s32_f32_reference(acc.data(), a_scale.data(), w_scale.data(),
                                        with_bias ? bias.data() : nullptr, ref.data(), M, N);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const float y = dequantize_s32_f32_value(acc[m * N + n], a_scale[m], w_scale[n],
                                               with_bias ? bias[n] : 0.0f);
      ASSERT_TRUE(same_bits(y, ref[m * N + n]))
          << "M=" << M << " N=" << N << " [" << m << ", " << n << "] " << y << " vs " << ref[m * N + n];
    }
  }
}

TEST(CudaEpilogueMath, MatchesDequantizeReferenceBitForBitOverShapeSweep) {
  uint32_t seed = 1;
  for (int64_t M : sweep_rows())
    for (int64_t N : sweep_sizes())
      for (bool bias : {false, true}) expect_epilogue_matches(M, N, 127 * 127 * 4096, bias, seed++);
}

TEST(CudaEpilogueMath, MatchesReferenceForAccumulatorsAboveTwoToThe24) {
  // float(acc) rounds there; host and device must round the same way (to nearest even).
  expect_epilogue_matches(7, 65, std::numeric_limits<int32_t>::max(), true, 99);
}

TEST(CudaEpilogueMath, ZeroAccumulatorGivesBias) {
  EXPECT_EQ(dequantize_s32_f32_value(0, 0.5f, 0.25f, 1.5f), 1.5f);
}

// ---- dynamic activation quantization ----

// What quantize_rows_s8_cuda computes, written with the shared functions on the host.
void quantize_rows_with_shared_math(const std::vector<float>& x, int64_t M, int64_t K,
                                    kernels::ActScale mode, int64_t ldq, std::vector<int8_t>* q,
                                    std::vector<float>* a_scale) {
  std::vector<float> amax(M, 0.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) amax[m] = std::fmax(amax[m], std::fabs(x[m * K + k]));
  if (mode == kernels::ActScale::kPerTensor) {
    float all = 0.0f;
    for (float a : amax) all = std::fmax(all, a);
    for (float& a : amax) a = all;
  }
  q->assign(M * ldq, int8_t{99});
  a_scale->assign(M, 0.0f);
  for (int64_t m = 0; m < M; ++m) {
    const float scale = act_scale_from_amax(amax[m]);
    const float inv = act_inv_scale(scale);
    (*a_scale)[m] = scale;
    for (int64_t k = 0; k < ldq; ++k) (*q)[m * ldq + k] = k < K ? quantize_act_s8(x[m * K + k], inv) : 0;
  }
}

void expect_quantize_matches(const std::vector<float>& x, int64_t M, int64_t K, int64_t ldq,
                             kernels::ActScale mode) {
  std::vector<int8_t> q_ref(M * ldq), q;
  std::vector<float> s_ref(M), s;
  kernels::quantize_rows_s8_reference(x.data(), M, K, mode, q_ref.data(), ldq, s_ref.data());
  quantize_rows_with_shared_math(x, M, K, mode, ldq, &q, &s);
  for (int64_t m = 0; m < M; ++m) ASSERT_TRUE(same_bits(s[m], s_ref[m])) << "M=" << M << " K=" << K << " row " << m;
  ASSERT_EQ(q, q_ref) << "M=" << M << " K=" << K << " ldq=" << ldq;
}

TEST(CudaQuantizeRowsMath, MatchesQuantizeRowsReferenceBitForBitPerRowAndPerTensor) {
  uint32_t seed = 11;
  for (auto mode : {kernels::ActScale::kPerRow, kernels::ActScale::kPerTensor}) {
    for (int64_t M : sweep_rows()) {
      for (int64_t K : sweep_sizes()) {
        const auto x = random_f32(M * K, -3.0f, 3.0f, seed++);
        expect_quantize_matches(x, M, K, K, mode);
        expect_quantize_matches(x, M, K, K + 5, mode);  // padded rows get q = 0
      }
    }
  }
}

TEST(CudaQuantizeRowsMath, TiesRoundHalfToEvenAndZeroRowsGetScaleOne) {
  // Row 0: amax 127 gives scale 1, so x = 0.5, 1.5, 2.5, -2.5 land on ties.
  const std::vector<float> x{127.0f, 0.5f, 1.5f, 2.5f, -2.5f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  expect_quantize_matches(x, 2, 5, 5, kernels::ActScale::kPerRow);
  EXPECT_EQ(quantize_act_s8(2.5f, 1.0f), 2);
  EXPECT_EQ(quantize_act_s8(-2.5f, 1.0f), -2);
  EXPECT_EQ(act_scale_from_amax(0.0f), 1.0f);
}

TEST(CudaQuantizeRowsMath, NeverProducesMinus128) {
  EXPECT_EQ(quantize_act_s8(-1e30f, 1.0f), -127);
  EXPECT_EQ(quantize_act_s8(1e30f, 1.0f), 127);
}

TEST(CudaQuantizeRowsMath, MatchesReferenceOnDeepK) {
  const int64_t K = kernels::testing::kDeepK;
  expect_quantize_matches(random_f32(3 * K, -100.0f, 100.0f, 5), 3, K, K, kernels::ActScale::kPerRow);
}

// ---- int4 weight dequantization ----

void expect_s4_matches(int64_t N, int64_t K, int64_t group_size, bool is_signed, bool with_zero,
                       uint32_t seed) {
  const int qmin = is_signed ? -8 : 0, qmax = is_signed ? 7 : 15;
  const auto values = random_s8(N * K, qmin, qmax, seed);
  std::vector<uint8_t> packed((N * K + 1) / 2 + 1, 0xAB);  // one guard byte past the end
  if (is_signed) {
    kernels::pack_s4_reference(values.data(), N * K, packed.data());
  } else {
    kernels::pack_u4_reference(values.data(), N * K, packed.data());
  }
  std::vector<int8_t> unpacked(N * K);
  if (is_signed) {
    kernels::unpack_s4_reference(packed.data(), N * K, unpacked.data());
  } else {
    kernels::unpack_u4_reference(packed.data(), N * K, unpacked.data());
  }
  const int64_t G = kernels::num_groups(K, group_size);
  const auto scale = random_f16_exact(N * G, 1e-3f, 0.2f, seed + 1);
  const auto zero8 = random_s8(N * G, qmin, qmax, seed + 2);
  const std::vector<int32_t> zero(zero8.begin(), zero8.end());
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t g = k / group_size;
      ASSERT_EQ(s4_value_at(packed.data(), n * K + k, is_signed), unpacked[n * K + k]);
      const int32_t z = with_zero ? zero[n * G + g] : 0;
      const float expect = static_cast<float>(unpacked[n * K + k] - z) * scale[n * G + g];
      const float got = dequantize_s4_at(packed.data(), n, k, K, is_signed, scale.data(),
                                         with_zero ? zero.data() : nullptr, group_size, G);
      ASSERT_TRUE(same_bits(got, expect)) << "N=" << N << " K=" << K << " g=" << group_size << " ["
                                          << n << ", " << k << "] " << got << " vs " << expect;
    }
  }
}

TEST(CudaUnpackS4Math, MatchesUnpackReferenceAndFormulaOverShapesGroupsAndSigns) {
  uint32_t seed = 21;
  for (int64_t N : {1, 2, 3, 7, 16}) {
    for (int64_t K : sweep_sizes()) {  // odd K: rows straddle bytes
      for (int64_t gs : {int64_t{1}, int64_t{8}, int64_t{32}, K}) {
        for (bool is_signed : {true, false})
          for (bool zero : {false, true}) expect_s4_matches(N, K, gs, is_signed, zero, seed++);
      }
    }
  }
}

TEST(CudaUnpackS4Math, LowNibbleFirst) {
  const uint8_t packed[] = {0xF1};  // docs/kernels.md §3.1: 0xF1 = [1, -1]
  EXPECT_EQ(s4_value_at(packed, 0, true), 1);
  EXPECT_EQ(s4_value_at(packed, 1, true), -1);
  EXPECT_EQ(s4_value_at(packed, 1, false), 15);
  EXPECT_EQ(dequantize_s4_value(-1, 3, 0.5f), -2.0f);
}

// The tensor-core GEMV's tiled layout: every code of [N, K] has its own slot, the slots left
// over are the padding rows, s4_tiled_coords inverts s4_tiled_index, and a warp's 16-byte load
// (word 32h + 4g + t of a tile's block) holds 32 consecutive codes of row 16T + g + 8h.
TEST(CudaUnpackS4Math, TiledLayoutIsABijectionWithContiguousLaneWords) {
  for (const int64_t N : {1, 15, 16, 17, 40}) {
    for (const int64_t K : {128, 384}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " K=" + std::to_string(K));
      const int64_t slots = s4_tiled_bytes(N, K) * 2;
      EXPECT_EQ(slots, (N + 15) / 16 * 16 * K);
      std::vector<int> hits(slots, 0);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const int64_t i = s4_tiled_index(n, k, K);
          ASSERT_GE(i, 0);
          ASSERT_LT(i, slots);
          ++hits[i];
          int64_t n2 = -1, k2 = -1;
          s4_tiled_coords(i, K, &n2, &k2);
          ASSERT_EQ(n2, n);
          ASSERT_EQ(k2, k);
          // Word i / 32 of its block: lane word 32h + 4g + t of tile n / 16, block k / 128.
          const int64_t r = n % 16, word = i / 32;
          EXPECT_EQ(word % 64, (r / 8) * 32 + (r % 8) * 4 + (k % 128) / 32);
          EXPECT_EQ(word / 64, (n / 16) * (K / 128) + k / 128);
          EXPECT_EQ(i % 32, k % 32);
        }
      for (int64_t i = 0; i < slots; ++i) {
        int64_t n = -1, k = -1;
        s4_tiled_coords(i, K, &n, &k);
        EXPECT_EQ(hits[i], n < N ? 1 : 0) << "slot " << i;
      }
    }
  }
}

// ---- cuBLASLt int8 shape rules ----

TEST(CublasLtInt8Rules, AcceptsMultiplesOfFourWithAnyM) {
  std::string why = "stale";
  for (int64_t M : {1, 3, 16, 17}) EXPECT_TRUE(cublaslt_int8_supported(M, 64, 128, 128, 128, 64, &why)) << why;
  EXPECT_EQ(why, "");
  EXPECT_TRUE(cublaslt_int8_supported(5, 4, 4, 4, 4, 4, nullptr));
  EXPECT_TRUE(cublaslt_int8_supported(2, 8, 12, 16, 20, 12, nullptr));  // padded strides
}

TEST(CublasLtInt8Rules, RejectsEachRuleWithItsReason) {
  struct Case {
    int64_t M, N, K, lda, ldb, ldc;
    const char* why;
  };
  const Case cases[] = {
      {0, 8, 8, 8, 8, 8, "empty problem M=0 N=8 K=8"},
      {2, 8, 0, 0, 0, 8, "empty problem M=2 N=8 K=0"},
      {2, 8, 8, 4, 8, 8, "lda=4 < K=8"},
      {2, 8, 8, 8, 4, 8, "ldb=4 < K=8"},
      {2, 8, 8, 8, 8, 4, "ldc=4 < N=8"},
      {2, 6, 8, 8, 8, 8, "N=6 not a multiple of 4 (cuBLASLt IMMA m)"},
      {2, 8, 10, 12, 12, 8, "K=10 not a multiple of 4 (cuBLASLt IMMA k)"},
      {2, 8, 8, 10, 8, 8, "lda=10 not a multiple of 4"},
      {2, 8, 8, 8, 9, 8, "ldb=9 not a multiple of 4"},
      {2, 8, 8, 8, 8, 10, "ldc=10 not a multiple of 4"},
  };
  for (const Case& c : cases) {
    std::string why;
    EXPECT_FALSE(cublaslt_int8_supported(c.M, c.N, c.K, c.lda, c.ldb, c.ldc, &why));
    EXPECT_EQ(why, c.why);
    EXPECT_FALSE(cublaslt_int8_supported(c.M, c.N, c.K, c.lda, c.ldb, c.ldc, nullptr));
  }
}

TEST(CublasLtInt8Rules, PointersMustBeFourByteAligned) {
  alignas(16) int8_t buf[64] = {};
  std::string why;
  EXPECT_TRUE(cublaslt_int8_pointers_supported(buf, buf + 16, buf + 32, &why));
  EXPECT_FALSE(cublaslt_int8_pointers_supported(buf + 1, buf, buf, &why));
  EXPECT_EQ(why, "A pointer not 4-byte aligned");
  EXPECT_FALSE(cublaslt_int8_pointers_supported(buf, buf + 2, buf, &why));
  EXPECT_EQ(why, "W pointer not 4-byte aligned");
  EXPECT_FALSE(cublaslt_int8_pointers_supported(buf, buf, buf + 3, &why));
  EXPECT_EQ(why, "C pointer not 4-byte aligned");
}

// ---- the int8 weight-only GEMV's rules (what plan_linear_cuda and the launcher read) ----

TEST(GemvS8Rules, TakesDecodeSizedCallsWithKAMultipleOfFour) {
  std::string why = "stale";
  for (const int64_t M : {1, 2, 3, 8, 16})
    for (const int64_t K : {4, 12, 768, 4100, 14336}) {
      EXPECT_TRUE(gemv_f32s8_supported(M, K, &why)) << M << " x " << K;
      EXPECT_EQ(why, "");
    }
  EXPECT_TRUE(gemv_f32s8_supported(1, 768, nullptr));
}

TEST(GemvS8Rules, RejectsEachRuleWithItsReason) {
  std::string why;
  EXPECT_FALSE(gemv_f32s8_supported(0, 768, &why));
  EXPECT_EQ(why, "M=0 outside 1..16");
  EXPECT_FALSE(gemv_f32s8_supported(17, 768, &why));
  EXPECT_EQ(why, "M=17 outside 1..16");
  EXPECT_FALSE(gemv_f32s8_supported(1, 766, &why));
  EXPECT_EQ(why, "K=766 not a positive multiple of 4");
  EXPECT_FALSE(gemv_f32s8_supported(1, 0, &why));
  EXPECT_EQ(why, "K=0 not a positive multiple of 4");
  EXPECT_FALSE(gemv_f32s8_supported(17, 766, nullptr));
}

TEST(GemvS8Rules, XSixteenAndCodesFourByteAligned) {
  alignas(16) float x[8] = {};
  alignas(16) int8_t codes[32] = {};
  std::string why = "stale";
  EXPECT_TRUE(gemv_f32s8_pointers_supported(x, codes + 4, &why));
  EXPECT_EQ(why, "");
  EXPECT_FALSE(gemv_f32s8_pointers_supported(x + 1, codes, &why));
  EXPECT_EQ(why, "x pointer not 16-byte aligned");
  EXPECT_FALSE(gemv_f32s8_pointers_supported(x, codes + 2, &why));
  EXPECT_EQ(why, "int8 codes pointer not 4-byte aligned");
}

// ---- the one-launch int8 Linear's rules and fragment positions ----

constexpr int64_t kH100OptInSmem = 232448;  // 227 KiB: cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_90

TEST(LinearS8FusedRules, DispatchTakesEveryBertShapeAndThe4096Square) {
  for (const int64_t M : {1, 16, 17, 128, 256, 257, 2048}) {
    for (const int64_t K : {768, 3072}) {
      const FusedTile t = fused_tile_for(M, K);
      std::string why = "stale";
      EXPECT_TRUE(linear_s8_fused_supported(M, 3072, K, t, kH100OptInSmem, &why)) << M << " " << K << ": " << why;
      EXPECT_EQ(why, "");
    }
  }
  EXPECT_EQ(fused_tile_for(16, 768), FusedTile::k16x64);
  EXPECT_EQ(fused_tile_for(17, 768), FusedTile::k64x64);
  EXPECT_EQ(fused_tile_for(256, 3072), FusedTile::k64x64);
  EXPECT_EQ(fused_tile_for(257, 768), FusedTile::k64x128);
  EXPECT_EQ(fused_tile_for(257, 3072), FusedTile::k32x128);
  EXPECT_TRUE(linear_s8_fused_supported(4096, 4096, 4096, fused_tile_for(4096, 4096), kH100OptInSmem, nullptr));
}

TEST(LinearS8FusedRules, RejectsEachRuleWithItsReason) {
  std::string why;
  EXPECT_FALSE(linear_s8_fused_supported(0, 8, 32, FusedTile::k16x64, kH100OptInSmem, &why));
  EXPECT_EQ(why, "empty problem M=0 N=8");
  EXPECT_FALSE(linear_s8_fused_supported(4, 8, 48, FusedTile::k16x64, kH100OptInSmem, &why));
  EXPECT_EQ(why, "K=48 not a positive multiple of 32");
  EXPECT_FALSE(linear_s8_fused_supported(4, 8, 0, FusedTile::k16x64, kH100OptInSmem, &why));
  EXPECT_EQ(why, "K=0 not a positive multiple of 32");
  EXPECT_FALSE(linear_s8_fused_supported(16 * 65535 + 1, 8, 32, FusedTile::k16x64, kH100OptInSmem, &why));
  EXPECT_EQ(why, "M=1048561 needs more than 65535 row blocks of 16");
  // 64 rows x (4096 + 16) bytes of codes + 3 x 64 x 80 bytes of weights + 64 scales.
  EXPECT_EQ(fused_smem_bytes(FusedTile::k64x64, 4096), 64 * 4112 + 3 * 64 * 80 + 64 * 4);
  EXPECT_FALSE(linear_s8_fused_supported(128, 768, 4096, FusedTile::k64x64, kH100OptInSmem, &why));
  EXPECT_EQ(why, "tile 64x64 needs 278784 bytes of shared memory at K=4096, the device allows 232448");
  alignas(16) int8_t buf[64] = {};
  EXPECT_TRUE(linear_s8_fused_pointers_supported(buf, buf + 16, &why));
  EXPECT_FALSE(linear_s8_fused_pointers_supported(buf + 4, buf, &why));
  EXPECT_EQ(why, "activation pointer not 16-byte aligned");
  EXPECT_FALSE(linear_s8_fused_pointers_supported(buf, buf + 8, &why));
  EXPECT_EQ(why, "weight pointer not 16-byte aligned");
}

TEST(LinearS8FusedRules, TileShapesCoverTheirWarps) {
  for (int t = 0; t < kFusedTileCount; ++t) {
    const FusedTileShape s = fused_tile_shape(static_cast<FusedTile>(t));
    EXPECT_EQ(s.warps_m * s.warps_n, kFusedThreads / 32) << fused_tile_name(static_cast<FusedTile>(t));
    EXPECT_EQ(s.bm % (16 * s.warps_m), 0);
    EXPECT_EQ(s.bn % (8 * s.warps_n), 0);
    EXPECT_EQ(s.bn * 4 % kFusedThreads, 0);  // 16-byte weight chunks per thread per tile
  }
}

// The m16n8k32 fragments: every element of A (16 x 32), B (32 x 8) and C (16 x 8) held by exactly
// one (lane, register, byte), and each 32-lane register load of A and B from the padded shared
// panels touches 32 different banks (the reason for the 16-byte row padding).
TEST(LinearS8FusedRules, FragmentPositionsCoverTheTilesOnceWithoutBankConflicts) {
  std::vector<int> a(16 * 32, 0), b(8 * 32, 0), c(16 * 8, 0);
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < 4; ++j) ++a[fused_a_frag_row(lane, r) * 32 + fused_a_frag_k(lane, r) + j];
    for (int r = 0; r < 2; ++r)
      for (int j = 0; j < 4; ++j) ++b[fused_b_frag_col(lane) * 32 + fused_b_frag_k(lane, r) + j];
    for (int i = 0; i < 4; ++i) ++c[fused_c_frag_row(lane, i) * 8 + fused_c_frag_col(lane, i)];
  }
  for (int v : a) ASSERT_EQ(v, 1);
  for (int v : b) ASSERT_EQ(v, 1);
  for (int v : c) ASSERT_EQ(v, 1);
  for (const int64_t K : {32, 768, 800, 3072, 4096}) {
    for (int r = 0; r < 4; ++r) {
      std::vector<int> banks(32, 0);
      for (int lane = 0; lane < 32; ++lane)
        ++banks[(fused_a_frag_row(lane, r) * fused_a_stride(K) + fused_a_frag_k(lane, r)) / 4 % 32];
      for (int v : banks) ASSERT_EQ(v, 1) << "A register " << r << " K=" << K;
    }
  }
  for (int r = 0; r < 2; ++r) {
    std::vector<int> banks(32, 0);
    for (int lane = 0; lane < 32; ++lane)
      ++banks[(fused_b_frag_col(lane) * kFusedWStride + fused_b_frag_k(lane, r)) / 4 % 32];
    for (int v : banks) ASSERT_EQ(v, 1) << "B register " << r;
  }
}

}  // namespace
// Split K: the slices of ceil(K / 64) tiles cover every tile once and none is empty; the panel
// of a slice holds its tiles; the dispatch's S; storage sizes. The prologue's items cover every
// (row, chunk) of a block once.
TEST(LinearS8FusedRules, SplitKSlicesAndPrologueItemsCoverEverythingOnce) {
  for (const int64_t K : {32, 64, 96, 320, 768, 800, 3072, 4096}) {
    const int64_t KT = (K + 63) / 64;
    for (const int64_t S : {1, 2, 3, 4, 7, 64}) {
      const int64_t st = fused_split_tiles(K, S), se = fused_effective_splits(K, S);
      EXPECT_LE(se, S);
      std::vector<int> seen(static_cast<size_t>(KT), 0);
      for (int64_t z = 0; z < se; ++z) {
        const int64_t n = std::min(st, KT - z * st);  // the kernel's KT for slice z
        ASSERT_GE(n, 1) << "K=" << K << " S=" << S << " slice " << z << " is empty";
        for (int64_t t = z * st; t < z * st + n; ++t) ++seen[static_cast<size_t>(t)];
      }
      for (int v : seen) ASSERT_EQ(v, 1) << "K=" << K << " S=" << S;
      EXPECT_EQ(fused_smem_bytes(FusedTile::k16x64, K, S), 16 * (st * 64 + 16) + 8 * 64 * 80 + 16 * 4);
      EXPECT_EQ(fused_workspace_ints(5, 13, K, S), se > 1 ? se * 5 * 13 : 0);
    }
  }
  EXPECT_EQ(fused_smem_bytes(FusedTile::k64x64, 4096, 1), fused_smem_bytes(FusedTile::k64x64, 4096));
  EXPECT_EQ(fused_splits_for(FusedTile::k16x64, 768, 3072), kFusedMaxSplits);  // 12 column blocks
  EXPECT_EQ(fused_splits_for(FusedTile::k16x64, 3072, 3072), kFusedMaxSplits);
  EXPECT_EQ(fused_splits_for(FusedTile::k16x64, 768, 768), 1);    // below kFusedSplitMinK
  EXPECT_EQ(fused_splits_for(FusedTile::k16x64, 768, kFusedSplitMinK + 64), kFusedMaxSplits);
  EXPECT_EQ(fused_splits_for(FusedTile::k16x64, 16384, 3072), 1);  // 256 column blocks fill the GPU
  EXPECT_EQ(fused_ticket_count(FusedTile::k16x64, 17, 65), 2 * 2);
  EXPECT_EQ(fused_ticket_count(FusedTile::k64x128, 64, 3072), 24);
  std::string why;
  EXPECT_FALSE(linear_s8_fused_supported(1, 8, 64, FusedTile::k16x64, kH100OptInSmem, &why, 0));
  EXPECT_EQ(why, "splits=0 outside 1..64");
  for (const int chunks : {8, 128, 192, 768, 800}) {
    const int per_row = (chunks + kFusedThreads - 1) / kFusedThreads, rows = 3;
    std::vector<int> hit(static_cast<size_t>(rows * chunks), 0);
    for (int f = 0; f < rows * per_row; ++f)
      for (int tid = 0; tid < kFusedThreads; ++tid) {
        const int r = fused_item_row(f, per_row), c = fused_item_col(f, per_row, tid);
        ASSERT_LT(r, rows);
        if (c < chunks) ++hit[static_cast<size_t>(r * chunks + c)];
      }
    for (int v : hit) ASSERT_EQ(v, 1) << "chunks=" << chunks;
  }
}

}  // namespace qforge::cuda
