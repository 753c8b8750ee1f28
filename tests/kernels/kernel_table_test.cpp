// The kernel tables, entry by entry. Every entry this machine can run (compiled in and supported
// by the CPU, whatever the cap) runs directly against its op's reference, bit for bit, over the
// shape sweep, at every M (which M an entry serves is a speed choice; its results must not depend
// on it). The dequantize + float GEMM entry equals at::linear of the dequantized weight bit for
// bit, as a float Linear computes it. And at every ISA cap, each dispatcher's RunInfo names the
// entry the table gives, and the plan (choose_kernel) names the same.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/conv_s8.h"
#include "kernels/cpu/gemv_s4.h"
#include "kernels/cpu/gemv_s8.h"
#include "kernels/cpu/kernel_choice.h"
#include "kernels/cpu/linear_decode.h"
#include "kernels/cpu/linear_s8g.h"
#include "kernels/cpu/linear_weight_only.h"
#include "kernels/cpu/lut_linear.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/workspace.h"

namespace qforge::kernels {
namespace {

using testing::bitwise_equal;
using testing::exact_equal;
using testing::kDeepK;
using testing::make_s4;
using testing::make_s4_n16b32;
using testing::make_s8;
using testing::S4Weights;
using testing::S8Weights;
using testing::machine_has;
using testing::random_f16_exact;
using testing::random_f32;
using testing::random_s8;

bool is_dequant_gemm(const char* name) { return std::strcmp(name, kDequantGemmKernel) == 0; }

// The entries of `table` this machine can run whose conditions hold for `p` (the float GEMM entry
// aside: its oracle is at::linear, not the reference).
template <typename Problem>
std::vector<const KernelEntry<Problem>*> runnable(const KernelTable<Problem>& table, const Problem& p) {
  std::vector<const KernelEntry<Problem>*> out;
  std::string why;
  for (const KernelEntry<Problem>& e : table) {
    if (machine_has(e.isa) && !is_dequant_gemm(e.name) && (e.applies == nullptr || e.applies(p, &why))) {
      out.push_back(&e);
    }
  }
  return out;
}

// The name the table gives for `p` at the current cap, found without select_kernel.
template <typename Problem>
std::string table_choice(const KernelTable<Problem>& table, const Problem& p) {
  std::string why;
  for (const KernelEntry<Problem>& e : table) {
    if (e.serves != nullptr && !e.serves(p)) continue;
    if (isa_usable(e.isa) && (e.applies == nullptr || e.applies(p, &why))) return e.name;
  }
  return "";
}

const std::vector<int64_t>& table_rows() {
  static const std::vector<int64_t> m{1, 2, 3, 4, 5, 7, 16, 17};
  return m;
}
const std::vector<int64_t>& table_sizes() {
  static const std::vector<int64_t> s{1, 3, 4, 5, 8, 15, 16, 17, 31, 33, 64, 65};
  return s;
}

std::string shape(int64_t M, int64_t N, int64_t K) {
  return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
}

// y = at::linear(x, W, bias) on 2-D float tensors, as a frozen float Linear computes it.
std::vector<float> float_linear(const std::vector<float>& x, const at::Tensor& w, const float* bias, int64_t M) {
  const int64_t N = w.size(0), K = w.size(1);
  const at::Tensor xt = at::from_blob(const_cast<float*>(x.data()), {M, K}, at::kFloat).clone();
  const at::Tensor b = bias != nullptr ? at::from_blob(const_cast<float*>(bias), {N}, at::kFloat).clone() : at::Tensor();
  const at::Tensor y = at::linear(xt, w, b).contiguous();
  return std::vector<float>(y.data_ptr<float>(), y.data_ptr<float>() + M * N);
}

TEST(KernelTable, EveryGemvS8EntryMatchesTheReferenceExactly) {
  std::vector<std::pair<int64_t, int64_t>> nk;
  for (int64_t N : table_sizes())
    for (int64_t K : table_sizes()) nk.emplace_back(N, K);
  for (int64_t N : {1, 17, 64}) nk.emplace_back(N, kDeepK);
  for (int64_t M : table_rows()) {
    for (auto [N, K] : nk) {
      const uint32_t seed = static_cast<uint32_t>(M * 1000003 + N * 1009 + K);
      const S8Weights w = make_s8(N, K, seed);
      const auto a = random_s8(M * K, -127, 127, seed + 1);
      const auto a_scale = random_f32(M, 0.001f, 0.1f, seed + 2);
      const auto w_scale = random_f32(N, 0.001f, 0.1f, seed + 3);
      const auto bias = random_f32(N, -1.0f, 1.0f, seed + 4);
      std::vector<int32_t> c_ref(M * N), c(M * N);
      std::vector<float> y_ref(M * N), y(M * N);
      gemm_s8s8s32_reference(a.data(), w.w.data(), c_ref.data(), M, N, K);
      dequantize_s32_f32_reference(c_ref.data(), a_scale.data(), w_scale.data(), bias.data(), y_ref.data(), M, N);
      GemvS8Problem pc;
      pc.a_s8 = a.data();
      pc.m = M;
      pc.w = w.view;
      pc.c = c.data();
      GemvS8Problem py = pc;
      py.c = nullptr;
      py.y = y.data();
      py.a_scale = a_scale.data();
      py.w_scale = w_scale.data();
      py.bias = bias.data();
      for (const auto* e : runnable(gemv_s8_kernels(), pc)) {
        std::fill(c.begin(), c.end(), 12345);
        e->run(pc);
        ASSERT_TRUE(exact_equal(c, c_ref)) << e->name << " " << shape(M, N, K);
        e->run(py);
        ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e->name << " " << shape(M, N, K);
      }
      // u8 activations with a zero point: only the entries that take them.
      std::vector<uint8_t> au(a.begin(), a.end());
      GemvS8Problem pu = pc;
      pu.a_s8 = nullptr;
      pu.a_u8 = au.data();
      pu.a_zero_point = 77;
      gemm_u8s8s32_reference(au.data(), 77, w.w.data(), c_ref.data(), M, N, K);
      for (const auto* e : runnable(gemv_s8_kernels(), pu)) {
        e->run(pu);
        ASSERT_TRUE(exact_equal(c, c_ref)) << e->name << " u8 " << shape(M, N, K);
      }
    }
  }
}

TEST(KernelTable, EveryGemvS4EntryMatchesTheReferenceExactly) {
  for (int64_t M : table_rows()) {
    for (int64_t N : table_sizes()) {
      for (int64_t K : {int64_t{8}, int64_t{16}, int64_t{24}, int64_t{64}, int64_t{264}, kDeepK}) {
        for (int64_t g : {int64_t{8}, int64_t{32}, K, int64_t{12}}) {
          const int qmin = (N + K + g) % 2 == 0 ? 0 : -8;
          const uint32_t seed = static_cast<uint32_t>(M * 7 + N * 131 + K * 8191 + g);
          const S4Weights w = make_s4(N, K, g, qmin, seed);
          const auto a = random_s8(M * K, -127, 127, seed + 3);
          const auto a_scale = random_f32(M, 0.001f, 0.05f, seed + 4);
          const auto bias = random_f32(N, -1.0f, 1.0f, seed + 5);
          std::vector<float> y_ref(M * N), y(M * N);
          gemm_s8s4f32_reference(a.data(), a_scale.data(), w.w.data(), w.scale.data(), w.zero.data(), g, bias.data(),
                                 y_ref.data(), M, N, K);
          const GemvS4Problem p{a.data(), M, a_scale.data(), w.view, bias.data(), y.data()};
          for (const auto* e : runnable(gemv_s4_kernels(), p)) {
            e->run(p);
            ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e->name << " " << shape(M, N, K)
                                                                         << " g=" << g;
          }
        }
      }
    }
  }
}

TEST(KernelTable, EveryWeightOnlyEntryMatchesItsOracleExactly) {
  for (int64_t M : {1, 3, 4, 16, 17, 40}) {
    for (int64_t N : {1, 5, 16, 17, 33}) {
      for (int64_t K : {int64_t{8}, int64_t{31}, int64_t{64}, kDeepK}) {
        const uint32_t seed = static_cast<uint32_t>(M * 7 + N * 131 + K * 8191);
        const auto x = random_f32(M * K, -2.0f, 2.0f, seed);
        const auto bias = random_f32(N, -1.0f, 1.0f, seed + 1);
        const S8Weights w8 = make_s8(N, K, seed + 2);
        const auto w_scale = random_f32(N, 0.001f, 0.1f, seed + 3);
        std::vector<float> y_ref(M * N), y(M * N);
        linear_f32_s8_reference(x.data(), w8.w.data(), w_scale.data(), bias.data(), y_ref.data(), M, N, K);
        const LinearF32S8Problem p8{x.data(), M, w8.view, w_scale.data(), bias.data(), y.data()};
        for (const auto* e : runnable(linear_f32s8_kernels(), p8)) {
          e->run(p8);
          ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e->name << " " << shape(M, N, K);
        }
        if (K % 8 != 0) continue;
        const int64_t g = K == kDeepK ? K : 8;
        const S4Weights w4 = make_s4(N, K, g, -8, seed + 4);
        linear_f32_s4_reference(x.data(), w4.w.data(), w4.scale.data(), w4.zero.data(), g, bias.data(), y_ref.data(),
                                M, N, K);
        const LinearF32S4Problem p4{x.data(), M, w4.view, bias.data(), y.data()};
        for (const auto* e : runnable(linear_f32s4_kernels(), p4)) {
          e->run(p4);
          ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e->name << " " << shape(M, N, K);
        }
      }
    }
  }
}

// What a frozen float Linear computes for M > kWeightOnlyMaxM: at::linear with the weight
// dequantized as dequantize_int does, (float(q) - float(z)) * scale.
TEST(KernelTable, DequantGemmEntryEqualsFloatLinearOfTheDequantizedWeight) {
  for (int64_t M : {17, 33, 100}) {
    for (auto [N, K] : {std::pair<int64_t, int64_t>{5, 64}, {33, 96}, {64, 256}}) {
      const uint32_t seed = static_cast<uint32_t>(M * 7 + N * 131 + K);
      const auto x = random_f32(M * K, -2.0f, 2.0f, seed);
      const auto bias = random_f32(N, -1.0f, 1.0f, seed + 1);
      std::vector<float> y(M * N);
      RunInfo info;

      const S8Weights w8 = make_s8(N, K, seed + 2);
      auto w_scale = random_f32(N, 0.001f, 0.1f, seed + 3);
      const at::Tensor q8 = at::from_blob(const_cast<int8_t*>(w8.w.data()), {N, K}, at::kChar);
      const at::Tensor s8 = at::from_blob(w_scale.data(), {N, 1}, at::kFloat);
      const at::Tensor w8f = ((q8.to(at::kFloat) - at::zeros({N, 1})) * s8).contiguous();
      linear_f32s8f32(x.data(), M, w8.view, w_scale.data(), bias.data(), y.data(), &info);
      EXPECT_EQ(info.kernel, kDequantGemmKernel);
      EXPECT_EQ(info.fallback, "");
      ASSERT_TRUE(bitwise_equal(y.data(), float_linear(x, w8f, bias.data(), M).data(), y.size())) << shape(M, N, K);

      const int64_t g = 32, G = K / g;
      S4Weights w4 = make_s4(N, K, g, -8, seed + 4);
      const at::Tensor q4 = at::from_blob(w4.w.data(), {N, G, g}, at::kChar).to(at::kFloat);
      const at::Tensor z4 = at::from_blob(w4.zero.data(), {N, G, 1}, at::kInt).to(at::kFloat);
      const at::Tensor s4 = at::from_blob(w4.scale.data(), {N, G, 1}, at::kFloat);
      const at::Tensor w4f = ((q4 - z4) * s4).reshape({N, K});
      linear_f32s4f32(x.data(), M, w4.view, nullptr, y.data(), &info);
      EXPECT_EQ(info.kernel, kDequantGemmKernel);
      ASSERT_TRUE(bitwise_equal(y.data(), float_linear(x, w4f, nullptr, M).data(), y.size())) << shape(M, N, K);

      const at::Tensor idx = at::randint(0, 8, {N, K}).to(at::kByte);
      const at::Tensor cb = at::randn({N, G, 8});
      const at::Tensor b = at::from_blob(const_cast<float*>(bias.data()), {N}, at::kFloat).clone();
      const PackedLinearLut lut(idx, cb, g, 3, b);
      const at::Tensor wl = cb.gather(2, idx.to(at::kLong).view({N, G, g})).view({N, K}).contiguous();
      lut.run(x.data(), M, y.data(), &info);
      EXPECT_EQ(info.kernel, kDequantGemmKernel);
      ASSERT_TRUE(bitwise_equal(y.data(), float_linear(x, wl, bias.data(), M).data(), y.size())) << shape(M, N, K);
    }
  }
}

// Each dispatcher, at every cap this machine allows: RunInfo.kernel is the entry the table gives,
// and choose_kernel (the plan, without data, at the same level) gives the same entry.
TEST(KernelTable, DispatchersRunTheEntryTheTableGivesAtEveryCap) {
  constexpr int64_t N = 20, K = 96;  // K a multiple of every group size below
  const S8Weights w8 = make_s8(N, K, 5);
  const auto w_scale = random_f32(N, 0.01f, 0.1f, 6);
  const PackedLinearLut lut(at::randint(0, 16, {N, K}).to(at::kByte), at::randn({N, 3, 16}), 32, 4);
  for (Isa isa : testing::usable_isas()) {
    ScopedMaxIsa cap(isa);
    const Isa level = usable_isa();
    for (int64_t M : {1, 3, 4, 16, 17}) {
      const auto a = random_s8(M * K, -127, 127, 7);
      const auto x = random_f32(M * K, -1.0f, 1.0f, 8);
      const auto a_scale = random_f32(M, 0.01f, 0.1f, 9);
      std::vector<float> y(M * N);
      RunInfo ran;
      gemv_s8s8f32(a.data(), M, a_scale.data(), w8.view, w_scale.data(), nullptr, y.data(), &ran);
      EXPECT_EQ(ran.kernel, table_choice(gemv_s8_kernels(), GemvS8Problem{a.data(), nullptr, 0, M, w8.view}));
      EXPECT_EQ(ran.kernel, choose_kernel(LinearOp::kS8S8, level, M).kernel);
      linear_f32s8f32(x.data(), M, w8.view, w_scale.data(), nullptr, y.data(), &ran);
      EXPECT_EQ(ran.kernel, table_choice(linear_f32s8_kernels(), LinearF32S8Problem{x.data(), M, w8.view}));
      EXPECT_EQ(ran.kernel, choose_kernel(LinearOp::kF32S8, level, M).kernel);
      lut.run(x.data(), M, y.data(), &ran);
      EXPECT_EQ(ran.kernel, table_choice(lut_linear_kernels(), LutProblem{&lut, x.data(), M, y.data()}));
      EXPECT_EQ(ran.kernel, choose_kernel(LinearOp::kF32Lut, level, M).kernel);
      for (int64_t g : {16, 32, 12}) {  // 12: not a multiple of 8, the fast int4 kernels step aside
        const S4Weights w4 = make_s4(N, K, g, -8, 10);
        gemv_s8s4f32(a.data(), M, a_scale.data(), w4.view, nullptr, y.data(), &ran);
        GemvS4Problem p4;
        p4.m = M;
        p4.w = w4.view;
        EXPECT_EQ(ran.kernel, table_choice(gemv_s4_kernels(), p4)) << g;
        EXPECT_EQ(ran.kernel, choose_kernel(LinearOp::kS8S4, level, M, g).kernel) << g;
        linear_f32s4f32(x.data(), M, w4.view, nullptr, y.data(), &ran);
        EXPECT_EQ(ran.kernel, table_choice(linear_f32s4_kernels(), LinearF32S4Problem{x.data(), M, w4.view}));
        EXPECT_EQ(ran.kernel, choose_kernel(LinearOp::kF32S4, level, M, g).kernel) << g;
      }
    }
  }
}

TEST(KernelChoice, LargeMIsWhereTheTableSwitchesScannedRowByRow) {
  // choose_large_m (the plans' large_m) bisects on the assumption that a table's choice changes
  // at most once above M = 1; a row-by-row scan checks both the point and the assumption, for
  // every op (and the convolution's table, from its smallest chunk) at every compiled level.
  constexpr int64_t kScan = 300;
  for (Isa level : {Isa::kReference, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Vnni}) {
    for (LinearOp op : {LinearOp::kS8S8, LinearOp::kS8S4, LinearOp::kF32S8, LinearOp::kF32S4, LinearOp::kF32Lut,
                        LinearOp::kQ8S8G, LinearOp::kF32S8G}) {
      for (int64_t g : {16, 12}) {
        RunInfo large;
        const int64_t at = choose_large_m(op, level, g, &large);
        const std::string small = choose_kernel(op, level, 1, g).kernel;
        const std::string what = std::string(to_string(op)) + " " + isa_name(level) + " g=" + std::to_string(g);
        for (int64_t m = 2; m <= kScan; ++m) {
          const std::string k = choose_kernel(op, level, m, g).kernel;
          EXPECT_EQ(k, at > 0 && m >= at ? large.kernel : small) << what << " M=" << m << " large_m=" << at;
        }
      }
    }
    for (bool int4 : {false, true}) {
      ConvS8Problem p;
      p.int4 = int4;
      auto choice = [&](int64_t m) {
        p.m = m;
        return std::string(select_kernel(conv_s8_kernels(), p, IsaGate::up_to(level), nullptr).name);
      };
      const ConvChoice plan = choose_conv_kernel(int4, level, 64);
      const std::string small = choice(kMinConvChunkRows);
      for (int64_t m = kMinConvChunkRows; m <= 3 * kOneDnnConvMinRows; m += 7) {
        EXPECT_EQ(choice(m), plan.large_rows > 0 && m >= plan.large_rows ? choice(plan.large_rows) : small)
            << isa_name(level) << " int4=" << int4 << " M=" << m;
      }
      if (plan.large_rows > 0) {
        EXPECT_NE(choice(plan.large_rows - 1), choice(plan.large_rows));
      }
    }
  }
}

TEST(KernelTable, ActivationsHoldingMinus128SkipTheAvx2EntryWithTheReason) {
  if (!isa_usable(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 here";
  ScopedMaxIsa cap(Isa::kAvx2);
  const S8Weights w = make_s8(16, 8, 11);
  std::vector<int8_t> a(8, -128);
  std::vector<int32_t> c(16);
  RunInfo ran;
  gemv_s8s8s32(a.data(), 1, w.view, c.data(), &ran);
  EXPECT_EQ(ran.kernel, "reference");
  EXPECT_NE(ran.fallback.find("gemv_s8s8s32_n16k4_avx2: A contains -128"), std::string::npos) << ran.fallback;
}

TEST(KernelTable, EveryTableEndsWithEntriesThatAlwaysApply) {
  auto check = [](const auto& table) {
    ASSERT_FALSE(table.empty());
    EXPECT_EQ(table.back().isa, Isa::kReference) << table.back().name;
    EXPECT_EQ(table.back().applies, nullptr) << table.back().name;
  };
  check(gemv_s8_kernels());
  check(gemv_s4_kernels());
  check(linear_f32s8_kernels());
  check(linear_f32s4_kernels());
  check(lut_linear_kernels());
  check(conv_s8_kernels());
  check(linear_q8s8_kernels());
  check(linear_q8s4_kernels());
  check(linear_q8s8g_kernels());
  check(linear_f32s8g_kernels());
}

TEST(KernelChoice, CodebookOpEndsAtItsOwnReference) {
  const RunInfo ref = choose_decode_kernel(LinearOp::kF32Lut, Isa::kReference);
  EXPECT_EQ(ref.kernel, "linear_f32lut_reference");
  EXPECT_NE(ref.fallback.find("gemv_f32lut_avx2: "), std::string::npos) << ref.fallback;
  if (isa_compiled(Isa::kAvx2)) {
    EXPECT_EQ(choose_decode_kernel(LinearOp::kF32Lut, Isa::kAvx2).kernel, "gemv_f32lut_avx2");
  }
  if (isa_compiled(Isa::kAvx512)) {
    EXPECT_EQ(choose_decode_kernel(LinearOp::kF32Lut, Isa::kAvx512Vnni).kernel, "gemv_f32lut_avx512");
  }
}

TEST(KernelChoice, SaysWhyEachSkippedCandidateWasSkipped) {
  const RunInfo ref = choose_decode_kernel(LinearOp::kS8S4, Isa::kReference, 16);
  EXPECT_EQ(ref.kernel, "reference");
  EXPECT_NE(ref.fallback.find("gemv_s8s4f32_n16k8_avx2: "), std::string::npos) << ref.fallback;
  const RunInfo odd = choose_decode_kernel(LinearOp::kF32S4, Isa::kAvx512Vnni, 12);
  if (isa_compiled(Isa::kAvx512)) {
    EXPECT_EQ(odd.kernel, "reference");
    EXPECT_NE(odd.fallback.find("group_size=12 not a multiple of 8"), std::string::npos) << odd.fallback;
  }
}

TEST(KernelChoice, WeightOnlyOpsAboveTheThresholdRunTheFloatGemm) {
  for (LinearOp op : {LinearOp::kF32S8, LinearOp::kF32S4, LinearOp::kF32Lut}) {
    EXPECT_NE(choose_kernel(op, Isa::kAvx512Vnni, kWeightOnlyMaxM).kernel, kDequantGemmKernel) << to_string(op);
    const RunInfo large = choose_kernel(op, Isa::kAvx512Vnni, kWeightOnlyMaxM + 1, 32);
    EXPECT_EQ(large.kernel, kDequantGemmKernel) << to_string(op);
    EXPECT_EQ(large.fallback, "") << to_string(op);
  }
}

// Decode-sized scratch is the thread's retained buffer (no allocation once warm); larger
// requests get a buffer of their own, so a thread never keeps more than the cap per slot.
TEST(Workspace, RetainsBuffersUpToTheCapOnly) {
  using detail::Scratch;
  using detail::ScratchArray;
  const float* first = ScratchArray<float>(Scratch::kPaddedInput, 1024).data();
  EXPECT_EQ(ScratchArray<float>(Scratch::kPaddedInput, 512).data(), first);
  EXPECT_EQ(detail::retained_scratch(Scratch::kPaddedInput, detail::kWorkspaceRetainBytes + 1), nullptr);
  {
    const ScratchArray<uint8_t> big(Scratch::kPaddedInput, static_cast<int64_t>(detail::kWorkspaceRetainBytes) + 1);
    EXPECT_NE(static_cast<const void*>(big.data()), static_cast<const void*>(first));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % kPackedAlignment, 0u);
    big.data()[detail::kWorkspaceRetainBytes] = 1;  // the whole request is usable
  }
  EXPECT_EQ(ScratchArray<float>(Scratch::kPaddedInput, 1024).data(), first);
}

// GGUF Q4_0's grid in the n16b32 form: the exact weight-only entries that read it equal
// linear_f32_s4_reference bit for bit, and the large-M entry dequantizes it to the n16k8 form's weight.
TEST(KernelTable, GgufQ4_0OneStreamWeightOnlyEntriesMatchTheirOracles) {
  for (int64_t M : {1, 3, 16, 17, 40}) {
    for (int64_t N : {1, 17, 33}) {
      // K 4, 12, 20: one group shorter than 32 and not a multiple of 8.
      for (int64_t K : {int64_t{4}, int64_t{8}, int64_t{12}, int64_t{20}, int64_t{40}, int64_t{96}, kDeepK}) {
        const uint32_t seed = static_cast<uint32_t>(M * 7 + N * 131 + K * 8191);
        const auto x = random_f32(M * K, -2.0f, 2.0f, seed);
        const auto bias = random_f32(N, -1.0f, 1.0f, seed + 1);
        const S4Weights w4 = make_s4_n16b32(N, K, seed + 2, /*negative_scales=*/(N + K) % 2 == 1);
        std::vector<float> y_ref(M * N), y(M * N);
        linear_f32_s4_reference(x.data(), w4.w.data(), w4.scale.data(), w4.zero.data(), w4.view.group_size,
                                bias.data(), y_ref.data(), M, N, K);
        const LinearF32S4Problem p{x.data(), M, w4.view, bias.data(), y.data()};
        const auto entries = runnable(linear_f32s4_kernels(), p);
        ASSERT_FALSE(entries.empty());
        for (const auto* e : entries) {
          std::fill(y.begin(), y.end(), std::nanf(""));
          e->run(p);
          ASSERT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size())) << e->name << " " << shape(M, N, K);
        }
      }
    }
  }
  const int64_t M = 20, N = 33, K = 72;
  const auto x = random_f32(M * K, -2.0f, 2.0f, 71);
  const S4Weights b32 = make_s4_n16b32(N, K, 72);
  S4Weights k8 = make_s4(N, K, 32, -8, 72);  // the same codes and scales, zero points 0, n16k8
  std::fill(k8.zeros.begin(), k8.zeros.end(), static_cast<int8_t>(kS4B32ZeroCode));
  std::vector<float> y_b32(M * N), y_k8(M * N);
  for (const KernelEntry<LinearF32S4Problem>& e : linear_f32s4_kernels()) {
    if (!is_dequant_gemm(e.name)) continue;
    e.run(LinearF32S4Problem{x.data(), M, b32.view, nullptr, y_b32.data()});
    e.run(LinearF32S4Problem{x.data(), M, k8.view, nullptr, y_k8.data()});
    EXPECT_TRUE(bitwise_equal(y_b32.data(), y_k8.data(), y_k8.size()));
  }
}

}  // namespace
}  // namespace qforge::kernels
