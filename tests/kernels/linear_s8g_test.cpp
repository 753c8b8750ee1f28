// int8 weights with group scales (kernels/cpu/linear_s8g.h, PackedLinearS8G): every decode, prefill
// GEMM and exact kernel-table entry this machine has against the scalar references on the int8
// codes, bit for bit (zero points or none, fp16 or float scales, negative scales, K tails, rows and
// columns past the GEMM's tiles); the exact large-M entry within float rounding of the reference;
// group sizes the blocks cannot split; plans; bad input.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/kernel_choice.h"
#include "kernels/cpu/linear_decode.h"
#include "kernels/cpu/linear_s8g.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/quantize_rows_s8.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/thread_pool.h"

namespace qforge::kernels {
namespace {

using testing::bitwise_equal;
using testing::machine_has;
using testing::random_f16_exact;
using testing::random_f32;
using testing::random_s8;

// Codes [N, K], scales [N, G] (half of them negative), zero points [N, G] (or none), packed.
struct S8GCase {
  std::vector<int8_t> w;
  std::vector<float> scale;
  std::vector<int32_t> zero;  // all 0 when the case has none
  PackedLinearS8G packed;
};

S8GCase make_case(int64_t N, int64_t K, int64_t g, bool zeros, bool fp16, uint32_t seed) {
  S8GCase c;
  const int64_t G = num_groups(K, std::min(g, K));
  c.w = random_s8(N * K, -128, 127, seed);
  c.scale = fp16 ? random_f16_exact(N * G, 0.001f, 0.1f, seed + 1) : random_f32(N * G, 0.001f, 0.1f, seed + 1);
  for (size_t i = 0; i < c.scale.size(); i += 2) c.scale[i] = -c.scale[i];
  c.zero.assign(static_cast<size_t>(N * G), 0);
  if (zeros) {
    const auto z = random_s8(N * G, -128, 127, seed + 2);
    c.zero.assign(z.begin(), z.end());
  }
  const at::Tensor wt = at::from_blob(c.w.data(), {N, K}, at::kChar);
  const at::Tensor st = at::from_blob(c.scale.data(), {N, G}, at::kFloat);
  const at::Tensor zt = zeros ? at::from_blob(c.zero.data(), {N, G}, at::kInt) : at::Tensor();
  c.packed = PackedLinearS8G(wt, st, zt, g);
  return c;
}

std::string shape(int64_t M, int64_t N, int64_t K, int64_t g, bool zeros, bool fp16) {
  return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + " g=" +
         std::to_string(g) + (zeros ? " zeros" : "") + (fp16 ? " fp16" : " fp32");
}

// linear_q8b32_s4_reference of a case on x [M, K] quantized by the block-32 reference.
std::vector<float> q8_reference(const S8GCase& c, const std::vector<float>& x, const std::vector<float>& bias,
                                int64_t M, int64_t N, int64_t K, int64_t g) {
  const int64_t ldq = q8_block_count(K) * kQ8Block;
  std::vector<int8_t> q(M * ldq);
  std::vector<float> d(M * q8_block_count(K)), y(M * N);
  std::vector<int32_t> s(d.size());
  quantize_rows_q8b32_reference(x.data(), M, K, q.data(), ldq, d.data(), s.data());
  linear_q8b32_s4_reference(q.data(), d.data(), ldq, c.w.data(), c.scale.data(), c.zero.data(), std::min(g, K),
                            bias.data(), y.data(), M, N, K);
  return y;
}

// The table's entries this machine has that apply, whatever rows they serve (GEMVs, the block-32
// GEMM, the references; not the exact fallback or the dequantized GEMM).
std::vector<const KernelEntry<LinearS8GProblem>*> checked_entries(const KernelTable<LinearS8GProblem>& table,
                                                                  const LinearS8GProblem& p) {
  std::vector<const KernelEntry<LinearS8GProblem>*> out;
  std::string why;
  for (const auto& e : table) {
    const std::string name = e.name;
    if (name == kDequantGemmKernel || name == kExactS8GGemvKernel) continue;
    if (machine_has(e.isa) && (e.applies == nullptr || e.applies(p, &why))) out.push_back(&e);
  }
  return out;
}

constexpr const char* kQ8S8GGemm = "gemm_q8s8gf32_n16k4_avx512vnni";

// Every checked entry of the block-32 table on one case against linear_q8b32_s4_reference on the
// codes, bit for bit, and the dispatcher's choice too; the names of the entries run.
std::vector<std::string> expect_q8_entries_exact(int64_t M, int64_t N, int64_t K, int64_t g, bool zeros, bool fp16) {
  const uint32_t seed = static_cast<uint32_t>(M * 7 + N * 131 + K * 8191 + g + zeros);
  const std::string what = shape(M, N, K, g, zeros, fp16);
  const S8GCase c = make_case(N, K, g, zeros, fp16, seed);
  EXPECT_EQ(c.packed.fp16_scales(), fp16) << what;
  const auto x = random_f32(M * K, -2.0f, 2.0f, seed + 3);
  const auto bias = random_f32(N, -1.0f, 1.0f, seed + 4);
  const std::vector<float> y_ref = q8_reference(c, x, bias, M, N, K, g);
  std::vector<float> y(M * N);
  const LinearS8GProblem p{x.data(), M, c.packed.view(), bias.data(), y.data()};
  std::vector<std::string> ran;
  for (const auto* e : checked_entries(linear_q8s8g_kernels(), p)) {
    std::fill(y.begin(), y.end(), std::nanf(""));
    e->run(p);
    EXPECT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e->name << " " << what;
    ran.push_back(e->name);
  }
  EXPECT_FALSE(ran.empty()) << what;
  RunInfo info;
  std::fill(y.begin(), y.end(), std::nanf(""));
  linear_q8b32s8gf32(x.data(), M, c.packed.view(), bias.data(), y.data(), &info);
  if (info.kernel != kDequantGemmKernel) {
    EXPECT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << "dispatched " << info.kernel << " " << what;
  }
  return ran;
}

TEST(LinearS8G, EveryDecodeEntryMatchesTheReferenceExactly) {
  for (int64_t M : {1, 2, 3, 5, 16}) {
    for (int64_t N : {1, 17, 33, 64}) {
      for (int64_t K : {32, 33, 96, 4096, 4099}) {
        for (int64_t g : {int64_t{32}, int64_t{64}, K}) {
          for (bool zeros : {false, true}) {
            expect_q8_entries_exact(M, N, K, g, zeros, (M + N + g) % 2 == 0);
            if (::testing::Test::HasFailure()) return;
          }
        }
      }
    }
  }
}

// The prefill GEMM (and every other integer entry) at calls of more than 16 rows: rows past its
// 4-row tiles (17..600, primes, powers of two +- 1), columns past its 2-block panels and inside a
// block (N 1..100, multiples of 16 and not), K in whole blocks, a K tail and deep, groups of one
// block, several and the row, Q8_0's shape (groups of 32, fp16 scales, no zero points) included.
TEST(LinearS8G, EveryPrefillEntryMatchesTheReferenceExactlyAboveTheDecodeRows) {
  struct Shape {
    int64_t m, n, k;
  };
  const std::vector<Shape> shapes = {{17, 16, 32},   {18, 17, 64},   {19, 1, 96},     {20, 33, 128},
                                     {21, 48, 32},   {31, 100, 96},  {33, 15, 160},   {63, 64, 256},
                                     {65, 47, 33},   {127, 80, 1024}, {129, 31, 2080}, {255, 32, 4096},
                                     {257, 96, 512}, {600, 49, 224}};
  for (const Shape& sh : shapes) {
    for (int64_t g : {int64_t{32}, int64_t{64}, sh.k}) {
      for (bool zeros : {false, true}) {
        const bool fp16 = !zeros || sh.m % 2 == 0;
        const std::vector<std::string> ran = expect_q8_entries_exact(sh.m, sh.n, sh.k, g, zeros, fp16);
        if (isa_usable(Isa::kAvx512Vnni) && (g % 32 == 0 || g >= sh.k)) {
          EXPECT_NE(std::find(ran.begin(), ran.end(), kQ8S8GGemm), ran.end())
              << shape(sh.m, sh.n, sh.k, g, zeros, fp16);
        }
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST(LinearS8G, EveryExactEntryMatchesTheReferenceExactly) {
  for (int64_t M : {1, 3, 16}) {
    for (int64_t N : {1, 17, 64}) {
      for (int64_t K : {8, 33, 96, 4099}) {
        for (int64_t g : {int64_t{4}, int64_t{32}, K}) {
          for (bool zeros : {false, true}) {
            const bool fp16 = (M + N + K) % 2 == 0;
            const uint32_t seed = static_cast<uint32_t>(M * 5 + N * 97 + K * 7919 + g + zeros);
            const S8GCase c = make_case(N, K, g, zeros, fp16, seed);
            const auto x = random_f32(M * K, -2.0f, 2.0f, seed + 3);
            std::vector<float> y_ref(M * N), y(M * N);
            linear_f32_s4_reference(x.data(), c.w.data(), c.scale.data(), c.zero.data(), std::min(g, K), nullptr,
                                    y_ref.data(), M, N, K);
            const LinearS8GProblem p{x.data(), M, c.packed.view(), nullptr, y.data()};
            const auto entries = checked_entries(linear_f32s8g_kernels(), p);
            ASSERT_FALSE(entries.empty()) << shape(M, N, K, g, zeros, fp16);
            for (const auto* e : entries) {
              e->run(p);
              ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e->name << " " << shape(M, N, K, g, zeros, fp16);
            }
          }
        }
      }
    }
  }
}

// Under an AVX2 cap (machines without AVX-512) the dispatcher runs the AVX2 twins, bit for bit the
// references: M 1..16, N around multiples of 16, K 32..8192 with tails, groups of 32, 64 and K.
void expect_avx2_twins_exact(int64_t M, int64_t N, int64_t K, int64_t g, bool zeros) {
  const bool fp16 = (M + N + K) % 2 == 1;
  const uint32_t seed = static_cast<uint32_t>(M * 11 + N * 173 + K * 7907 + g * 3 + zeros);
  const S8GCase c = make_case(N, K, g, zeros, fp16, seed);
  const int64_t gs = std::min(g, K);
  const auto x = random_f32(M * K, -2.0f, 2.0f, seed + 3);
  const auto bias = random_f32(N, -1.0f, 1.0f, seed + 4);
  std::vector<float> y_ref = q8_reference(c, x, bias, M, N, K, g), y(M * N);
  RunInfo info;
  linear_q8b32s8gf32(x.data(), M, c.packed.view(), bias.data(), y.data(), &info);
  ASSERT_EQ(info.kernel, "gemv_q8s8gf32_n16k4_avx2") << shape(M, N, K, g, zeros, fp16);
  ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << "decode " << shape(M, N, K, g, zeros, fp16);
  linear_f32_s4_reference(x.data(), c.w.data(), c.scale.data(), c.zero.data(), gs, bias.data(), y_ref.data(), M, N, K);
  linear_f32s8gf32(x.data(), M, c.packed.view(), bias.data(), y.data(), &info);
  ASSERT_EQ(info.kernel, "gemv_f32s8gf32_n16k4_avx2") << shape(M, N, K, g, zeros, fp16);
  ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << "exact " << shape(M, N, K, g, zeros, fp16);
}

TEST(LinearS8G, Avx2TwinsMatchTheReferencesExactlyUnderAnAvx2Cap) {
  if (!machine_has(Isa::kAvx2)) GTEST_SKIP() << "AVX2 not compiled in or not supported by this CPU";
  ScopedMaxIsa cap(Isa::kAvx2);
  for (int64_t M = 1; M <= 16; ++M) {
    for (bool zeros : {false, true}) expect_avx2_twins_exact(M, 33, 96, 32, zeros);
  }
  for (int64_t N : {1, 7, 15, 16, 17, 31, 47, 63, 65}) {
    for (int64_t g : {32, 64, 160}) expect_avx2_twins_exact(N % 3 + 1, N, 160, g, N % 2 == 1);
  }
  for (int64_t K : {32, 33, 63, 64, 65, 127, 255, 257, 1023, 1024, 4096, 4099, 8192}) {
    for (int64_t M : {1, 2, 5}) {
      for (int64_t g : {int64_t{32}, int64_t{64}, K}) expect_avx2_twins_exact(M, 17, K, g, (M + K) % 2 == 0);
    }
  }
}

// Above the decode rows the exact table, and the block-32 table where AVX-512 VNNI is not usable
// (capped to AVX-512 here, so VNNI machines check that entry too), run the dequantized weight
// through at::linear: within float rounding (1e-5 of sum |x w|) of the exact reference. With VNNI
// the block-32 table runs its GEMM (checked bit for bit by the prefill tests above).
TEST(LinearS8G, AboveTheDecodeRowsTheDequantizedGemmRunsWhereNoBlock32GemmServes) {
  const int64_t M = kWeightOnlyMaxM + 1, N = 40, K = 96;
  const S8GCase c = make_case(N, K, 32, true, true, 61);
  const auto x = random_f32(M * K, -1.0f, 1.0f, 62);
  std::vector<float> y(M * N), y_ref(M * N);
  linear_f32_s4_reference(x.data(), c.w.data(), c.scale.data(), c.zero.data(), 32, nullptr, y_ref.data(), M, N, K);
  if (isa_usable(Isa::kAvx512Vnni)) {
    RunInfo info;
    linear_q8b32s8gf32(x.data(), M, c.packed.view(), nullptr, y.data(), &info);
    EXPECT_EQ(info.kernel, kQ8S8GGemm);
  }
  ScopedMaxIsa cap(Isa::kAvx512);
  for (bool q8 : {false, true}) {
    RunInfo info;
    std::fill(y.begin(), y.end(), std::nanf(""));
    (q8 ? linear_q8b32s8gf32 : linear_f32s8gf32)(x.data(), M, c.packed.view(), nullptr, y.data(), &info);
    EXPECT_EQ(info.kernel, kDequantGemmKernel) << (q8 ? "q8" : "exact");
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t gi = n * (K / 32) + k / 32;
          mag += std::fabs(x[m * K + k] * (c.w[n * K + k] - c.zero[gi]) * c.scale[gi]);
        }
        ASSERT_NEAR(y[m * N + n], y_ref[m * N + n], 1e-5 * mag + 1e-7) << m << " " << n;
      }
    }
  }
}

TEST(LinearS8G, GroupsTheBlocksCannotSplitRunTheExactGemvWithTheReason) {
  const int64_t M = 2, N = 17, K = 64;
  const S8GCase c = make_case(N, K, 16, false, true, 71);
  const auto x = random_f32(M * K, -1.0f, 1.0f, 72);
  std::vector<float> y(M * N), y_ref(M * N);
  RunInfo info;
  linear_q8b32s8gf32(x.data(), M, c.packed.view(), nullptr, y.data(), &info);
  EXPECT_EQ(info.kernel, kExactS8GGemvKernel);
  EXPECT_NE(info.fallback.find("group_size=16 not a multiple of 32"), std::string::npos) << info.fallback;
  linear_f32_s4_reference(x.data(), c.w.data(), c.scale.data(), c.zero.data(), 16, nullptr, y_ref.data(), M, N, K);
  EXPECT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size()));
  EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S8G, Isa::kAvx512Vnni, 16).kernel, kExactS8GGemvKernel);
}

TEST(LinearS8G, PlansNameTheTableEntries) {
  EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S8G, Isa::kReference, 32).kernel, "reference");
  EXPECT_EQ(choose_decode_kernel(LinearOp::kF32S8G, Isa::kReference, 32).kernel, "reference");
  if (isa_compiled(Isa::kAvx512Vnni)) {
    EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S8G, Isa::kAvx512Vnni, 32).kernel, "gemv_q8s8gf32_n16k4_avx512vnni");
    EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S8G, Isa::kAvx512Vnni, 0).kernel, "gemv_q8s8gf32_n16k4_avx512vnni");
  }
  if (isa_compiled(Isa::kAvx512)) {
    EXPECT_EQ(choose_decode_kernel(LinearOp::kF32S8G, Isa::kAvx512, 32).kernel, "gemv_f32s8gf32_n16k4_avx512");
    EXPECT_EQ(choose_decode_kernel(LinearOp::kF32S8G, Isa::kAvx512, 6).kernel, "reference");
  }
  if (isa_compiled(Isa::kAvx2)) {
    EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S8G, Isa::kAvx2, 32).kernel, "gemv_q8s8gf32_n16k4_avx2");
    EXPECT_EQ(choose_decode_kernel(LinearOp::kQ8S8G, Isa::kAvx2, 16).kernel, kExactS8GGemvKernel);
    EXPECT_EQ(choose_decode_kernel(LinearOp::kF32S8G, Isa::kAvx2, 32).kernel, "gemv_f32s8gf32_n16k4_avx2");
    EXPECT_EQ(choose_decode_kernel(LinearOp::kF32S8G, Isa::kAvx2, 6).kernel, "reference");
  }
  RunInfo large;
  EXPECT_EQ(choose_large_m(LinearOp::kQ8S8G, Isa::kAvx512Vnni, 32, &large), kWeightOnlyMaxM + 1);
  EXPECT_EQ(large.kernel, isa_compiled(Isa::kAvx512Vnni) ? kQ8S8GGemm : kDequantGemmKernel);
  EXPECT_EQ(choose_large_m(LinearOp::kQ8S8G, Isa::kAvx512, 32, &large), kWeightOnlyMaxM + 1);
  EXPECT_EQ(large.kernel, kDequantGemmKernel);
  if (isa_compiled(Isa::kAvx512Vnni)) {
    EXPECT_NE(large.fallback.find(std::string(kQ8S8GGemm) + ": avx512vnni not usable"), std::string::npos)
        << large.fallback;
    EXPECT_EQ(choose_large_m(LinearOp::kQ8S8G, Isa::kAvx512Vnni, 0, &large), kWeightOnlyMaxM + 1);  // one group
    EXPECT_EQ(large.kernel, kQ8S8GGemm);
    choose_large_m(LinearOp::kQ8S8G, Isa::kAvx512Vnni, 16, &large);  // groups the blocks cannot split
    EXPECT_EQ(large.kernel, kDequantGemmKernel);
    EXPECT_NE(large.fallback.find(std::string(kQ8S8GGemm) + ": group_size=16 not a multiple of 32"),
              std::string::npos) << large.fallback;
  }
}

// A prompt's call equals its rows decoded one at a time, bit for bit (GEMM against GEMV), and its
// result does not depend on the thread count (column blocks split across threads): Q8_0's form.
// Each parallel backend is pinned, since under kPool at::set_num_threads alone does not set the split.
TEST(LinearS8G, APrefillCallEqualsOneRowCallsBitForBitAtOneAndTwoThreads) {
  if (!isa_usable(Isa::kAvx512Vnni)) GTEST_SKIP() << "calls of more than 16 rows run the exact path here";
  const int64_t M = 150, N = 80, K = 256;
  const S8GCase c = make_case(N, K, 32, false, true, 91);
  const auto x = random_f32(M * K, -2.0f, 2.0f, 92);
  const auto bias = random_f32(N, -1.0f, 1.0f, 93);
  std::vector<float> y_rows(M * N);
  for (int64_t m = 0; m < M; ++m) {
    linear_q8b32s8gf32(x.data() + m * K, 1, c.packed.view(), bias.data(), y_rows.data() + m * N);
  }
  const int threads = at::get_num_threads();
  const ParallelBackend backend = parallel_backend();
  for (ParallelBackend b : {ParallelBackend::kOpenMP, ParallelBackend::kPool}) {
    set_parallel_backend(b);
    const char* name = b == ParallelBackend::kPool ? "pool" : "openmp";
    for (int t : {1, 2}) {
      at::set_num_threads(t);
      if (parallel_threads() != t) {  // the pool is capped by the CPUs this process may use
        EXPECT_EQ(b, ParallelBackend::kPool) << name << " runs " << parallel_threads() << " threads, asked " << t;
        continue;
      }
      std::vector<float> y(M * N, std::nanf(""));
      RunInfo info;
      linear_q8b32s8gf32(x.data(), M, c.packed.view(), bias.data(), y.data(), &info);
      EXPECT_EQ(info.kernel, kQ8S8GGemm);
      EXPECT_TRUE(bitwise_equal(y.data(), y_rows.data(), y.size())) << t << " threads, " << name;
    }
  }
  set_parallel_backend(backend);
  at::set_num_threads(threads);
}

TEST(LinearS8G, PackingKeepsCodesScalesAndSize) {
  const int64_t N = 20, K = 70;
  const S8GCase c = make_case(N, K, 32, true, true, 81);
  EXPECT_TRUE(at::equal(c.packed.weight(), at::from_blob(const_cast<int8_t*>(c.w.data()), {N, K}, at::kChar)));
  const S8GUnpacked u = unpack_s8g(c.packed.view());
  EXPECT_EQ(u.scale, c.scale);
  EXPECT_EQ(u.zero, c.zero);
  // 32 x 72 codes, 32 x 3 fp16 scales and int8 zero points.
  EXPECT_EQ(c.packed.bytes(), 32 * 72 + 32 * 3 * 2 + 32 * 3);
  EXPECT_EQ(make_case(N, K, 32, false, false, 82).packed.bytes(), 32 * 72 + 32 * 3 * 4);
}

TEST(LinearS8G, BadInputIsRefused) {
  const at::Tensor w = at::zeros({4, 64}, at::kChar), s = at::ones({4, 2});
  EXPECT_NO_THROW(PackedLinearS8G(w, s, {}, 32));
  EXPECT_THROW(PackedLinearS8G(w.to(at::kInt), s, {}, 32), Error);
  EXPECT_THROW(PackedLinearS8G(w, at::ones({4, 3}), {}, 32), Error);
  EXPECT_THROW(PackedLinearS8G(w, s.index_fill(1, at::tensor({1}, at::kLong), std::nanf("")), {}, 32), Error);
  EXPECT_THROW(PackedLinearS8G(w, s, at::full({4, 2}, 128, at::kInt), 32), Error);
  EXPECT_THROW(PackedLinearS8G(w, s, {}, 0), Error);
  const PackedLinearS8G p(w, s, {}, 32);
  EXPECT_THROW(p.run_decode(at::ones({1, 63})), Error);
  auto x = at::ones({1, 64});
  x[0][5] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(p.run_decode(x), Error);
  EXPECT_THROW(PackedLinearS8G().run_weight_only(at::ones({1, 64})), Error);
}

}  // namespace
}  // namespace qforge::kernels
