// Small-M int8 GEMM kernels over the n16k4 layout: every kernel equals the reference exactly.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/gemv_s8.h"
#include "kernels/cpu/kernel_choice.h"
#include "kernels/cpu/reference.h"
#include "kernel_test_util.h"

using namespace qforge::kernels;
using namespace qforge::kernels::testing;

namespace {

struct PackedS8Weights {
  std::vector<int8_t> data;
  std::vector<int32_t> colsum;
  S8N16K4View view;
};

PackedS8Weights pack(const std::vector<int8_t>& W, int64_t N, int64_t K) {
  PackedS8Weights p;
  p.data.resize(round_up(N, 16) * round_up(K, 4));
  p.colsum.resize(round_up(N, 16));
  pack_s8_n16k4_reference(W.data(), N, K, p.data.data(), p.colsum.data());
  p.view.data = p.data.data();
  p.view.colsum = p.colsum.data();
  p.view.n = N;
  p.view.k = K;
  p.view.kp = round_up(K, 4);
  return p;
}

// The entry the int8 GEMM's kernel table gives at the capped level `isa` (A without -128).
std::string planned_s8_kernel(Isa isa, int64_t M) { return choose_kernel(LinearOp::kS8S8, isa, M).kernel; }

// Runs the sweep with the ISA capped at `isa`, checking int32 and fused float outputs.
void sweep_at(Isa isa) {
  ScopedMaxIsa cap(isa);
  std::vector<std::pair<int64_t, int64_t>> nk;
  for (int64_t N : sweep_sizes())
    for (int64_t K : sweep_sizes()) nk.emplace_back(N, K);
  for (int64_t N : {1, 17, 64}) nk.emplace_back(N, kDeepK);
  for (int64_t M : sweep_rows()) {
    for (auto [N, K] : nk) {
      const uint32_t seed = static_cast<uint32_t>(M * 1000003 + N * 1009 + K);
      const auto A = random_s8(M * K, -127, 127, seed);
      const auto W = random_s8(N * K, -128, 127, seed + 1);  // -128 in weights must work
      const PackedS8Weights p = pack(W, N, K);
      std::vector<int32_t> ref(M * N), out(M * N, 12345);
      gemm_s8s8s32_reference(A.data(), W.data(), ref.data(), M, N, K);
      RunInfo info;
      gemv_s8s8s32(A.data(), M, p.view, out.data(), &info);
      ASSERT_EQ(info.kernel, planned_s8_kernel(isa, M));
      ASSERT_TRUE(exact_equal(out, ref)) << info.kernel << " M=" << M << " N=" << N << " K=" << K;

      const auto a_scale = random_f32(M, 0.001f, 0.1f, seed + 2);
      const auto w_scale = random_f32(N, 0.001f, 0.1f, seed + 3);
      const auto bias = random_f32(N, -1.0f, 1.0f, seed + 4);
      std::vector<float> y_ref(M * N), y(M * N);
      dequantize_s32_f32_reference(ref.data(), a_scale.data(), w_scale.data(),
                                   (N % 2) ? bias.data() : nullptr, y_ref.data(), M, N);
      gemv_s8s8f32(A.data(), M, a_scale.data(), p.view, w_scale.data(),
                   (N % 2) ? bias.data() : nullptr, y.data(), &info);
      ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size()))
          << info.kernel << " M=" << M << " N=" << N << " K=" << K;
    }
  }
}

}  // namespace

TEST(GemvS8, Avx512VnniMatchesReferenceExactly) {
  if (!isa_usable(Isa::kAvx512Vnni)) GTEST_SKIP() << "no AVX-512 VNNI here";
  sweep_at(Isa::kAvx512Vnni);
}

TEST(GemvS8, Avx2MatchesReferenceExactly) {
  if (!isa_usable(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 here";
  sweep_at(Isa::kAvx2);
}

TEST(GemvS8, CappedToReferenceRunsReference) { sweep_at(Isa::kReference); }

TEST(GemvS8, ExtremeValuesDoNotSaturate) {
  // All +-127 activations against -128 weights: the largest pair sums VPMADDUBSW could see.
  const int64_t M = 3, N = 33, K = 4096 + 7;
  for (Isa isa : usable_isas()) {
    ScopedMaxIsa cap(isa);
    std::vector<int8_t> A(M * K), W(N * K, -128);
    for (int64_t i = 0; i < M * K; ++i) A[i] = (i % 3 == 0) ? -127 : 127;
    for (int64_t i = 0; i < N * K; i += 5) W[i] = 127;
    const PackedS8Weights p = pack(W, N, K);
    std::vector<int32_t> ref(M * N), out(M * N);
    gemm_s8s8s32_reference(A.data(), W.data(), ref.data(), M, N, K);
    RunInfo info;
    gemv_s8s8s32(A.data(), M, p.view, out.data(), &info);
    EXPECT_TRUE(exact_equal(out, ref)) << info.kernel;
  }
}

TEST(GemvS8, ActivationMinus128SkipsAvx2WithReason) {
  if (!isa_usable(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 here";
  ScopedMaxIsa cap(Isa::kAvx2);
  const int64_t M = 2, N = 5, K = 9;
  auto A = random_s8(M * K, -127, 127, 5);
  A[4] = -128;
  const auto W = random_s8(N * K, -128, 127, 6);
  const PackedS8Weights p = pack(W, N, K);
  std::vector<int32_t> ref(M * N), out(M * N);
  gemm_s8s8s32_reference(A.data(), W.data(), ref.data(), M, N, K);
  RunInfo info;
  gemv_s8s8s32(A.data(), M, p.view, out.data(), &info);
  EXPECT_EQ(info.kernel, "reference");
  EXPECT_NE(info.fallback.find("-128"), std::string::npos) << info.fallback;
  EXPECT_TRUE(exact_equal(out, ref));
}

TEST(GemvU8, EveryKernelMatchesReferenceWithZeroPoint) {
  for (Isa isa : usable_isas()) {
    ScopedMaxIsa cap(isa);
    for (int64_t M : sweep_rows()) {
      for (int64_t N : {1, 7, 16, 33}) {
        for (int64_t K : {int64_t{1}, int64_t{5}, int64_t{64}, int64_t{129}, kDeepK}) {
          const uint32_t seed = static_cast<uint32_t>(M * 31 + N * 17 + K);
          const auto a8 = random_s8(M * K, -128, 127, seed);
          std::vector<uint8_t> A(a8.begin(), a8.end());
          const auto W = random_s8(N * K, -128, 127, seed + 1);
          const PackedS8Weights p = pack(W, N, K);
          for (int32_t zp : {0, 3, 128, 255}) {
            std::vector<int32_t> ref(M * N), out(M * N);
            gemm_u8s8s32_reference(A.data(), zp, W.data(), ref.data(), M, N, K);
            RunInfo info;
            gemv_u8s8s32(A.data(), zp, M, p.view, out.data(), &info);
            ASSERT_TRUE(exact_equal(out, ref)) << info.kernel << " zp=" << zp;
            if (isa < Isa::kAvx512Vnni) {
              EXPECT_EQ(info.kernel, "reference");
            }
          }
        }
      }
    }
  }
}

TEST(GemvS8, EmptyOrNullInputThrows) {
  const auto W = random_s8(16 * 8, -128, 127, 1);
  const PackedS8Weights p = pack(W, 16, 8);
  std::vector<int32_t> C(16);
  EXPECT_THROW(gemv_s8s8s32(nullptr, 1, p.view, C.data()), qforge::Error);
  S8N16K4View empty;
  const std::vector<int8_t> A(8);
  EXPECT_THROW(gemv_s8s8s32(A.data(), 1, empty, C.data()), qforge::Error);
  S8N16K4View bad = p.view;
  bad.kp = 9;
  EXPECT_THROW(gemv_s8s8s32(A.data(), 1, bad, C.data()), qforge::Error);
}

// Batched activation x activation products (MatMul after freeze): every slice equals
// gemm_s8s8s32_reference + dequantize_s32_f32_reference, at every ISA level and thread count,
// with per-row / per-column scales (stride M / N) and shared per-tensor ones (stride 0).
TEST(BmmS8, EverySliceMatchesReferenceExactly) {
  struct Case { int64_t batch, M, N, K; bool shared_scales; };
  const std::vector<Case> cases = {{1, 1, 1, 1, false},  {3, 5, 17, 9, false},   {12, 16, 16, 64, true},
                                   {7, 33, 64, 31, false}, {2, 128, 130, 64, true}, {5, 2, 3, kDeepK, false}};
  const int threads_before = at::get_num_threads();
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (Isa isa : usable_isas()) {
      ScopedMaxIsa cap(isa);
      for (const Case& c : cases) {
        const uint32_t seed = static_cast<uint32_t>(c.batch * 7919 + c.M * 1009 + c.N * 101 + c.K);
        const auto A = random_s8(c.batch * c.M * c.K, -127, 127, seed);  // the quantizers' grid
        const auto Bt = random_s8(c.batch * c.N * c.K, -128, 127, seed + 1);
        const int64_t sa = c.shared_scales ? 0 : c.M, sb = c.shared_scales ? 0 : c.N;
        const auto a_scale = random_f32(c.shared_scales ? c.M : c.batch * c.M, 0.001f, 0.1f, seed + 2);
        const auto b_scale = random_f32(c.shared_scales ? c.N : c.batch * c.N, 0.001f, 0.1f, seed + 3);
        std::vector<float> y(c.batch * c.M * c.N, -1.0f), y_ref(y.size());
        std::vector<int32_t> acc(c.M * c.N);
        for (int64_t b = 0; b < c.batch; ++b) {
          gemm_s8s8s32_reference(A.data() + b * c.M * c.K, Bt.data() + b * c.N * c.K, acc.data(), c.M, c.N, c.K);
          dequantize_s32_f32_reference(acc.data(), a_scale.data() + b * sa, b_scale.data() + b * sb, nullptr,
                                       y_ref.data() + b * c.M * c.N, c.M, c.N);
        }
        RunInfo info;
        bmm_s8s8f32(A.data(), Bt.data(), c.batch, c.M, c.N, c.K, a_scale.data(), sa, b_scale.data(), sb, y.data(),
                    &info);
        EXPECT_EQ(info.kernel, planned_s8_kernel(isa, c.M));
        ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size()))
            << info.kernel << " threads=" << threads << " batch=" << c.batch << " M=" << c.M << " N=" << c.N
            << " K=" << c.K;
      }
    }
  }
  at::set_num_threads(threads_before);
}

TEST(BmmS8, BadArgumentsAreClearErrors) {
  std::vector<int8_t> A(4), B(4);
  std::vector<float> s(2, 1.0f), y(4);
  EXPECT_THROW(bmm_s8s8f32(A.data(), B.data(), 1, 2, 2, -1, s.data(), 0, s.data(), 0, y.data()), qforge::Error);
  EXPECT_THROW(bmm_s8s8f32(A.data(), B.data(), 1, 2, 2, 200000, s.data(), 0, s.data(), 0, y.data()),
               qforge::Error);
  EXPECT_THROW(bmm_s8s8f32(A.data(), nullptr, 1, 2, 2, 2, s.data(), 0, s.data(), 0, y.data()), qforge::Error);
  // Nothing to compute: no pointer is read.
  EXPECT_NO_THROW(bmm_s8s8f32(nullptr, nullptr, 0, 2, 2, 2, nullptr, 0, nullptr, 0, nullptr));
}
