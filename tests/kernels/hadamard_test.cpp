// The Hadamard transform against an explicit matrix built here independently (Sylvester's
// (-1)^popcount(a & b) entries ⊗ a Paley matrix from Euler's criterion), checked H·Hᵀ = n·I;
// every kernel-table entry against the reference bit for bit; orthogonality and involution;
// unsupported sizes refused with the nearest supported ones named.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/hadamard.h"
#include "kernels/cpu/hadamard_tensor.h"

namespace qforge::kernels {
namespace {

using testing::bitwise_equal;
using testing::machine_has;
using testing::random_f32;

int64_t pow_mod(int64_t b, int64_t e, int64_t q) {
  int64_t r = 1;
  for (b %= q; e > 0; e >>= 1, b = b * b % q) {
    if (e & 1) r = r * b % q;
  }
  return r;
}

// Legendre symbol by Euler's criterion (the kernel uses a table of squares).
int legendre(int64_t a, int64_t q) {
  a = ((a % q) + q) % q;
  if (a == 0) return 0;
  return pow_mod(a, (q - 1) / 2, q) == 1 ? 1 : -1;
}

bool prime(int64_t q) {
  for (int64_t d = 2; d * d <= q; ++d) {
    if (q % d == 0) return false;
  }
  return q >= 2;
}

// Paley I (q = m - 1 ≡ 3 mod 4, preferred) or II (q = m/2 - 1 ≡ 1 mod 4), written from the
// textbook definitions: I + [[0, 1ᵀ], [-1, Q]]; the conference matrix [[0, 1ᵀ], [1, Q]] with
// 0 -> [[1, -1], [-1, -1]] and ±1 -> ±[[1, 1], [1, -1]].
std::vector<int> paley(int64_t m) {
  std::vector<int> P(static_cast<size_t>(m * m));
  const bool one = prime(m - 1) && (m - 1) % 4 == 3;
  const int64_t q = one ? m - 1 : m / 2 - 1;
  auto core = [&](int64_t i, int64_t j) {  // the (q + 1)-order core, index 0 the bordering row
    if (i == 0 && j == 0) return 0;
    if (i == 0) return 1;
    if (j == 0) return one ? -1 : 1;
    return legendre(j - i, q);
  };
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      if (one) {
        P[static_cast<size_t>(i * m + j)] = core(i, j) + (i == j ? 1 : 0);
      } else {
        const int c = core(i / 2, j / 2);
        const int di = static_cast<int>(i % 2), dj = static_cast<int>(j % 2);
        const int zero_block = (di == 0 && dj == 0) ? 1 : -1;
        const int one_block = (di == 1 && dj == 1) ? -1 : 1;
        P[static_cast<size_t>(i * m + j)] = c == 0 ? zero_block : c * one_block;
      }
    }
  }
  return P;
}

// Entry (i, j) of S_{2^k} ⊗ P for n = 2^k · m.
int entry(const std::vector<int>& P, int64_t m, int64_t i, int64_t j) {
  const int sylvester = __builtin_popcountll(static_cast<uint64_t>((i / m) & (j / m))) % 2 == 0 ? 1 : -1;
  return sylvester * (m == 1 ? 1 : P[static_cast<size_t>((i % m) * m + j % m)]);
}

struct Explicit {
  int64_t n, m;
  std::vector<int> P;
  explicit Explicit(int64_t size) : n(size), m(hadamard_size(size).m), P(m > 1 ? paley(m) : std::vector<int>{1}) {}
  int at(int64_t i, int64_t j) const { return entry(P, m, i, j); }
  // H·x / sqrt(n) in double.
  std::vector<double> apply(const float* x) const {
    std::vector<double> y(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      double acc = 0.0;
      for (int64_t j = 0; j < n; ++j) acc += at(i, j) * static_cast<double>(x[j]);
      y[static_cast<size_t>(i)] = acc / std::sqrt(static_cast<double>(n));
    }
    return y;
  }
};

// Float error bound of one output: each is a signed sum of all n inputs done in log2(pow2)
// butterfly levels plus m sequential adds, then one scaling: (levels + m + 1) · eps · sum|x| / sqrt(n).
double error_bound(const float* x, int64_t n) {
  const HadamardSize s = hadamard_size(n);
  double l1 = 0.0;
  for (int64_t j = 0; j < n; ++j) l1 += std::fabs(x[j]);
  return (std::log2(static_cast<double>(s.pow2)) + static_cast<double>(s.m) + 1.0) * 1.19209290e-7 * l1 /
         std::sqrt(static_cast<double>(n));
}

void expect_matches_explicit(int64_t n, int64_t rows, uint32_t seed) {
  const Explicit H(n);
  std::vector<float> x = random_f32(static_cast<size_t>(rows * n), -2.0f, 2.0f, seed);
  std::vector<float> y = x;
  hadamard_transform(y.data(), rows, n);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<double> want = H.apply(x.data() + r * n);
    const double tol = error_bound(x.data() + r * n, n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(y[static_cast<size_t>(r * n + i)], want[static_cast<size_t>(i)], tol) << "n=" << n << " row " << r << " i " << i;
    }
  }
}

TEST(HadamardMatrix, PaleyBaseMatricesAreHadamardAndMatchTheTextbookConstruction) {
  for (int64_t m : {12, 20, 24, 28, 36, 44, 60, 76, 148}) {
    const std::vector<int> P = paley(m);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        int dot = 0;
        for (int64_t k = 0; k < m; ++k) dot += P[static_cast<size_t>(i * m + k)] * P[static_cast<size_t>(j * m + k)];
        ASSERT_EQ(dot, i == j ? m : 0) << "m=" << m << " (" << i << ", " << j << ")";
      }
    }
    const float* B = hadamard_base_matrix(m);
    for (int64_t k = 0; k < m * m; ++k) ASSERT_EQ(B[k], static_cast<float>(P[static_cast<size_t>(k)])) << "m=" << m;
  }
}

TEST(HadamardMatrix, SizesDecomposeWithTheSmallestBase) {
  EXPECT_EQ(hadamard_size(14336).pow2, 512);  // Llama-3-8B's FFN
  EXPECT_EQ(hadamard_size(14336).m, 28);
  EXPECT_EQ(hadamard_size(896).m, 28);    // Qwen2-0.5B hidden
  EXPECT_EQ(hadamard_size(4864).m, 76);   // its FFN
  EXPECT_EQ(hadamard_size(18944).m, 148); // Qwen2-7B FFN
  EXPECT_EQ(hadamard_size(4096).m, 1);
  EXPECT_EQ(hadamard_size(24).m, 12);
}

TEST(HadamardMatrix, ExplicitKroneckerMatricesAreHadamard) {
  for (int64_t n : {8, 12, 24, 28, 56, 96, 148, 224}) {
    const Explicit H(n);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        int64_t dot = 0;
        for (int64_t k = 0; k < n; ++k) dot += H.at(i, k) * H.at(j, k);
        ASSERT_EQ(dot, i == j ? n : 0) << "n=" << n;
      }
    }
  }
}

TEST(HadamardTransform, EqualsTheExplicitMatrixAtSeveralSizes) {
  uint32_t seed = 1;
  for (int64_t n : {1, 2, 4, 8, 16, 32, 64, 256, 12, 20, 24, 48, 96, 768, 28, 56, 448, 76, 148, 296}) {
    expect_matches_explicit(n, 3, seed++);
  }
}

TEST(HadamardTransform, EqualsTheExplicitMatrixAtLlama3FfnSize14336) { expect_matches_explicit(14336, 1, 7); }

TEST(HadamardTransform, EveryTableEntryEqualsTheReferenceBitForBit) {
  uint32_t seed = 100;
  for (int64_t n : {1, 2, 4, 8, 16, 32, 64, 128, 4096, 12, 24, 48, 192, 20, 28, 56, 112, 448, 76, 148, 14336}) {
    for (int64_t rows : {1, 3, 5}) {
      const std::vector<float> x = random_f32(static_cast<size_t>(rows * n), -3.0f, 3.0f, seed++);
      for (bool transpose : {false, true}) {
        std::vector<float> want = x;
        hadamard_transform_reference(want.data(), rows, n, transpose);
        for (const KernelEntry<HadamardProblem>& e : hadamard_kernels()) {
          if (!machine_has(e.isa)) continue;
          std::vector<float> got = x;
          e.run(HadamardProblem{got.data(), rows, n, transpose});
          EXPECT_TRUE(bitwise_equal(got.data(), want.data(), got.size()))
              << e.name << " n=" << n << " rows=" << rows << " transpose=" << transpose;
        }
      }
    }
  }
}

TEST(HadamardTransform, PreservesNormsAndInnerProductsAndSymmetricOnesAreInvolutions) {
  for (int64_t n : {64, 12, 28, 76, 448, 14336}) {
    std::vector<float> x = random_f32(static_cast<size_t>(2 * n), -1.0f, 1.0f, 11);
    std::vector<float> y = x;
    hadamard_transform(y.data(), 2, n);
    double xx = 0, yy = 0, xz = 0, yz = 0;
    for (int64_t i = 0; i < n; ++i) {
      xx += double{x[i]} * x[i];
      yy += double{y[i]} * y[i];
      xz += double{x[i]} * x[n + i];
      yz += double{y[i]} * y[n + i];
    }
    EXPECT_NEAR(yy, xx, 1e-5 * xx) << "n=" << n;
    EXPECT_NEAR(yz, xz, 1e-5 * xx) << "n=" << n;
    // Sylvester and Paley II matrices are symmetric, so the orthonormal transform is its own inverse.
    if (hadamard_size(n).m == 1 || hadamard_size(n).m == 28 || hadamard_size(n).m == 76) {
      hadamard_transform(y.data(), 2, n);
      for (int64_t i = 0; i < 2 * n; ++i) ASSERT_NEAR(y[i], x[i], 1e-5) << "n=" << n << " i=" << i;
    }
  }
}

TEST(HadamardTransform, TransposeIsTheInverseAndEqualsTheExplicitTranspose) {
  for (int64_t n : {12, 20, 28, 60, 148, 192, 14336}) {
    const std::vector<float> x = random_f32(static_cast<size_t>(2 * n), -1.0f, 1.0f, 21);
    std::vector<float> y = x;
    hadamard_transform(y.data(), 2, n);
    hadamard_transform(y.data(), 2, n, /*transpose=*/true);
    for (int64_t i = 0; i < 2 * n; ++i) ASSERT_NEAR(y[i], x[i], 1e-5) << "n=" << n << " i=" << i;
  }
  const Explicit H(60);  // Paley I: not symmetric, so the transpose differs
  const std::vector<float> x = random_f32(60, -1.0f, 1.0f, 22);
  std::vector<float> y = x;
  hadamard_transform(y.data(), 1, 60, /*transpose=*/true);
  for (int64_t i = 0; i < 60; ++i) {
    double want = 0.0;
    for (int64_t j = 0; j < 60; ++j) want += H.at(j, i) * static_cast<double>(x[j]);
    ASSERT_NEAR(y[i], want / std::sqrt(60.0), error_bound(x.data(), 60)) << i;
  }
}

// H / sqrt(n) as a float64 tensor.
at::Tensor orthonormal_matrix(int64_t n) {
  const Explicit H(n);
  at::Tensor Hm = at::empty({n, n}, at::kDouble);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) Hm[i][j] = H.at(i, j) / std::sqrt(static_cast<double>(n));
  }
  return Hm;
}

TEST(HadamardRotate, TensorOpAndItsGradientEqualTheExplicitMatrix) {
  const int64_t n = 60;  // Paley I, not symmetric: the backward must use the other direction
  const at::Tensor Hm = orthonormal_matrix(n);
  at::manual_seed(5);
  const at::Tensor x = at::randn({2, 3, n}).set_requires_grad(true);
  const at::Tensor g = at::randn({2, 3, n});
  const at::Tensor y = hadamard_rotate(x);
  y.backward(g);
  const at::Tensor want_y = at::matmul(x.detach().to(at::kDouble), Hm.t());
  const at::Tensor want_dx = at::matmul(g.to(at::kDouble), Hm);
  EXPECT_LT((y.detach().to(at::kDouble) - want_y).abs().max().item<double>(), 1e-5);
  EXPECT_LT((x.grad().to(at::kDouble) - want_dx).abs().max().item<double>(), 1e-5);
  const at::Tensor back = hadamard_rotate(y.detach(), /*transpose=*/true);
  EXPECT_LT((back - x.detach()).abs().max().item<double>(), 1e-5);
  // bf16 in, bf16 out: the float transform of the rounded input, rounded once (relative error <= 2^-9).
  const at::Tensor xb = x.detach().to(at::kBFloat16);
  const at::Tensor h = hadamard_rotate(xb);
  EXPECT_EQ(h.scalar_type(), at::kBFloat16);
  const at::Tensor hf = at::matmul(xb.to(at::kDouble), Hm.t());
  EXPECT_TRUE(((h.to(at::kDouble) - hf).abs() <= hf.abs() * std::ldexp(1.0, -8) + 1e-6).all().item<bool>());
  EXPECT_LT((h.to(at::kDouble) - want_y).abs().max().item<double>(), std::ldexp(1.0, -6) * want_y.abs().max().item<double>());
  EXPECT_THROW(hadamard_rotate(at::ones({2, 100})), Error);
  EXPECT_THROW(hadamard_rotate(at::ones({2, 64}, at::kInt)), Error);
}

// L = sum_r <w, H x_r / sqrt(n)>^2 has dL/dx_r = 2 (a·x_r) a with a = Hᵀw / sqrt(n), so
// d/dx_r <g_r, dL/dx_r> = 2 (a·g_r) a: right only if the backward's own backward applies H too.
TEST(HadamardRotate, DoubleBackwardEqualsTheExplicitSecondDerivative) {
  const int64_t n = 60;  // Paley I, not symmetric
  const at::Tensor Hm = orthonormal_matrix(n);
  at::manual_seed(6);
  const at::Tensor x = at::randn({3, n}).set_requires_grad(true);
  const at::Tensor w = at::randn({n});
  const at::Tensor g = at::randn({3, n});
  const at::Tensor loss = at::matmul(hadamard_rotate(x), w).pow(2).sum();
  const at::Tensor dx = torch::autograd::grad({loss}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  const at::Tensor d2 = torch::autograd::grad({(dx * g).sum()}, {x})[0];
  const at::Tensor a = at::matmul(Hm.t(), w.to(at::kDouble));
  const at::Tensor want_dx = 2.0 * at::matmul(x.detach().to(at::kDouble), a).unsqueeze(1) * a.unsqueeze(0);
  const at::Tensor want_d2 = 2.0 * at::matmul(g.to(at::kDouble), a).unsqueeze(1) * a.unsqueeze(0);
  EXPECT_LT((dx.detach().to(at::kDouble) - want_dx).abs().max().item<double>(), 1e-5 * want_dx.abs().max().item<double>());
  EXPECT_LT((d2.to(at::kDouble) - want_d2).abs().max().item<double>(), 1e-5 * want_d2.abs().max().item<double>());
}

TEST(HadamardTransform, DispatcherNamesTheTableChoiceAtEachCap) {
  std::vector<float> x = random_f32(28 * 4, -1.0f, 1.0f, 3);
  for (Isa cap : {Isa::kAvx512Vnni, Isa::kAvx2, Isa::kReference}) {
    ScopedMaxIsa scoped(cap);
    RunInfo info;
    hadamard_transform(x.data(), 4, 28, /*transpose=*/false, &info);
    const char* want = "hadamard_f32_reference";
    if (isa_usable(Isa::kAvx512)) {
      want = "hadamard_f32_avx512";
    } else if (isa_usable(Isa::kAvx2)) {
      want = "hadamard_f32_avx2";
    }
    EXPECT_EQ(info.kernel, want) << "cap " << isa_name(cap);
  }
}

TEST(HadamardTransform, UnsupportedSizesNameTheNearestSupportedOnes) {
  std::vector<float> x(100, 1.0f);
  const std::vector<float> before = x;
  try {
    hadamard_transform(x.data(), 1, 100);
    FAIL() << "size 100 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("size 100"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nearest supported sizes: 96 and 104"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(": 12, 20, 24, 28, 36, 44, 48, 60, ..."), std::string::npos) << e.what();
  }
  EXPECT_EQ(x, before);  // refused before touching the data
  EXPECT_THROW(hadamard_size(0), Error);
  EXPECT_THROW(hadamard_base_matrix(16), Error);  // 15 is not prime, 16 / 2 - 1 = 7 is not 1 mod 4
  EXPECT_NO_THROW(hadamard_base_matrix(8));       // 7 + 1: Paley I, though sizes use m = 1 for it
  EXPECT_FALSE(hadamard_supported(52));  // 13 · 4: neither 52 nor 26 nor 13 is a Paley order
  EXPECT_TRUE(hadamard_supported(14336));
  // Near the int64 limits: no overflow, and the nearest sizes found without a walk over 2^60 values.
  const int64_t big = int64_t{1} << 62;
  EXPECT_EQ(hadamard_size(big).pow2, big);
  EXPECT_EQ(hadamard_size(3 * (big / 4)).m, 12);  // 12 · 2^58 = 3 · 2^60
  const auto message = [](int64_t n) {
    try {
      hadamard_size(n);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(std::numeric_limits<int64_t>::max()).find("none larger in int64"), std::string::npos);
  EXPECT_NE(message(big - 1).find(" and 4611686018427387904"), std::string::npos) << message(big - 1);
  // Above 2^62 + 1: 516 · 2^53 (Paley II, q = 257), the first base order past 512.
  EXPECT_NE(message(big + 1).find("sizes: 4611686018427387904 and 4647714815446351872"), std::string::npos)
      << message(big + 1);
}

}  // namespace
}  // namespace qforge::kernels
