// Small-M int8 x int4 kernels (n16k8 layout, per-group scales): bit-exact with the reference.
#include <gtest/gtest.h>

#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/gemv_s4.h"
#include "kernels/cpu/reference.h"
#include "kernel_test_util.h"

using namespace qforge::kernels;
using namespace qforge::kernels::testing;

namespace {

struct Case {
  int64_t M, N, K, group_size;
  int qmin;
  bool zero_points;
  float scale_lo = 0.001f, scale_hi = 0.2f;
};

struct PackedS4Weights {
  std::vector<uint8_t> data;
  std::vector<Fp16Bits> scales;
  std::vector<int8_t> zeros;
  S4N16K8View view;
};

// Runs one case with the ISA capped at `isa`; returns the kernel name.
std::string check_case(const Case& c, Isa isa) {
  ScopedMaxIsa cap(isa);
  const uint32_t seed = static_cast<uint32_t>(c.M * 7 + c.N * 131 + c.K * 8191 + c.group_size);
  const int64_t G = num_groups(c.K, c.group_size);
  const auto A = random_s8(c.M * c.K, -127, 127, seed);
  const auto W = random_s8(c.N * c.K, c.qmin, c.qmin + 15, seed + 1);
  const auto a_scale = random_f32(c.M, 0.001f, 0.05f, seed + 2);
  const auto w_scale = random_f16_exact(c.N * G, c.scale_lo, c.scale_hi, seed + 3);
  const auto bias = random_f32(c.N, -1.0f, 1.0f, seed + 4);
  std::vector<int32_t> zero(c.N * G, 0);
  if (c.zero_points) {
    const auto z = random_s8(c.N * G, c.qmin, c.qmin + 15, seed + 5);
    zero.assign(z.begin(), z.end());
  }
  PackedS4Weights p;
  const int64_t np = round_up(c.N, 16), kp = round_up(c.K, 8);
  p.data.resize(np * kp / 2);
  p.scales.resize(np * G);
  p.zeros.resize(np * G);
  pack_s4_n16k8_reference(W.data(), c.N, c.K, c.qmin, p.data.data());
  pack_s4_group_meta(w_scale.data(), c.zero_points ? zero.data() : nullptr, c.N, G, c.qmin,
                     p.scales.data(), p.zeros.data());
  p.view = {p.data.data(), p.scales.data(), p.zeros.data(), c.N, c.K, kp, c.group_size, G};

  std::vector<float> y_ref(c.M * c.N), y(c.M * c.N);
  gemm_s8s4f32_reference(A.data(), a_scale.data(), W.data(), w_scale.data(),
                         c.zero_points ? zero.data() : nullptr, c.group_size, bias.data(),
                         y_ref.data(), c.M, c.N, c.K);
  RunInfo info;
  gemv_s8s4f32(A.data(), c.M, a_scale.data(), p.view, bias.data(), y.data(), &info);
  EXPECT_TRUE(bitwise_equal(y.data(), y_ref.data(), y.size()))
      << info.kernel << " M=" << c.M << " N=" << c.N << " K=" << c.K << " g=" << c.group_size
      << " qmin=" << c.qmin << " zp=" << c.zero_points;
  return info.kernel;
}

// `expected(M)`: the kernel name the dispatcher must pick for M rows.
template <typename Expected>
void sweep_at(Isa isa, Expected expected) {
  for (int64_t M : sweep_rows()) {
    for (int64_t N : sweep_sizes()) {
      for (int64_t K : sweep_sizes()) {
        for (int64_t g : {int64_t{8}, int64_t{32}, K}) {
          if (g % 8 != 0) continue;
          const bool zp = (N + K) % 2 == 0;
          const int qmin = zp ? 0 : -8;
          ASSERT_EQ(check_case({M, N, K, g, qmin, zp}, isa), expected(M));
        }
      }
      for (int64_t g : {int64_t{32}, int64_t{128}, kDeepK}) {
        check_case({M, N, kDeepK, g, -8, true}, isa);
      }
    }
  }
}

}  // namespace

TEST(GemvS4, Avx512VnniMatchesReferenceExactly) {
  if (!isa_usable(Isa::kAvx512Vnni)) GTEST_SKIP() << "no AVX-512 VNNI here";
  sweep_at(Isa::kAvx512Vnni, [](int64_t M) {
    return M >= 4 ? "gemm_s8s4f32_n16k8_avx512vnni" : "gemv_s8s4f32_n16k8_avx512vnni";
  });
}

TEST(GemvS4, Avx2MatchesReferenceExactly) {
  if (!isa_usable(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 here";
  sweep_at(Isa::kAvx2, [](int64_t) { return "gemv_s8s4f32_n16k8_avx2"; });
}

TEST(GemvS4, LargeMPanelKernelMatchesReferenceExactly) {
  if (!isa_usable(Isa::kAvx512Vnni)) GTEST_SKIP() << "no AVX-512 VNNI here";
  for (int64_t M : {4, 5, 33, 130}) {
    for (auto [N, K, g] : {std::tuple<int64_t, int64_t, int64_t>{65, 264, 32}, {16, 64, 64},
                           {100, 1000, 128}, {1, 8, 8}}) {
      EXPECT_EQ(check_case({M, N, K, g, 0, true}, Isa::kAvx512Vnni), "gemm_s8s4f32_n16k8_avx512vnni");
      check_case({M, N, K, g, -8, false}, Isa::kAvx512Vnni);
    }
  }
}

TEST(GemvS4, CappedToReferenceRunsReference) {
  for (int64_t M : {1, 3}) {
    for (int64_t K : {5, 16, 33}) EXPECT_EQ(check_case({M, 9, K, 8, -8, true}, Isa::kReference), "reference");
  }
}

TEST(GemvS4, GroupSizeNotMultipleOf8FallsBackToReferenceWithReason) {
  ScopedMaxIsa cap(max_isa());
  EXPECT_EQ(check_case({2, 17, 36, 12, 0, true}, max_isa()), "reference");
  RunInfo info;
  const std::vector<int8_t> A(12, 1);
  const float a_scale = 1.0f;
  std::vector<uint8_t> data(16 * 16 / 2);
  std::vector<Fp16Bits> scales(16);
  std::vector<int8_t> zeros(16);
  std::vector<float> y(1);
  const S4N16K8View v{data.data(), scales.data(), zeros.data(), 1, 12, 16, 12, 1};
  gemv_s8s4f32(A.data(), 1, &a_scale, v, nullptr, y.data(), &info);
  EXPECT_EQ(info.kernel, "reference");
  if (isa_usable(Isa::kAvx2)) {
    EXPECT_NE(info.fallback.find("group_size=12 not a multiple of 8"), std::string::npos)
        << info.fallback;
  }
}

TEST(GemvS4, InconsistentViewThrows) {
  std::vector<uint8_t> data(64);
  std::vector<Fp16Bits> scales(16);
  std::vector<int8_t> zeros(16);
  const std::vector<int8_t> A(8);
  const float a_scale = 1.0f;
  std::vector<float> y(1);
  const S4N16K8View wrong_groups{data.data(), scales.data(), zeros.data(), 1, 8, 8, 4, 1};
  EXPECT_THROW(gemv_s8s4f32(A.data(), 1, &a_scale, wrong_groups, nullptr, y.data()), qforge::Error);
  const S4N16K8View ok{data.data(), scales.data(), zeros.data(), 1, 8, 8, 8, 1};
  EXPECT_THROW(gemv_s8s4f32(nullptr, 1, &a_scale, ok, nullptr, y.data()), qforge::Error);
}

TEST(GemvS4, Fp16SubnormalScalesStayExactOnEveryKernel) {
  // fp16 subnormals (< 2^-14) widen to normal floats: VCVTPH2PS must not flush them.
  for (Isa isa : usable_isas()) {
    for (int64_t M : {1, 5}) {
      check_case({M, 33, 64, 32, -8, false, 1e-7f, 6e-5f}, isa);
      check_case({M, 33, 64, 32, 0, true, 1e-7f, 6e-5f}, isa);
    }
  }
}

TEST(PackS4GroupMeta, StoresFp16AndUnpacksTheSameFloats) {
  const int64_t N = 19, G = 3, np = round_up(N, 16);
  const auto w_scale = random_f16_exact(N * G, -1.0f, 1.0f, 7);
  std::vector<Fp16Bits> scales(np * G, 0xFFFF);
  std::vector<int8_t> zeros(np * G, -1);
  pack_s4_group_meta(w_scale.data(), nullptr, N, G, -8, scales.data(), zeros.data());
  EXPECT_EQ(scales[(1 * G + 0) * 16 + 0], static_cast<Fp16Bits>(c10::Half(w_scale[16 * G]).x));
  EXPECT_EQ(scales[(1 * G + 2) * 16 + 15], 0);  // padding column
  std::vector<float> back(N * G);
  std::vector<int32_t> codes(N * G);
  unpack_s4_group_meta(scales.data(), zeros.data(), N, G, back.data(), codes.data());
  EXPECT_TRUE(bitwise_equal(back.data(), w_scale.data(), back.size()));
  EXPECT_TRUE(exact_equal(codes, std::vector<int32_t>(N * G, 8)));

  std::vector<float> bad = w_scale;
  bad[5 * G + 1] = 0.3f;
  try {
    pack_s4_group_meta(bad.data(), nullptr, N, G, -8, scales.data(), zeros.data());
    ADD_FAILURE() << "0.3f is not an fp16 value";
  } catch (const qforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("w_scale[5, 1]"), std::string::npos) << e.what();
  }
}
