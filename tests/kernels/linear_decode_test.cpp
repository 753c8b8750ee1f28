// Decode linears (kernels/cpu/linear_decode.h): the block-32 activation quantizer against the
// same formula in ATen ops; every kernel-table entry this machine has against the scalar
// reference, bit for bit; the reference within the stated activation-rounding bound of the exact
// weight-only result; the dispatchers' choices and plans; bad input.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/kernel_choice.h"
#include "kernels/cpu/linear_decode.h"
#include "kernels/cpu/linear_weight_only.h"
#include "kernels/cpu/quantize_rows_s8.h"
#include "kernels/cpu/reference.h"

namespace qforge::kernels {
namespace {

using testing::bitwise_equal;
using testing::machine_has;
using testing::make_s4;
using testing::make_s4_n16b32;
using testing::make_s8;
using testing::random_f32;
using testing::S4Weights;
using testing::S8Weights;

struct Q8Codes {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> s;
  int64_t ldq = 0;
};

Q8Codes quantize_q8(const std::vector<float>& x, int64_t M, int64_t K) {
  Q8Codes r;
  r.ldq = q8_block_count(K) * kQ8Block;
  r.q.resize(M * r.ldq), r.d.resize(M * q8_block_count(K)), r.s.resize(M * q8_block_count(K));
  quantize_rows_q8b32_reference(x.data(), M, K, r.q.data(), r.ldq, r.d.data(), r.s.data());
  return r;
}

// Entries compared with the block-32 reference: every one this machine has but the exact
// weight-only ones (those run the weight-only tables, tested in kernel_table_test).
template <typename Problem>
std::vector<const KernelEntry<Problem>*> q8_entries(const KernelTable<Problem>& table, const Problem& p) {
  std::vector<const KernelEntry<Problem>*> out;
  std::string why;
  for (const KernelEntry<Problem>& e : table) {
    const std::string name = e.name;
    if (name == kDequantGemmKernel || name == kExactS4GemvKernel) continue;
    if (machine_has(e.isa) && (e.applies == nullptr || e.applies(p, &why))) out.push_back(&e);
  }
  return out;
}

std::string decode_shape(int64_t M, int64_t N, int64_t K, int64_t g = 0) {
  return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + " g=" + std::to_string(g);
}

TEST(QuantizeRowsQ8B32, EqualsTheFormulaInAtenOps) {
  for (int64_t M : {1, 3}) {
    for (int64_t K : {1, 31, 32, 33, 100, 2048}) {
      auto x = random_f32(M * K, -3.0f, 3.0f, static_cast<uint32_t>(M * 1000 + K));
      for (int64_t k = 0; k < std::min<int64_t>(K, kQ8Block); ++k) x[k] = 0.0f;  // an all-zero block: d = 0
      const Q8Codes r = quantize_q8(x, M, K);
      const int64_t kb = q8_block_count(K);
      const at::Tensor xt = at::constant_pad_nd(at::from_blob(x.data(), {M, K}, at::kFloat), {0, kb * kQ8Block - K})
                                .reshape({M, kb, kQ8Block});
      const at::Tensor amax = xt.abs().amax(-1, true);
      const at::Tensor step = amax / 127.0f, inv_step = at::reciprocal(step), usable = at::isfinite(inv_step);
      const at::Tensor d = at::where(usable, step, at::zeros_like(step));
      const at::Tensor inv = at::where(usable, inv_step, at::zeros_like(step));
      const at::Tensor q = at::round(xt * inv).clamp(-127, 127).to(at::kChar).contiguous();
      const at::Tensor s = q.to(at::kInt).sum(-1, false, at::kInt).contiguous();
      const at::Tensor dc = d.reshape({M, kb}).contiguous();
      EXPECT_EQ(std::memcmp(r.q.data(), q.data_ptr<int8_t>(), r.q.size()), 0) << decode_shape(M, 0, K);
      EXPECT_TRUE(bitwise_equal(r.d.data(), dc.data_ptr<float>(), r.d.size())) << decode_shape(M, 0, K);
      EXPECT_EQ(std::memcmp(r.s.data(), s.data_ptr<int32_t>(), r.s.size() * sizeof(int32_t)), 0) << decode_shape(M, 0, K);
    }
  }
}

// Blocks whose 1 / d overflows (amax below ~3.7e-37) are all-zero codes with d = 0, in the
// quantizer and in every decode entry (no NaN from 0 * inf).
std::vector<float> tiny_block_rows(int64_t M, int64_t K) {
  auto x = random_f32(M * K, -2.0f, 2.0f, 11);
  for (int64_t m = 0; m < M; ++m) {
    std::fill(x.begin() + m * K, x.begin() + m * K + kQ8Block, 0.0f);
    x[m * K] = m % 2 == 0 ? 1e-38f : -3e-37f;
  }
  return x;
}

TEST(QuantizeRowsQ8B32, BlocksTooSmallForAFiniteInverseStepAreZero) {
  const int64_t M = 2, K = 70;
  const Q8Codes r = quantize_q8(tiny_block_rows(M, K), M, K);
  for (int64_t m = 0; m < M; ++m) {
    EXPECT_EQ(r.d[m * q8_block_count(K)], 0.0f) << m;
    EXPECT_EQ(r.s[m * q8_block_count(K)], 0) << m;
    for (int64_t k = 0; k < kQ8Block; ++k) ASSERT_EQ(r.q[m * r.ldq + k], 0) << m << " " << k;
    EXPECT_GT(r.d[m * q8_block_count(K) + 1], 0.0f) << m;
  }
}

TEST(LinearDecode, EveryEntryGivesFiniteReferenceResultsForTinyBlocks) {
  const int64_t M = 2, N = 33, K = 70;
  const auto x = tiny_block_rows(M, K);
  const Q8Codes r = quantize_q8(x, M, K);
  const S8Weights w8 = make_s8(N, K, 5);
  const auto w_scale = random_f32(N, 0.001f, 0.1f, 6);
  std::vector<float> y_ref(M * N), y(M * N);
  linear_q8b32_s8_reference(r.q.data(), r.d.data(), r.ldq, w8.w.data(), w_scale.data(), nullptr, y_ref.data(), M, N, K);
  for (float v : y_ref) ASSERT_TRUE(std::isfinite(v));
  const LinearQ8S8Problem p8{x.data(), M, w8.view, w_scale.data(), nullptr, y.data()};
  for (const auto* e : q8_entries(linear_q8s8_kernels(), p8)) {
    e->run(p8);
    EXPECT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e->name;
  }
  const S4Weights w4 = make_s4(N, K, K, -8, 7);
  linear_q8b32_s4_reference(r.q.data(), r.d.data(), r.ldq, w4.w.data(), w4.scale.data(), w4.zero.data(), K, nullptr,
                            y_ref.data(), M, N, K);
  for (float v : y_ref) ASSERT_TRUE(std::isfinite(v));
  const LinearQ8S4Problem p4{x.data(), M, w4.view, nullptr, y.data()};
  for (const auto* e : q8_entries(linear_q8s4_kernels(), p4)) {
    e->run(p4);
    EXPECT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e->name;
  }
}

TEST(QuantizeRowsQ8B32, RefusesNanAndInfNamingTheElement) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto x = random_f32(2 * 40, -1.0f, 1.0f, 7);
    x[40 + 37] = bad;
    try {
      quantize_q8(x, 2, 40);
      FAIL() << "no error for " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("row 1 column 37"), std::string::npos) << e.what();
    }
  }
}

TEST(LinearDecode, EveryInt8EntryMatchesTheReferenceExactly) {
  for (int64_t M : {1, 2, 3, 5, 16}) {
    for (int64_t N : {1, 5, 16, 17, 33, 64}) {
      for (int64_t K : {4, 31, 32, 33, 96, 4099}) {
        const uint32_t seed = static_cast<uint32_t>(M * 7 + N * 131 + K * 8191);
        const auto x = random_f32(M * K, -2.0f, 2.0f, seed);
        const auto bias = random_f32(N, -1.0f, 1.0f, seed + 1);
        const auto w_scale = random_f32(N, 0.001f, 0.1f, seed + 3);
        const S8Weights w8 = make_s8(N, K, seed + 2);
        const Q8Codes r = quantize_q8(x, M, K);
        for (const float* b : {bias.data(), static_cast<const float*>(nullptr)}) {
          std::vector<float> y_ref(M * N), y(M * N);
          linear_q8b32_s8_reference(r.q.data(), r.d.data(), r.ldq, w8.w.data(), w_scale.data(), b, y_ref.data(), M, N, K);
          const LinearQ8S8Problem p{x.data(), M, w8.view, w_scale.data(), b, y.data()};
          for (const auto* e : q8_entries(linear_q8s8_kernels(), p)) {
            e->run(p);
            ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e->name << " " << decode_shape(M, N, K);
          }
        }
      }
    }
  }
}

TEST(LinearDecode, EveryInt4EntryMatchesTheReferenceExactly) {
  for (int64_t M : {1, 2, 3, 5, 16}) {
    for (int64_t N : {1, 17, 33, 64}) {
      for (int64_t K : {8, 32, 33, 40, 96, 4096, 4099}) {
        for (int64_t g : {int64_t{32}, int64_t{64}, K}) {
          if (g > K) continue;
          for (int qmin : {-8, 0}) {
            const uint32_t seed = static_cast<uint32_t>(M * 7 + N * 131 + K * 8191 + g + qmin);
            const auto x = random_f32(M * K, -2.0f, 2.0f, seed);
            const auto bias = random_f32(N, -1.0f, 1.0f, seed + 1);
            const S4Weights w4 = make_s4(N, K, g, qmin, seed + 2);
            const Q8Codes r = quantize_q8(x, M, K);
            std::vector<float> y_ref(M * N), y(M * N);
            linear_q8b32_s4_reference(r.q.data(), r.d.data(), r.ldq, w4.w.data(), w4.scale.data(), w4.zero.data(), g,
                                      bias.data(), y_ref.data(), M, N, K);
            const LinearQ8S4Problem p{x.data(), M, w4.view, bias.data(), y.data()};
            const auto entries = q8_entries(linear_q8s4_kernels(), p);
            ASSERT_FALSE(entries.empty()) << decode_shape(M, N, K, g);
            for (const auto* e : entries) {
              e->run(p);
              ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e->name << " " << decode_shape(M, N, K, g);
            }
          }
        }
      }
    }
  }
}

// |y_q8 - y_exact| <= sum_b (d_b / 2) * sum_{k in b} |W~[n, k]| + 1e-5 * sum_k |x_k W~[n, k]|, with W~
// the dequantized weight: each code is within half a step of x * (1 / d); the second term covers
// the float roundings of both results.
::testing::AssertionResult within_rounding_bound(const std::vector<float>& x, const Q8Codes& r, const at::Tensor& w_deq,
                                                 const std::vector<float>& y_q8, const std::vector<float>& y_exact,
                                                 int64_t M) {
  const int64_t N = w_deq.size(0), K = w_deq.size(1), kb = q8_block_count(K);
  const at::Tensor wd = w_deq.to(at::kDouble);
  const at::Tensor half_step = at::from_blob(const_cast<float*>(r.d.data()), {M, kb}, at::kFloat).to(at::kDouble) * 0.5;
  const at::Tensor per_k = half_step.repeat_interleave(kQ8Block, 1).narrow(1, 0, K);  // [M, K]
  const at::Tensor xd = at::from_blob(const_cast<float*>(x.data()), {M, K}, at::kFloat).to(at::kDouble);
  const at::Tensor bound = at::matmul(per_k, wd.abs().t()) + 1e-5 * at::matmul(xd.abs(), wd.abs().t());
  const at::Tensor err = (at::from_blob(const_cast<float*>(y_q8.data()), {M, N}, at::kFloat) -
                          at::from_blob(const_cast<float*>(y_exact.data()), {M, N}, at::kFloat))
                             .abs()
                             .to(at::kDouble);
  if ((err <= bound).all().item<bool>()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max error " << err.max().item<double>() << " above its bound somewhere";
}

TEST(LinearDecode, ReferenceIsWithinTheActivationRoundingBoundOfWeightOnly) {
  const int64_t M = 3, N = 40, K = 4096;
  const auto x = random_f32(M * K, -2.0f, 2.0f, 11);
  const auto w_scale = random_f32(N, 0.001f, 0.1f, 12);
  const S8Weights w8 = make_s8(N, K, 13);
  const Q8Codes r = quantize_q8(x, M, K);
  std::vector<float> y_q8(M * N), y_exact(M * N);
  linear_q8b32_s8_reference(r.q.data(), r.d.data(), r.ldq, w8.w.data(), w_scale.data(), nullptr, y_q8.data(), M, N, K);
  linear_f32_s8_reference(x.data(), w8.w.data(), w_scale.data(), nullptr, y_exact.data(), M, N, K);
  const at::Tensor w8_deq = at::from_blob(const_cast<int8_t*>(w8.w.data()), {N, K}, at::kChar).to(at::kFloat) *
                            at::from_blob(const_cast<float*>(w_scale.data()), {N, 1}, at::kFloat);
  EXPECT_TRUE(within_rounding_bound(x, r, w8_deq, y_q8, y_exact, M));

  const S4Weights w4 = make_s4(N, K, 32, 0, 14);
  linear_q8b32_s4_reference(r.q.data(), r.d.data(), r.ldq, w4.w.data(), w4.scale.data(), w4.zero.data(), 32, nullptr,
                            y_q8.data(), M, N, K);
  linear_f32_s4_reference(x.data(), w4.w.data(), w4.scale.data(), w4.zero.data(), 32, nullptr, y_exact.data(), M, N, K);
  const at::Tensor z = at::from_blob(const_cast<int32_t*>(w4.zero.data()), {N, K / 32}, at::kInt).to(at::kFloat);
  const at::Tensor sc = at::from_blob(const_cast<float*>(w4.scale.data()), {N, K / 32}, at::kFloat);
  const at::Tensor w4_deq = (at::from_blob(const_cast<int8_t*>(w4.w.data()), {N, K}, at::kChar).to(at::kFloat) -
                             z.repeat_interleave(32, 1)) * sc.repeat_interleave(32, 1);
  EXPECT_TRUE(within_rounding_bound(x, r, w4_deq, y_q8, y_exact, M));
}

TEST(LinearDecode, GroupsTheBlocksCannotSplitRunTheExactWeightOnlyKernelWithTheReason) {
  const int64_t M = 2, N = 17, K = 64;
  const auto x = random_f32(M * K, -1.0f, 1.0f, 21);
  const S4Weights w4 = make_s4(N, K, 16, -8, 22);
  std::vector<float> y(M * N), y_exact(M * N);
  RunInfo info;
  linear_q8b32s4f32(x.data(), M, w4.view, nullptr, y.data(), &info);
  EXPECT_EQ(info.kernel, "linear_f32s4f32");
  EXPECT_NE(info.fallback.find("group_size=16 not a multiple of 32"), std::string::npos) << info.fallback;
  linear_f32_s4_reference(x.data(), w4.w.data(), w4.scale.data(), w4.zero.data(), 16, nullptr, y_exact.data(), M, N, K);
  EXPECT_TRUE(bitwise_equal(y.data(), y_exact.data(), y.size()));
  EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S4, Isa::kAvx512Vnni, 16).kernel, "linear_f32s4f32");
}

// Above kWeightOnlyMaxM rows: the block-32 GEMM where AVX-512 VNNI is compiled in and usable
// (linear_q8b32_s8_reference's result), else the exact weight-only linear.
TEST(LinearDecode, AboveTheDecodeRowsTheBlock32GemmRunsElseTheExactWeightOnlyResult) {
  const int64_t M = kWeightOnlyMaxM + 1, N = 33, K = 96;
  const auto x = random_f32(M * K, -1.0f, 1.0f, 31);
  const auto w_scale = random_f32(N, 0.001f, 0.1f, 32);
  const S8Weights w8 = make_s8(N, K, 33);
  std::vector<float> y(M * N), y_want(M * N);
  RunInfo info, exact_info;
  linear_q8b32s8f32(x.data(), M, w8.view, w_scale.data(), nullptr, y.data(), &info);
  if (isa_usable(Isa::kAvx512Vnni)) {
    EXPECT_EQ(info.kernel, "gemm_q8s8f32_n16k4_avx512vnni");
    const Q8Codes r = quantize_q8(x, M, K);
    linear_q8b32_s8_reference(r.q.data(), r.d.data(), r.ldq, w8.w.data(), w_scale.data(), nullptr, y_want.data(), M,
                              N, K);
  } else {
    EXPECT_EQ(info.kernel, kDequantGemmKernel);
    linear_f32s8f32(x.data(), M, w8.view, w_scale.data(), nullptr, y_want.data(), &exact_info);
  }
  EXPECT_TRUE(bitwise_equal(y.data(), y_want.data(), y.size()));
}

// The prefill GEMMs against the reference at tile edges: rows past a 4-row tile, column blocks
// past a 2- or 3-block panel, K tails inside a block, groups of one block, several and the row.
TEST(LinearDecode, EveryEntryMatchesTheReferenceExactlyAboveTheDecodeRows) {
  for (int64_t M : {17, 38}) {
    for (int64_t N : {17, 48, 100}) {
      for (int64_t K : {32, 40, 96, 2080}) {
        const uint32_t seed = static_cast<uint32_t>(M * 7 + N * 131 + K * 8191);
        const auto x = random_f32(M * K, -2.0f, 2.0f, seed);
        const auto bias = random_f32(N, -1.0f, 1.0f, seed + 1);
        const Q8Codes r = quantize_q8(x, M, K);
        std::vector<float> y_ref(M * N), y(M * N);
        const auto w_scale = random_f32(N, 0.001f, 0.1f, seed + 3);
        const S8Weights w8 = make_s8(N, K, seed + 2);
        linear_q8b32_s8_reference(r.q.data(), r.d.data(), r.ldq, w8.w.data(), w_scale.data(), bias.data(),
                                  y_ref.data(), M, N, K);
        const LinearQ8S8Problem p8{x.data(), M, w8.view, w_scale.data(), bias.data(), y.data()};
        for (const auto* e : q8_entries(linear_q8s8_kernels(), p8)) {
          e->run(p8);
          ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e->name << " " << decode_shape(M, N, K);
        }
        for (int64_t g : {int64_t{32}, int64_t{64}, K}) {
          if (g > K) continue;
          const S4Weights w4 = make_s4(N, K, g, -8, seed + 4);
          linear_q8b32_s4_reference(r.q.data(), r.d.data(), r.ldq, w4.w.data(), w4.scale.data(), w4.zero.data(), g,
                                    nullptr, y_ref.data(), M, N, K);
          const LinearQ8S4Problem p4{x.data(), M, w4.view, nullptr, y.data()};
          for (const auto* e : q8_entries(linear_q8s4_kernels(), p4)) {
            e->run(p4);
            ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e->name << " " << decode_shape(M, N, K, g);
          }
        }
      }
    }
  }
}

// A prompt's call equals its rows decoded one at a time, bit for bit, whatever each runs: int4
// groups of 32 with GGUF's negative-scale blocks (zero point -1) among them, and int8 rows.
TEST(LinearDecode, APrefillCallEqualsOneRowCallsBitForBit) {
  if (!isa_usable(Isa::kAvx512Vnni)) GTEST_SKIP() << "calls of more than 16 rows run the exact path here";
  const int64_t M = 150, N = 80, K = 256;
  const auto x = random_f32(M * K, -2.0f, 2.0f, 61);
  const auto bias = random_f32(N, -1.0f, 1.0f, 62);
  S4Weights w4 = make_s4(N, K, 32, -8, 63);
  for (size_t i = 0; i < w4.zero.size(); i += 3) w4.zero[i] = -1;
  pack_s4_group_meta(w4.scale.data(), w4.zero.data(), N, K / 32, -8, w4.scales.data(), w4.zeros.data());
  const S8Weights w8 = make_s8(N, K, 64);
  const auto w_scale = random_f32(N, 0.001f, 0.1f, 65);
  std::vector<float> y(M * N), y_rows(M * N);
  RunInfo info;
  linear_q8b32s4f32(x.data(), M, w4.view, bias.data(), y.data(), &info);
  for (int64_t m = 0; m < M; ++m) linear_q8b32s4f32(x.data() + m * K, 1, w4.view, bias.data(), y_rows.data() + m * N);
  EXPECT_TRUE(bitwise_equal(y.data(), y_rows.data(), y.size())) << info.kernel;
  {
    EXPECT_EQ(info.kernel, "gemm_q8s4f32_n16k8_avx512vnni");
  }
  linear_q8b32s8f32(x.data(), M, w8.view, w_scale.data(), nullptr, y.data(), &info);
  for (int64_t m = 0; m < M; ++m)
    linear_q8b32s8f32(x.data() + m * K, 1, w8.view, w_scale.data(), nullptr, y_rows.data() + m * N);
  EXPECT_TRUE(bitwise_equal(y.data(), y_rows.data(), y.size())) << info.kernel;
}

// A prompt-sized call quantizes its rows across threads; a NaN is still refused naming its row
// within the call (the exact path above 16 rows quantizes nothing: VNNI machines only).
TEST(LinearDecode, APrefillCallRefusesANanNamingItsRowInTheCall) {
  if (!isa_usable(Isa::kAvx512Vnni)) GTEST_SKIP() << "no block-32 GEMM above 16 rows without AVX-512 VNNI";
  const int64_t M = 40, N = 16, K = 8192;
  auto x = random_f32(M * K, -1.0f, 1.0f, 71);
  x[33 * K + 100] = std::numeric_limits<float>::quiet_NaN();
  const S8Weights w8 = make_s8(N, K, 72);
  const std::vector<float> scale(N, 0.01f);
  std::vector<float> y(M * N);
  try {
    linear_q8b32s8f32(x.data(), M, w8.view, scale.data(), nullptr, y.data());
    ADD_FAILURE() << "a NaN was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 33 column 100"), std::string::npos) << e.what();
  }
}

TEST(LinearDecode, PlansNameTheTableEntries) {
  EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S8, Isa::kReference).kernel, "reference");
  EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S4, Isa::kReference, 32).kernel, "reference");
  EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S4, Isa::kReference, 0).kernel, "reference");  // one group per row
  if (isa_compiled(Isa::kAvx2)) {
    EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S8, Isa::kAvx2).kernel, "gemv_q8s8f32_n16k4_avx2");
    EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S4, Isa::kAvx2, 128).kernel, "gemv_q8s4f32_n16k8_avx2");
  }
  if (isa_compiled(Isa::kAvx512Vnni)) {
    EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S8, Isa::kAvx512Vnni).kernel, "gemv_q8s8f32_n16k4_avx512vnni");
    EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S4, Isa::kAvx512Vnni, 32).kernel, "gemv_q8s4f32_n16k8_avx512vnni");
  }
  EXPECT_EQ(choose_kernel(LinearOp::kQ8S8, Isa::kAvx2, kWeightOnlyMaxM + 1).kernel, kDequantGemmKernel);
  if (isa_compiled(Isa::kAvx512Vnni)) {
    RunInfo large;
    EXPECT_EQ(choose_large_m(LinearOp::kQ8S8, Isa::kAvx512Vnni, 0, &large), kWeightOnlyMaxM + 1);
    EXPECT_EQ(large.kernel, "gemm_q8s8f32_n16k4_avx512vnni");
    EXPECT_EQ(choose_large_m(LinearOp::kQ8S4, Isa::kAvx512Vnni, 32, &large), kWeightOnlyMaxM + 1);
    EXPECT_EQ(large.kernel, "gemm_q8s4f32_n16k8_avx512vnni");
    choose_large_m(LinearOp::kQ8S4, Isa::kAvx512Vnni, 16, &large);  // groups the blocks cannot split
    EXPECT_EQ(large.kernel, kDequantGemmKernel);
    EXPECT_NE(large.fallback.find("gemm_q8s4f32_n16k8_avx512vnni: group_size=16"), std::string::npos) << large.fallback;
  } else {
    EXPECT_EQ(choose_kernel(LinearOp::kQ8S8, Isa::kAvx512Vnni, kWeightOnlyMaxM + 1).kernel, kDequantGemmKernel);
  }
}

TEST(LinearDecode, InconsistentWeightsAreRefused) {
  const S8Weights w8 = make_s8(16, 32, 41);
  S8N16K4View bad = w8.view;
  bad.kp = 30;
  std::vector<float> x(32), y(16), scale(16, 1.0f);
  EXPECT_THROW(linear_q8b32s8f32(x.data(), 1, bad, scale.data(), nullptr, y.data()), Error);
  EXPECT_THROW(linear_q8b32s8f32(nullptr, 1, w8.view, scale.data(), nullptr, y.data()), Error);
}

// The AVX-512 and AVX2 block-32 quantizers against the reference, bit for bit: K tails inside a
// block and past one, all-zero and too-small blocks, values whose x * inv lands on .5.
TEST(QuantizeRowsQ8B32, SimdTwinsEqualTheReferenceBitForBit) {
  using RowQ8 = bool (*)(const float*, int64_t, int8_t*, float*, int32_t*);
  std::vector<std::pair<const char*, RowQ8>> twins;
  if (machine_has(Isa::kAvx512)) twins.emplace_back("avx512", detail::quantize_row_q8b32_avx512);
  if (machine_has(Isa::kAvx2)) twins.emplace_back("avx2", detail::quantize_row_q8b32_avx2);
  if (twins.empty()) GTEST_SKIP() << "no AVX2 / AVX-512 on this machine";
  for (int64_t K : {1, 7, 8, 9, 16, 17, 31, 32, 33, 63, 100, 2048, 8209}) {
    auto x = random_f32(K, -4.0f, 4.0f, static_cast<uint32_t>(K));
    if (K > 40) {
      std::fill(x.begin(), x.begin() + kQ8Block, 0.0f);  // d = 0
      x[kQ8Block] = 127.0f, x[kQ8Block + 1] = 0.5f, x[kQ8Block + 2] = -1.5f, x[kQ8Block + 3] = -0.0f;  // ties
      x[K - 1] = 1e-38f;
    }
    const Q8Codes want = quantize_q8(x, 1, K);
    const int64_t kb = q8_block_count(K);
    for (const auto& [name, row] : twins) {
      std::vector<int8_t> q(static_cast<size_t>(want.ldq), 99);
      std::vector<float> d(static_cast<size_t>(kb));
      std::vector<int32_t> s(static_cast<size_t>(kb));
      ASSERT_TRUE(row(x.data(), K, q.data(), d.data(), s.data())) << name << " K=" << K;
      EXPECT_EQ(std::memcmp(q.data(), want.q.data(), q.size()), 0) << name << " K=" << K;
      EXPECT_TRUE(bitwise_equal(d.data(), want.d.data(), d.size())) << name << " K=" << K;
      EXPECT_EQ(s, want.s) << name << " K=" << K;
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
        std::vector<float> xb = x;
        xb[K / 2] = bad;
        EXPECT_FALSE(row(xb.data(), K, q.data(), d.data(), s.data())) << name << " K=" << K << " " << bad;
      }
    }
  }
  // The dispatcher: the fastest twin, and the reference's error naming the element on NaN.
  const int64_t M = 3, K = 70;
  auto x = random_f32(M * K, -2.0f, 2.0f, 77);
  const Q8Codes want = quantize_q8(x, M, K);
  Q8Codes got = want;
  std::fill(got.q.begin(), got.q.end(), int8_t{5});
  RunInfo info;
  quantize_rows_q8b32(x.data(), M, K, got.q.data(), got.ldq, got.d.data(), got.s.data(), &info);
  EXPECT_EQ(got.q, want.q);
  EXPECT_TRUE(bitwise_equal(got.d.data(), want.d.data(), got.d.size()));
  EXPECT_EQ(got.s, want.s);
  EXPECT_EQ(info.kernel, isa_usable(Isa::kAvx512)  ? "quantize_rows_q8b32_avx512"
                         : isa_usable(Isa::kAvx2) ? "quantize_rows_q8b32_avx2"
                                                  : "reference");
  x[K + 5] = std::numeric_limits<float>::infinity();
  try {
    quantize_rows_q8b32(x.data(), M, K, got.q.data(), got.ldq, got.d.data(), got.s.data());
    ADD_FAILURE() << "an Inf was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 1 column 5"), std::string::npos) << e.what();
  }
}

// q/k/v (and gate/up) read one row: the second call on bit-identical rows reuses the first's
// quantization, with the result a fresh quantization gives; changed rows (written in place, same
// address) are quantized again.
TEST(LinearDecode, BitIdenticalRowsReuseTheLastQuantization) {
  const int64_t M = 1, N = 48, K = 96;
  auto x = random_f32(M * K, -2.0f, 2.0f, 51);
  const auto other = random_f32(M * K, -2.0f, 2.0f, 52);
  const S8Weights wa = make_s8(N, K, 53), wb = make_s8(N, K, 54);
  const S4Weights w4 = make_s4(N, K, 32, -8, 7);
  const auto scale = random_f32(N, 0.001f, 0.1f, 55);
  std::vector<float> ya(N), yb(N), y4(N), fresh(N);
  auto expect_fresh_s8 = [&](const std::vector<float>& rows, const S8Weights& w, const std::vector<float>& got) {
    const Q8Codes r = quantize_q8(rows, M, K);
    linear_q8b32_s8_reference(r.q.data(), r.d.data(), r.ldq, w.w.data(), scale.data(), nullptr, fresh.data(), M, N, K);
    EXPECT_TRUE(bitwise_equal(got.data(), fresh.data(), N));
  };
  linear_q8b32s8f32(other.data(), M, wa.view, scale.data(), nullptr, ya.data());
  const int64_t before = q8_activation_reuses();
  linear_q8b32s8f32(x.data(), M, wa.view, scale.data(), nullptr, ya.data());
  linear_q8b32s8f32(x.data(), M, wb.view, scale.data(), nullptr, yb.data());
  linear_q8b32s4f32(x.data(), M, w4.view, nullptr, y4.data());
  EXPECT_EQ(q8_activation_reuses(), before + 2);
  expect_fresh_s8(x, wa, ya);
  expect_fresh_s8(x, wb, yb);
  const Q8Codes r = quantize_q8(x, M, K);
  linear_q8b32_s4_reference(r.q.data(), r.d.data(), r.ldq, w4.w.data(), w4.scale.data(), w4.zero.data(), 32, nullptr,
                            fresh.data(), M, N, K);
  EXPECT_TRUE(bitwise_equal(y4.data(), fresh.data(), N));
  x[K - 1] *= 1.5f;  // same address, new contents
  linear_q8b32s8f32(x.data(), M, wb.view, scale.data(), nullptr, yb.data());
  EXPECT_EQ(q8_activation_reuses(), before + 2);
  expect_fresh_s8(x, wb, yb);
}

// GGUF Q4_0's grid in the n16b32 form (codes and fp16 scales in one stream): every block-32 entry
// that reads it, decode and prefill rows, equals the reference bit for bit at column and k tails.
TEST(LinearDecode, GgufQ4_0OneStreamEntriesMatchTheReferenceExactly) {
  for (int64_t M : {1, 2, 5, 16, 17, 40}) {
    for (int64_t N : {1, 17, 33, 64}) {
      for (int64_t K : {8, 32, 40, 96, 4096, 4099}) {
        const uint32_t seed = static_cast<uint32_t>(M * 7 + N * 131 + K * 8191);
        const auto x = random_f32(M * K, -2.0f, 2.0f, seed);
        const auto bias = random_f32(N, -1.0f, 1.0f, seed + 1);
        const S4Weights w4 = make_s4_n16b32(N, K, seed + 2, /*negative_scales=*/(M + N) % 2 == 1);
        const Q8Codes r = quantize_q8(x, M, K);
        for (const float* b : {bias.data(), static_cast<const float*>(nullptr)}) {
          std::vector<float> y_ref(M * N), y(M * N, std::nanf(""));
          linear_q8b32_s4_reference(r.q.data(), r.d.data(), r.ldq, w4.w.data(), w4.scale.data(), w4.zero.data(),
                                    w4.view.group_size, b, y_ref.data(), M, N, K);
          const LinearQ8S4Problem p{x.data(), M, w4.view, b, y.data()};
          const auto entries = q8_entries(linear_q8s4_kernels(), p);
          ASSERT_FALSE(entries.empty()) << decode_shape(M, N, K);
          for (const auto* e : entries) {
            std::fill(y.begin(), y.end(), std::nanf(""));
            e->run(p);
            ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e->name << " " << decode_shape(M, N, K);
          }
        }
      }
    }
  }
}

// The dispatcher sends an n16b32 weight to its own entries (named so), never to an n16k8 kernel.
TEST(LinearDecode, GgufQ4_0OneStreamDispatchNamesItsKernel) {
  const int64_t N = 40, K = 96;
  const S4Weights w4 = make_s4_n16b32(N, K, 61);
  const auto x = random_f32(20 * K, -2.0f, 2.0f, 62);
  std::vector<float> y(20 * N);
  const bool vnni = isa_usable(Isa::kAvx512Vnni, nullptr), avx2 = isa_usable(Isa::kAvx2, nullptr);
  for (int64_t M : {int64_t{1}, int64_t{20}}) {
    RunInfo info;
    linear_q8b32s4f32(x.data(), M, w4.view, nullptr, y.data(), &info);
    const char* gemv = vnni ? "gemv_q8s4f32_n16b32_avx512vnni" : avx2 ? "gemv_q8s4f32_n16b32_avx2" : "reference";
    const char* want = M == 1 ? gemv : vnni ? "gemm_q8s4f32_n16b32_avx512vnni" : kDequantGemmKernel;
    EXPECT_EQ(info.kernel, want);
    EXPECT_EQ(info.fallback.find("n16k8"), std::string::npos) << info.fallback;
  }
  if (isa_compiled(Isa::kAvx512Vnni)) {
    EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S4, Isa::kAvx512Vnni, 32, S4Layout::kN16B32).kernel,
              "gemv_q8s4f32_n16b32_avx512vnni");
    RunInfo large;
    EXPECT_EQ(choose_large_m(LinearOp::kQ8S4, Isa::kAvx512Vnni, 32, &large, S4Layout::kN16B32), kWeightOnlyMaxM + 1);
    EXPECT_EQ(large.kernel, "gemm_q8s4f32_n16b32_avx512vnni");
  }
  if (isa_compiled(Isa::kAvx2)) {
    EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S4, Isa::kAvx2, 32, S4Layout::kN16B32).kernel,
              "gemv_q8s4f32_n16b32_avx2");
  }
}

// Under an AVX2 cap (machines without AVX-512) the dispatcher runs the n16b32 decode GEMV's AVX2
// twin, bit for bit the reference: M 1..16, N around multiples of 16, K 8..8192 with tails, negative
// scales in every other block (llama.cpp's Q4_0 sign).
TEST(LinearDecode, GgufQ4_0OneStreamAvx2GemvMatchesTheReferenceUnderAnAvx2Cap) {
  if (!machine_has(Isa::kAvx2)) GTEST_SKIP() << "AVX2 not compiled in or not supported by this CPU";
  ScopedMaxIsa cap(Isa::kAvx2);
  auto expect_exact = [](int64_t M, int64_t N, int64_t K) {
    const uint32_t seed = static_cast<uint32_t>(M * 13 + N * 257 + K * 4099);
    const auto x = random_f32(M * K, -2.0f, 2.0f, seed);
    const auto bias = random_f32(N, -1.0f, 1.0f, seed + 1);
    const S4Weights w4 = make_s4_n16b32(N, K, seed + 2, /*negative_scales=*/true);
    const Q8Codes r = quantize_q8(x, M, K);
    std::vector<float> y_ref(M * N), y(M * N, std::nanf(""));
    linear_q8b32_s4_reference(r.q.data(), r.d.data(), r.ldq, w4.w.data(), w4.scale.data(), w4.zero.data(),
                              w4.view.group_size, bias.data(), y_ref.data(), M, N, K);
    RunInfo info;
    linear_q8b32s4f32(x.data(), M, w4.view, bias.data(), y.data(), &info);
    ASSERT_EQ(info.kernel, "gemv_q8s4f32_n16b32_avx2") << decode_shape(M, N, K);
    ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << decode_shape(M, N, K);
  };
  for (int64_t M = 1; M <= 16; ++M) expect_exact(M, 33, 96);
  for (int64_t N : {1, 7, 15, 16, 17, 31, 47, 63, 65}) expect_exact(N % 3 + 1, N, 160);
  for (int64_t K : {8, 20, 32, 33, 63, 64, 65, 127, 255, 257, 1023, 1024, 4096, 4099, 8192})
    for (int64_t M : {1, 2, 5}) expect_exact(M, 17, K);
}

}  // namespace
}  // namespace qforge::kernels
