// choose_decode_kernel names the kernel the dispatchers really run for M = 1, at every ISA level
// this machine has (and at every cap below it), for each op and for group sizes that do and do
// not fit the 4-bit kernels.
#include "kernels/cpu/kernel_choice.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "kernels/cpu/lut_linear.h"
#include "kernels/cpu/packed_linear.h"

namespace qforge::kernels {
namespace {

TEST(KernelChoice, AgreesWithTheDispatchersAtEveryUsableLevel) {
  at::manual_seed(3);
  constexpr int64_t N = 32, K = 48;
  const at::Tensor w8 = at::randint(-127, 128, {N, K}, at::kChar);
  const at::Tensor w4 = at::randint(-8, 8, {N, K}, at::kChar);
  const at::Tensor x = at::randn({1, K});
  const PackedLinearS8 s8(w8, at::rand({N}) + 0.01);
  const PackedLinearLut lut(at::randint(0, 16, {N, K}).to(at::kByte), at::randn({N, 1, 16}), K, 4);
  for (Isa isa : testing::usable_isas()) {
    ScopedMaxIsa cap(isa);
    const Isa level = usable_isa();
    RunInfo ran;
    s8.run(x, &ran);
    EXPECT_EQ(ran.kernel, choose_decode_kernel(LinearOp::kS8S8, level).kernel) << isa_name(isa);
    s8.run_weight_only(x, &ran);
    EXPECT_EQ(ran.kernel, choose_decode_kernel(LinearOp::kF32S8, level).kernel) << isa_name(isa);
    lut.run(x, &ran);
    EXPECT_EQ(ran.kernel, choose_decode_kernel(LinearOp::kF32Lut, level).kernel) << isa_name(isa);
    for (int64_t group : {16, 12}) {  // 12: not a multiple of 8, the reference runs
      // Group scales are stored as fp16: give exactly representable ones.
      const at::Tensor scale = (at::rand({N, K / group}) + 0.01).to(at::kHalf).to(at::kFloat);
      const PackedLinearS4 s4(w4, scale, {}, group, {}, qint4);
      s4.run(x, &ran);
      EXPECT_EQ(ran.kernel, choose_decode_kernel(LinearOp::kS8S4, level, group).kernel)
          << isa_name(isa) << " group " << group;
      s4.run_weight_only(x, &ran);
      EXPECT_EQ(ran.kernel, choose_decode_kernel(LinearOp::kF32S4, level, group).kernel)
          << isa_name(isa) << " group " << group;
    }
  }
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

}  // namespace
}  // namespace qforge::kernels
