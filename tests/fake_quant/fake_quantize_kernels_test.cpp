// Every vectorised fake-quant kernel reproduces its scalar reference twin.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>

#include "fake_quant/fake_quantize_kernels.h"
#include "framework/core/isa.h"
#include "framework/core/error.h"

using namespace qforge::fq;

namespace {

std::vector<const FakeQuantKernels*> fast_sets() {
  std::vector<const FakeQuantKernels*> out;
  __builtin_cpu_init();
  if (avx512_kernels() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    out.push_back(avx512_kernels());
  if (avx2_kernels() && __builtin_cpu_supports("avx2")) out.push_back(avx2_kernels());
  return out;
}

const std::vector<int64_t> kSizes{1, 2, 3, 5, 7, 8, 9, 10, 15, 16, 17, 31, 32, 33, 63, 64, 65, 255, 256, 257, 4099};

at::Tensor data(int64_t n) {
  at::Tensor x = at::randn({n}) * 4.0;
  if (n > 8) {  // specials: ties, NaN, +-inf, huge
    x[0] = 0.05f;
    x[1] = -0.15f;
    x[2] = NAN;
    x[3] = INFINITY;
    x[4] = -INFINITY;
    x[5] = 3e30f;
  }
  return x;
}

}  // namespace

TEST(FakeQuantKernels, AffineRunMatchesReferenceExactlyForEveryIsa) {
  at::manual_seed(11);
  const auto sets = fast_sets();
  if (sets.empty()) GTEST_SKIP() << "no vectorised kernel set runs on this CPU";
  for (const FakeQuantKernels* k : sets) {
    for (int64_t n : kSizes) {
      const at::Tensor x = data(n);
      const AffineGrid g = make_grid(0.1f, 3.0f, -128.0f, 127.0f);
      std::vector<float> y_ref(n), y(n);
      std::vector<char> m_ref(n), m(n);
      affine_run_reference(x.data_ptr<float>(), y_ref.data(), reinterpret_cast<bool*>(m_ref.data()), n, g);
      k->affine_run(x.data_ptr<float>(), y.data(), reinterpret_cast<bool*>(m.data()), n, g);
      ASSERT_EQ(0, std::memcmp(y.data(), y_ref.data(), n * sizeof(float))) << k->isa << " n=" << n;
      ASSERT_EQ(m, m_ref) << k->isa << " n=" << n;
      std::vector<float> y_nomask(n);
      k->affine_run(x.data_ptr<float>(), y_nomask.data(), nullptr, n, g);
      ASSERT_EQ(0, std::memcmp(y_nomask.data(), y_ref.data(), n * sizeof(float))) << k->isa << " n=" << n;
      // Streaming variant, from an unaligned start so the scalar head runs too.
      std::vector<float> y_nt(n + 1);
      std::vector<char> m_nt(n);
      k->affine_run_stream(x.data_ptr<float>(), y_nt.data() + 1, reinterpret_cast<bool*>(m_nt.data()), n, g);
      ASSERT_EQ(0, std::memcmp(y_nt.data() + 1, y_ref.data(), n * sizeof(float))) << k->isa << " stream n=" << n;
      ASSERT_EQ(m_nt, m_ref) << k->isa << " stream n=" << n;
    }
  }
}

TEST(FakeQuantKernels, AffineRowsMatchesReferenceExactlyForEveryIsa) {
  at::manual_seed(12);
  for (const FakeQuantKernels* k : fast_sets()) {
    for (int64_t C : {1, 3, 8, 16, 17, 33, 64}) {
      const int64_t rows = 5;
      const at::Tensor x = at::randn({rows, C}) * 2.0;
      const at::Tensor s = at::rand({C}) * 0.05 + 0.01;
      const at::Tensor inv = 1.0f / s;
      const at::Tensor z = at::randint(-5, 5, {C}).to(at::kFloat);
      std::vector<float> y_ref(rows * C), y(rows * C);
      std::vector<char> m_ref(rows * C), m(rows * C);
      affine_rows_reference(x.data_ptr<float>(), y_ref.data(), reinterpret_cast<bool*>(m_ref.data()), rows, C,
                            s.data_ptr<float>(), inv.data_ptr<float>(), z.data_ptr<float>(), -8.0f, 7.0f);
      k->affine_rows(x.data_ptr<float>(), y.data(), reinterpret_cast<bool*>(m.data()), rows, C,
                     s.data_ptr<float>(), inv.data_ptr<float>(), z.data_ptr<float>(), -8.0f, 7.0f);
      ASSERT_EQ(0, std::memcmp(y.data(), y_ref.data(), y.size() * sizeof(float))) << k->isa << " C=" << C;
      ASSERT_EQ(m, m_ref) << k->isa << " C=" << C;
    }
  }
}

TEST(FakeQuantKernels, MaskGradAndLsqMatchReference) {
  at::manual_seed(13);
  for (const FakeQuantKernels* k : fast_sets()) {
    for (int64_t n : kSizes) {
      const at::Tensor x = at::randn({n}) * 3.0, dy = at::randn({n});
      const at::Tensor mask = at::rand({n}) > 0.3;
      std::vector<float> dx_ref(n), dx(n);
      mask_grad_reference(dy.data_ptr<float>(), mask.data_ptr<bool>(), dx_ref.data(), n);
      k->mask_grad(dy.data_ptr<float>(), mask.data_ptr<bool>(), dx.data(), n);
      ASSERT_EQ(dx, dx_ref) << k->isa << " n=" << n;
      std::vector<float> dx_nt(n + 3);
      k->mask_grad_stream(dy.data_ptr<float>(), mask.data_ptr<bool>(), dx_nt.data() + 3, n);
      ASSERT_EQ(std::vector<float>(dx_nt.begin() + 3, dx_nt.end()), dx_ref) << k->isa << " stream n=" << n;

      const LsqGrid g{0.05f, 1.0f / 0.05f, 2.0f, -8.0f, 7.0f, 0.01f};
      const LsqSums r = lsq_run_reference(x.data_ptr<float>(), dy.data_ptr<float>(), dx_ref.data(), n, g);
      const LsqSums s = k->lsq_run(x.data_ptr<float>(), dy.data_ptr<float>(), dx.data(), n, g);
      ASSERT_EQ(dx, dx_ref) << k->isa << " n=" << n;
      // Per-element terms are identical; only the summation order differs (float lanes).
      EXPECT_NEAR(s.dscale, r.dscale, 1e-5 * (1.0 + std::abs(r.dscale))) << k->isa << " n=" << n;
      EXPECT_NEAR(s.dzero_point, r.dzero_point, 1e-5 * (1.0 + std::abs(r.dzero_point))) << k->isa << " n=" << n;
    }
  }
}

TEST(FakeQuantKernels, TheOneIsaCapCapsTheChoice) {
  {
    qforge::ScopedMaxIsa cap(qforge::Isa::kReference);
    EXPECT_STREQ(active_kernels().isa, "reference");
  }
  {
    qforge::ScopedMaxIsa cap(qforge::Isa::kAvx2);
    const bool avx2 = avx2_kernels() != nullptr && qforge::cpu_isa() >= qforge::Isa::kAvx2;
    EXPECT_STREQ(active_kernels().isa, avx2 ? "avx2" : "reference");
  }
  EXPECT_THROW(qforge::set_max_isa("sse9"), qforge::Error);
}
