// cuda_kernels_test: every CUDA kernel of kernels/cuda and fake_quant/cuda on a real GPU against
// the CPU reference kernels that define its result (kernels/cpu/reference.h,
// fake_quant/fake_quantize_kernels.h), bit for bit. Outputs are poisoned before each run and
// every element is compared, so an unwritten element fails. No LibTorch: this builds in the
// CUDA-only configuration too (scripts/gpu-check). Without a GPU every test fails at set-up
// (it is labelled "gpu" and only scripts/gpu-check runs it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fake_quant/cuda/fake_quantize_cuda.h"
#include "fake_quant/cuda/lsq_backward_cuda.h"
#include "fake_quant/fake_quantize_kernels.h"
#include "framework/core/error.h"
#include "kernels/cpu/reference.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequantize_s32_f32_cuda.h"
#include "kernels/cuda/dequantize_s4_cuda.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemv_f32s4_cuda.h"
#include "kernels/cuda/gemv_f32s4_mma_cuda.h"
#include "kernels/cuda/gemv_f32s8_cuda.h"
#include "kernels/cuda/gemv_s4_rules.h"
#include "kernels/cuda/gemv_s8_rules.h"
#include "kernels/cuda/gemm_s8s8s32_cuda.h"
#include "kernels/cuda/linear_s8_fused_cuda.h"
#include "kernels/cuda/quantize_rows_s8_cuda.h"
#include "kernels/cuda/unpack_s4_math.h"

namespace qforge::cuda {
namespace {

using kernels::ActScale;
using kernels::RunInfo;

// ---- host <-> device helpers ----

template <class T>
DeviceBuffer<T> upload(const std::vector<T>& h) {
  DeviceBuffer<T> d(h.size());
  if (!h.empty()) check_cuda(cudaMemcpy(d.get(), h.data(), d.bytes(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  return d;
}

template <class T>
std::vector<T> download(const DeviceBuffer<T>& d) {
  std::vector<T> h(d.size());
  check_cuda(cudaDeviceSynchronize(), "kernel");
  if (!h.empty()) check_cuda(cudaMemcpy(h.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return h;
}

// Bools as bytes (std::vector<bool> has no contiguous storage); poisoned bytes stay visible.
std::vector<uint8_t> download_mask(const DeviceBuffer<bool>& d) {
  std::vector<uint8_t> h(d.size());
  check_cuda(cudaDeviceSynchronize(), "kernel");
  if (!h.empty()) check_cuda(cudaMemcpy(h.data(), d.get(), d.size(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return h;
}

// Fills device memory with a byte pattern (0xFF: NaN floats, -1 ints, true bools) so an element
// a kernel does not write differs from any reference value.
template <class T>
void poison(DeviceBuffer<T>& d, int byte = 0xFF) {
  if (d.size() > 0) check_cuda(cudaMemset(d.get(), byte, d.bytes()), "cudaMemset");
}

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// Equal bit patterns; a NaN matches any NaN (the formulas keep NaN a NaN, but the payload and
// sign of a NaN are not part of them: the GPU's arithmetic returns the canonical NaN, x86 the
// operand's).
::testing::AssertionResult same_floats(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (bits(got[i]) != bits(want[i]))
      return ::testing::AssertionFailure() << "element " << i << ": GPU " << got[i] << " vs reference " << want[i];
  }
  return ::testing::AssertionSuccess();
}

template <class T>
::testing::AssertionResult same_values(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i])
      return ::testing::AssertionFailure() << "element " << i << ": GPU " << +got[i] << " vs reference " << +want[i];
  }
  return ::testing::AssertionSuccess();
}

// Random floats spread over [-range, range], with exact grid ties (k + 0.5) * scale, zeros,
// values far outside the grid and, when asked, NaN / +-Inf.
std::vector<float> random_floats(int64_t n, float range, uint32_t seed, float tie_scale = 0.0f,
                                 bool nonfinite = false) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-range, range);
  std::uniform_int_distribution<int> pick(0, 31);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    const int p = pick(rng);
    if (p == 0 && tie_scale > 0.0f) {
      x = (std::floor(u(rng) / tie_scale) + 0.5f) * tie_scale;
    } else if (p == 1) {
      x = 0.0f;
    } else if (p == 2) {
      x = u(rng) * 1000.0f;
    } else if (p == 3 && nonfinite) {
      const float specials[] = {NAN, INFINITY, -INFINITY};
      x = specials[rng() % 3];
    } else {
      x = u(rng);
    }
  }
  return v;
}

std::vector<int8_t> random_s8(int64_t n, uint32_t seed, int lo = -128, int hi = 127) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(lo, hi);
  std::vector<int8_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int8_t>(u(rng));
  return v;
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    ASSERT_TRUE(e == cudaSuccess && count > 0)
        << "cuda_kernels_test needs a CUDA GPU (" << cudaGetErrorString(e) << "); scripts/gpu-check runs it on one";
  }
};

// ---- fake quantization ----

struct GridCase {
  const char* name;
  float scale, zero_point, qmin, qmax;
};
const GridCase kGrids[] = {
    {"qint8 symmetric", 0.0173f, 0.0f, -128.0f, 127.0f},
    {"quint8 affine", 0.0291f, 131.0f, 0.0f, 255.0f},
    {"qint4 symmetric", 0.21f, 0.0f, -8.0f, 7.0f},
    {"qint2", 0.7f, 0.0f, -2.0f, 1.0f},
};

TEST_F(Gpu, FakeQuantizePerTensorMatchesReference) {
  for (const int64_t n : {int64_t{1}, int64_t{257}, int64_t{1} << 20, (int64_t{1} << 20) + 13}) {
    for (const GridCase& c : kGrids) {
      SCOPED_TRACE(std::string(c.name) + " n=" + std::to_string(n));
      const fq::AffineGrid g = fq::make_grid(c.scale, c.zero_point, c.qmin, c.qmax);
      const std::vector<float> x = random_floats(n, 4.0f, 11u + static_cast<uint32_t>(n), c.scale, true);
      std::vector<float> want(x.size());
      std::unique_ptr<bool[]> want_mask(new bool[x.size()]);
      fq::affine_run_reference(x.data(), want.data(), want_mask.get(), n, g);

      auto dx = upload(x);
      DeviceBuffer<float> dy(x.size());
      DeviceBuffer<bool> dmask(x.size());
      poison(dy);
      poison(dmask, 0x02);  // neither true (1) nor false (0)
      check_cuda(fake_quantize_per_tensor(dx.get(), dy.get(), dmask.get(), n, g, nullptr), "fake_quantize_per_tensor");
      EXPECT_TRUE(same_floats(download(dy), want));
      const auto mask = download_mask(dmask);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(static_cast<int>(mask[i]), static_cast<int>(want_mask[i])) << "mask element " << i;

      // Without a mask (inference): same values.
      poison(dy);
      check_cuda(fake_quantize_per_tensor(dx.get(), dy.get(), nullptr, n, g, nullptr), "fake_quantize_per_tensor");
      EXPECT_TRUE(same_floats(download(dy), want));
      // Pointers off the 16-byte grid take the one-element path.
      if (n > 1) {
        poison(dy);
        check_cuda(fake_quantize_per_tensor(dx.get() + 1, dy.get() + 1, dmask.get() + 1, n - 1, g, nullptr),
                   "fake_quantize_per_tensor");
        const auto off = download(dy);
        EXPECT_TRUE(same_floats(std::vector<float>(off.begin() + 1, off.end()), std::vector<float>(want.begin() + 1, want.end())));
      }
    }
  }
}

TEST_F(Gpu, FakeQuantizePerChannelMatchesReference) {
  struct Layout {
    int64_t outer, C, inner;
  };
  // [C, K] weights (axis 0), NCHW activations (axis 1), channels last (inner 1), per-group runs.
  for (const Layout L : {Layout{1, 768, 3072}, Layout{8, 64, 49}, Layout{4096, 96, 1}, Layout{1, 4096, 32}}) {
    SCOPED_TRACE("outer=" + std::to_string(L.outer) + " C=" + std::to_string(L.C) + " inner=" + std::to_string(L.inner));
    const int64_t n = L.outer * L.C * L.inner;
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::uniform_real_distribution<float> us(0.001f, 0.05f);
    std::uniform_int_distribution<int> uz(0, 255);
    std::vector<float> scale(L.C), zp(L.C);
    for (int64_t c = 0; c < L.C; ++c) {
      scale[c] = us(rng);
      zp[c] = static_cast<float>(uz(rng));
    }
    const std::vector<float> x = random_floats(n, 3.0f, 5u, 0.01f, true);
    std::vector<float> want(x.size());
    std::unique_ptr<bool[]> want_mask(new bool[x.size()]);
    for (int64_t o = 0; o < L.outer; ++o) {
      for (int64_t c = 0; c < L.C; ++c) {
        const int64_t b = (o * L.C + c) * L.inner;
        fq::affine_run_reference(x.data() + b, want.data() + b, want_mask.get() + b, L.inner,
                                 fq::make_grid(scale[c], zp[c], 0.0f, 255.0f));
      }
    }
    auto dx = upload(x), dscale = upload(scale), dzp = upload(zp);
    DeviceBuffer<float> dy(x.size());
    DeviceBuffer<bool> dmask(x.size());
    poison(dy);
    poison(dmask, 0x02);
    check_cuda(fake_quantize_per_channel(dx.get(), dy.get(), dmask.get(), n, L.C, L.inner, dscale.get(),
                                         dzp.get(), 0.0f, 255.0f, nullptr),
               "fake_quantize_per_channel");
    EXPECT_TRUE(same_floats(download(dy), want));
    const auto mask = download_mask(dmask);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(static_cast<int>(mask[i]), static_cast<int>(want_mask[i])) << i;
  }
  // Bad layouts are refused, not launched.
  EXPECT_EQ(fake_quantize_per_channel(nullptr, nullptr, nullptr, 8, 0, 1, nullptr, nullptr, 0, 255, nullptr),
            cudaErrorInvalidValue);
}

TEST_F(Gpu, FakeQuantizeFloat8MatchesReference) {
  struct F8Case {
    fq::Float8Format f;
    int64_t C, inner;
  };
  for (const F8Case fc : {F8Case{fq::kE4M3, 16, 4099}, F8Case{fq::kE5M2, 16, 4099}, F8Case{fq::kE4M3, 8, 1024}}) {
    const fq::Float8Format f = fc.f;
    SCOPED_TRACE(std::to_string(f.max_finite) + " inner=" + std::to_string(fc.inner));
    const int64_t C = fc.C, inner = fc.inner, n = C * inner;
    std::vector<float> scale(C);
    for (int64_t c = 0; c < C; ++c) scale[c] = 0.002f * static_cast<float>(c + 1);
    const std::vector<float> x = random_floats(n, 2.0f, 77u, 0.0f, true);
    std::vector<float> want(x.size());
    std::unique_ptr<bool[]> want_mask(new bool[x.size()]);
    for (int64_t c = 0; c < C; ++c)
      fq::float8_run_reference(x.data() + c * inner, want.data() + c * inner, want_mask.get() + c * inner, inner,
                               scale[c], f);
    auto dx = upload(x), dscale = upload(scale);
    DeviceBuffer<float> dy(x.size());
    DeviceBuffer<bool> dmask(x.size());
    poison(dy);
    poison(dmask, 0x02);
    check_cuda(fake_quantize_float8(dx.get(), dy.get(), dmask.get(), n, C, inner, dscale.get(), f, nullptr),
               "fake_quantize_float8");
    EXPECT_TRUE(same_floats(download(dy), want));
    const auto mask = download_mask(dmask);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(static_cast<int>(mask[i]), static_cast<int>(want_mask[i])) << i;
  }
}

TEST_F(Gpu, FakeQuantizeBackwardMatchesReference) {
  const int64_t n = (int64_t{1} << 20) + 7;
  const std::vector<float> dy = random_floats(n, 1.0f, 3u);
  std::mt19937 rng(9);
  std::unique_ptr<bool[]> mask(new bool[n]);
  std::vector<uint8_t> mask_bytes(n);
  for (int64_t i = 0; i < n; ++i) mask_bytes[i] = (rng() & 1u) != 0u;
  for (int64_t i = 0; i < n; ++i) mask[i] = mask_bytes[i] != 0;
  std::vector<float> want(n);
  fq::mask_grad_reference(dy.data(), mask.get(), want.data(), n);
  auto ddy = upload(dy);
  DeviceBuffer<bool> dmask(n);
  check_cuda(cudaMemcpy(dmask.get(), mask.get(), n, cudaMemcpyHostToDevice), "cudaMemcpy");
  DeviceBuffer<float> ddx(n);
  poison(ddx);
  check_cuda(fake_quantize_backward(ddy.get(), dmask.get(), ddx.get(), n, nullptr), "fake_quantize_backward");
  EXPECT_TRUE(same_floats(download(ddx), want));
}

// ---- LSQ backward ----

// dx bit for bit lsq_run_reference's; dScale / dZeroPoint per channel against the reference run
// chunk by chunk as the CPU's lsq_backward_rows does (chunks of fq::kLsqChunk, added in order in
// double), within one float ulp plus 2^-38 of the sum of the |terms|: the reference's sequential
// double sum of a chunk is within (2^14 - 1) * 2^-53 < 2^-39 of the exact one, the GPU's tree
// (64 terms a thread, 8 levels) and the chunk additions within 2^-45. Channels with 1 to 3
// chunks, many channels, a channel of none; x spread past the grid (clamped elements).
TEST_F(Gpu, LsqBackwardMatchesReference) {
  struct Case {
    int64_t C, inner;
    float qmin, qmax;
  };
  for (const Case c : {Case{1, 3 * fq::kLsqChunk - 5, -128, 127}, Case{5, 777, 0, 15}, Case{3000, 33, -8, 7},
                       Case{2, fq::kLsqChunk, 0, 255}, Case{4, 0, -128, 127}}) {
    SCOPED_TRACE("C=" + std::to_string(c.C) + " inner=" + std::to_string(c.inner));
    const int64_t n = c.C * c.inner;
    const std::vector<float> x = random_floats(n, 3.0f, 41u, 0.05f);
    const std::vector<float> dy = random_floats(n, 1.0f, 42u);
    std::mt19937 rng(43u);
    std::vector<fq::LsqGrid> grids(static_cast<size_t>(c.C));
    for (auto& g : grids) {
      g.scale = std::uniform_real_distribution<float>(0.01f, 0.2f)(rng);
      g.inv_scale = 1.0f / g.scale;
      g.zero_point = std::nearbyint(std::uniform_real_distribution<float>(c.qmin, c.qmax)(rng));
      g.quant_min = c.qmin;
      g.quant_max = c.qmax;
      g.grad_factor = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(c.inner, 1)) * c.qmax);
    }
    std::vector<float> want_dx(n), want_ds(c.C), want_dz(c.C);
    std::vector<double> mag_s(c.C, 0.0), mag_z(c.C, 0.0);
    for (int64_t ch = 0; ch < c.C; ++ch) {
      double s = 0.0, z = 0.0;
      for (int64_t b = 0; b < c.inner; b += fq::kLsqChunk) {
        const int64_t len = std::min(fq::kLsqChunk, c.inner - b);
        const int64_t at = ch * c.inner + b;
        const fq::LsqSums part = fq::lsq_run_reference(x.data() + at, dy.data() + at, want_dx.data() + at, len, grids[ch]);
        s += part.dscale;
        z += part.dzero_point;
        // The sums of |terms| (the bound's scale), on the reference's element formulas.
        for (int64_t i = 0; i < len; ++i) {
          const fq::LsqGrid& g = grids[ch];
          const float xi = x[at + i], d = std::fabs(dy[at + i]);
          const float q = std::nearbyint(g.zero_point + xi * g.inv_scale);
          if (q < g.quant_min || q > g.quant_max) {
            mag_z[ch] += d * g.scale * g.grad_factor;
            mag_s[ch] += d * std::fabs(q < g.quant_min ? g.quant_min - g.zero_point : g.quant_max - g.zero_point) *
                         g.grad_factor;
          } else {
            mag_s[ch] += d * std::fabs((q - g.zero_point) * g.scale - xi) * g.inv_scale * g.grad_factor;
          }
        }
      }
      want_ds[ch] = static_cast<float>(s);
      want_dz[ch] = static_cast<float>(z);
    }
    auto dxin = upload(x);
    auto ddy = upload(dy);
    auto dg = upload(grids);
    DeviceBuffer<float> ddx(n), dds(c.C), ddz(c.C);
    DeviceBuffer<double> work(lsq_backward_workspace_doubles(c.C, c.inner));
    poison(ddx);
    poison(dds);
    poison(ddz);
    check_cuda(lsq_backward_rows(dxin.get(), ddy.get(), ddx.get(), c.C, c.inner, dg.get(), dds.get(), ddz.get(),
                                 work.get(), nullptr),
               "lsq_backward_rows");
    EXPECT_TRUE(same_floats(download(ddx), want_dx));
    const std::vector<float> ds = download(dds), dz = download(ddz);
    int bad = 0;
    for (int64_t ch = 0; ch < c.C; ++ch) {
      const auto within = [](float got, float want, double mag) {
        const double ulp = std::ldexp(1.0, std::max(std::ilogb(std::fabs(want) + 1e-38f), -126) - 23);
        return std::fabs(static_cast<double>(got) - want) <= ulp + std::ldexp(mag, -38);
      };
      if (!within(ds[ch], want_ds[ch], mag_s[ch]) || !within(dz[ch], want_dz[ch], mag_z[ch])) {
        if (++bad <= 5)
          ADD_FAILURE() << "channel " << ch << ": dscale " << ds[ch] << " (CPU " << want_ds[ch] << "), dzero_point "
                        << dz[ch] << " (CPU " << want_dz[ch] << ")";
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// ---- dynamic int8 activation quantization ----

TEST_F(Gpu, QuantizeRowsMatchesReference) {
  struct Shape {
    int64_t M, K, ldq;
  };
  for (const Shape s : {Shape{1, 768, 768}, Shape{37, 3072, 3076}, Shape{512, 1000, 1000}, Shape{3, 1, 4}}) {
    for (const ActScale mode : {ActScale::kPerRow, ActScale::kPerTensor}) {
      SCOPED_TRACE("M=" + std::to_string(s.M) + " K=" + std::to_string(s.K) + " ldq=" + std::to_string(s.ldq) +
                   (mode == ActScale::kPerRow ? " per_row" : " per_tensor"));
      std::vector<float> x = random_floats(s.M * s.K, 6.0f, static_cast<uint32_t>(s.M * 31 + s.K));
      if (s.M > 2) std::fill(x.begin() + s.K, x.begin() + 2 * s.K, 0.0f);  // an all-zero row: scale 1
      std::vector<int8_t> want_q(s.M * s.ldq);
      std::vector<float> want_scale(s.M);
      kernels::quantize_rows_s8_reference(x.data(), s.M, s.K, mode, want_q.data(), s.ldq, want_scale.data());
      auto dx = upload(x);
      DeviceBuffer<int8_t> dq(want_q.size());
      DeviceBuffer<float> dscale(s.M);
      DeviceBuffer<unsigned long long> dbad(1);
      poison(dq, 0x55);
      poison(dscale);
      poison(dbad);  // 0xFF..: kNoNonFinite
      quantize_rows_s8_cuda(dx.get(), s.M, s.K, mode, dq.get(), s.ldq, dscale.get(), dbad.get(), nullptr);
      EXPECT_NO_THROW(throw_if_nonfinite(dbad.get(), s.K, nullptr));
      EXPECT_TRUE(same_values(download(dq), want_q));
      EXPECT_TRUE(same_floats(download(dscale), want_scale));
    }
  }
}

TEST_F(Gpu, QuantizeRowsReportsFirstNonFiniteLikeTheReference) {
  const int64_t M = 64, K = 300;
  std::vector<float> x = random_floats(M * K, 2.0f, 21u);
  x[17 * K + 250] = INFINITY;
  x[40 * K + 3] = NAN;
  x[17 * K + 260] = NAN;
  std::string want;
  std::vector<int8_t> q(M * K);
  std::vector<float> s(M);
  try {
    kernels::quantize_rows_s8_reference(x.data(), M, K, ActScale::kPerRow, q.data(), K, s.data());
  } catch (const Error& e) {
    want = e.what();
  }
  ASSERT_FALSE(want.empty()) << "the reference must refuse non-finite input";
  auto dx = upload(x);
  DeviceBuffer<int8_t> dq(M * K);
  DeviceBuffer<float> dscale(M);
  DeviceBuffer<unsigned long long> dbad(1);
  poison(dbad);
  quantize_rows_s8_cuda(dx.get(), M, K, ActScale::kPerRow, dq.get(), K, dscale.get(), dbad.get(), nullptr);
  try {
    throw_if_nonfinite(dbad.get(), K, nullptr);
    ADD_FAILURE() << "no error for non-finite input";
  } catch (const Error& e) {
    // Same place as the reference names (the GPU message cannot carry the value).
    const std::string where = "activation row 17 column 250 is not finite";
    EXPECT_NE(want.find("activation row 17 column 250 is not finite"), std::string::npos) << want;
    EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
  }
}

// ---- int8 GEMM: cuBLASLt and its fallback ----

struct GemmCase {
  int64_t M, N, K, lda, ldw, ldc;
  const char* kernel;  // expected RunInfo::kernel
  const char* reason;  // substring of RunInfo::fallback ("" when cuBLASLt runs)
};

void run_gemm_case(const GemmS8S8S32Cuda& gemm, const GemmCase& c, uint32_t seed) {
  SCOPED_TRACE("M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
               " lda=" + std::to_string(c.lda) + " ldw=" + std::to_string(c.ldw) + " ldc=" + std::to_string(c.ldc));
  // Strided operands: fill the padding too, so a kernel reading it gets a wrong sum.
  const std::vector<int8_t> A = random_s8(c.M * c.lda, seed), W = random_s8(c.N * c.ldw, seed + 1);
  std::vector<int8_t> Ad(c.M * c.K), Wd(c.N * c.K);
  for (int64_t m = 0; m < c.M; ++m) std::copy_n(A.begin() + m * c.lda, c.K, Ad.begin() + m * c.K);
  for (int64_t n = 0; n < c.N; ++n) std::copy_n(W.begin() + n * c.ldw, c.K, Wd.begin() + n * c.K);
  std::vector<int32_t> want(c.M * c.N);
  kernels::gemm_s8s8s32_reference(Ad.data(), Wd.data(), want.data(), c.M, c.N, c.K);

  auto dA = upload(A), dW = upload(W);
  DeviceBuffer<int32_t> dC(c.M * c.ldc);
  poison(dC, 0x7B);
  RunInfo info;
  gemm.run(dA.get(), c.lda, dW.get(), c.ldw, dC.get(), c.ldc, c.M, c.N, c.K, nullptr, &info);
  EXPECT_EQ(info.kernel, c.kernel) << info.fallback;
  if (c.reason[0] == '\0') {
    EXPECT_EQ(info.fallback, "");
  } else {
    EXPECT_NE(info.fallback.find(c.reason), std::string::npos) << info.fallback;
  }
  const std::vector<int32_t> C = download(dC);
  std::vector<int32_t> got(c.M * c.N);
  for (int64_t m = 0; m < c.M; ++m) std::copy_n(C.begin() + m * c.ldc, c.N, got.begin() + m * c.N);
  EXPECT_TRUE(same_values(got, want));
  // Padding columns of C stay untouched.
  for (int64_t m = 0; m < c.M; ++m)
    for (int64_t n = c.N; n < c.ldc; ++n) ASSERT_EQ(C[m * c.ldc + n], 0x7B7B7B7B) << "C padding written at " << m;
}

TEST_F(Gpu, GemmMeetsAndBreaksTheImmaRules) {
  GemmS8S8S32Cuda gemm;
  const GemmCase cases[] = {
      // cuBLASLt IMMA: N and K multiples of 4, leading dimensions too; M free.
      {1, 768, 768, 768, 768, 768, "gemm_s8s8s32_cublaslt", ""},
      {7, 3072, 768, 768, 768, 3072, "gemm_s8s8s32_cublaslt", ""},
      {128, 768, 3072, 3072, 3072, 768, "gemm_s8s8s32_cublaslt", ""},
      {33, 256, 512, 516, 520, 260, "gemm_s8s8s32_cublaslt", ""},  // padded rows, multiples of 4
      // Each rule broken once: the fallback runs and says why.
      {8, 6, 64, 64, 64, 6, "gemm_s8s8s32_cuda", "N=6 not a multiple of 4"},
      {8, 64, 10, 10, 10, 64, "gemm_s8s8s32_cuda", "K=10 not a multiple of 4"},
      {8, 64, 64, 66, 64, 64, "gemm_s8s8s32_cuda", "lda=66 not a multiple of 4"},
      {8, 64, 64, 64, 70, 64, "gemm_s8s8s32_cuda", "ldb=70 not a multiple of 4"},
      {8, 64, 64, 64, 64, 65, "gemm_s8s8s32_cuda", "ldc=65 not a multiple of 4"},
      {50, 1001, 999, 999, 999, 1001, "gemm_s8s8s32_cuda", "N=1001 not a multiple of 4"},
  };
  uint32_t seed = 100;
  for (const GemmCase& c : cases) run_gemm_case(gemm, c, seed += 2);
}

TEST_F(Gpu, GemmFallbackForcedMatchesReferenceAtLargeShape) {
  GemmS8S8S32Cuda gemm;
  gemm.set_use_cublaslt(false);
  run_gemm_case(gemm, {256, 1024, 2048, 2048, 2048, 1024, "gemm_s8s8s32_cuda", "disabled by set_use_cublaslt(false)"}, 7);
}

TEST_F(Gpu, GemmMisalignedPointerFallsBack) {
  const int64_t M = 4, N = 8, K = 16;
  const std::vector<int8_t> A = random_s8(M * K + 1, 1), W = random_s8(N * K, 2);
  std::vector<int32_t> want(M * N);
  kernels::gemm_s8s8s32_reference(A.data() + 1, W.data(), want.data(), M, N, K);
  auto dA = upload(A), dW = upload(W);
  DeviceBuffer<int32_t> dC(M * N);
  poison(dC);
  GemmS8S8S32Cuda gemm;
  RunInfo info;
  gemm.run(dA.get() + 1, K, dW.get(), K, dC.get(), N, M, N, K, nullptr, &info);
  EXPECT_EQ(info.kernel, "gemm_s8s8s32_cuda");
  EXPECT_NE(info.fallback.find("A pointer not 4-byte aligned"), std::string::npos) << info.fallback;
  EXPECT_TRUE(same_values(download(dC), want));
}

TEST_F(Gpu, GemmRefusesBadStrides) {
  GemmS8S8S32Cuda gemm;
  EXPECT_THROW(gemm.run(nullptr, 4, nullptr, 8, nullptr, 8, 2, 8, 8, nullptr), Error);  // lda < K
}

// ---- the dequantizing epilogue and the whole int8 linear chain ----

TEST_F(Gpu, EpilogueMatchesReference) {
  const int64_t M = 300, N = 1000, ldacc = 1004;
  std::mt19937 rng(4);
  std::uniform_int_distribution<int32_t> uacc(-2000000, 2000000);
  std::uniform_real_distribution<float> us(1e-4f, 0.05f), ub(-1.0f, 1.0f);
  std::vector<int32_t> acc(M * ldacc);
  for (auto& a : acc) a = uacc(rng);
  std::vector<float> a_scale(M), w_scale(N), bias(N);
  for (auto& v : a_scale) v = us(rng);
  for (auto& v : w_scale) v = us(rng);
  for (auto& v : bias) v = ub(rng);
  std::vector<int32_t> dense(M * N);
  for (int64_t m = 0; m < M; ++m) std::copy_n(acc.begin() + m * ldacc, N, dense.begin() + m * N);
  auto dacc = upload(acc);
  auto da = upload(a_scale), dw = upload(w_scale), db = upload(bias);
  for (const bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    std::vector<float> want(M * N);
    kernels::dequantize_s32_f32_reference(dense.data(), a_scale.data(), w_scale.data(),
                                          with_bias ? bias.data() : nullptr, want.data(), M, N);
    DeviceBuffer<float> dy(M * N);
    poison(dy);
    dequantize_s32_f32_cuda(dacc.get(), ldacc, da.get(), dw.get(), with_bias ? db.get() : nullptr, dy.get(), M, N,
                            nullptr);
    EXPECT_TRUE(same_floats(download(dy), want));
  }
}

TEST_F(Gpu, Int8LinearChainMatchesReference) {
  // quantize rows -> GEMM (cuBLASLt) -> epilogue, as a frozen s8 dynamic Linear runs it.
  const int64_t M = 64, N = 768, K = 3072;
  const std::vector<float> x = random_floats(M * K, 3.0f, 8u);
  const std::vector<int8_t> W = random_s8(N * K, 9u, -127, 127);
  std::vector<float> w_scale(N), bias(N);
  std::mt19937 rng(10);
  std::uniform_real_distribution<float> us(1e-3f, 2e-2f), ub(-0.5f, 0.5f);
  for (auto& v : w_scale) v = us(rng);
  for (auto& v : bias) v = ub(rng);
  std::vector<int8_t> q(M * K);
  std::vector<float> a_scale(M), want(M * N);
  std::vector<int32_t> acc(M * N);
  kernels::quantize_rows_s8_reference(x.data(), M, K, ActScale::kPerRow, q.data(), K, a_scale.data());
  kernels::gemm_s8s8s32_reference(q.data(), W.data(), acc.data(), M, N, K);
  kernels::dequantize_s32_f32_reference(acc.data(), a_scale.data(), w_scale.data(), bias.data(), want.data(), M, N);

  auto dx = upload(x), dws = upload(w_scale), db = upload(bias);
  auto dW = upload(W);
  DeviceBuffer<int8_t> dq(M * K);
  DeviceBuffer<float> da(M), dy(M * N);
  DeviceBuffer<int32_t> dacc(M * N);
  DeviceBuffer<unsigned long long> dbad(1);
  poison(dbad);
  poison(dy);
  GemmS8S8S32Cuda gemm;
  RunInfo info;
  quantize_rows_s8_cuda(dx.get(), M, K, ActScale::kPerRow, dq.get(), K, da.get(), dbad.get(), nullptr);
  throw_if_nonfinite(dbad.get(), K, nullptr);
  gemm.run(dq.get(), K, dW.get(), K, dacc.get(), N, M, N, K, nullptr, &info);
  dequantize_s32_f32_cuda(dacc.get(), N, da.get(), dws.get(), db.get(), dy.get(), M, N, nullptr);
  EXPECT_EQ(info.kernel, "gemm_s8s8s32_cublaslt") << info.fallback;
  EXPECT_TRUE(same_floats(download(dy), want));
}

// ---- int4 weight dequantization ----

TEST_F(Gpu, DequantizeS4MatchesUnpackReference) {
  struct Case {
    int64_t N, K, group;
    bool is_signed, zeros;
  };
  for (const Case c : {Case{768, 768, 128, true, false}, Case{33, 77, 32, true, true}, Case{64, 4096, 64, false, true},
                       Case{5, 9, 9, false, false}}) {
    SCOPED_TRACE("N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) + " group=" + std::to_string(c.group) +
                 (c.is_signed ? " qint4" : " quint4") + (c.zeros ? " zero points" : ""));
    const int64_t n = c.N * c.K, G = kernels::num_groups(c.K, c.group);
    const std::vector<int8_t> values = c.is_signed ? random_s8(n, 12u, -8, 7) : random_s8(n, 12u, 0, 15);
    std::vector<uint8_t> packed((n + 1) / 2);
    if (c.is_signed) {
      kernels::pack_s4_reference(values.data(), n, packed.data());
    } else {
      kernels::pack_u4_reference(values.data(), n, packed.data());
    }
    std::vector<int8_t> unpacked(n);
    if (c.is_signed) {
      kernels::unpack_s4_reference(packed.data(), n, unpacked.data());
    } else {
      kernels::unpack_u4_reference(packed.data(), n, unpacked.data());
    }
    ASSERT_EQ(unpacked, values);
    std::mt19937 rng(13);
    std::uniform_real_distribution<float> us(1e-3f, 0.1f);
    std::uniform_int_distribution<int32_t> uz(0, 15);
    std::vector<float> scale(c.N * G);
    std::vector<int32_t> zero(c.N * G);
    for (auto& s : scale) s = static_cast<float>(static_cast<_Float16>(us(rng)));  // fp16-exact, as frozen
    for (auto& z : zero) z = uz(rng);
    std::vector<float> want(n);
    for (int64_t i = 0; i < c.N; ++i)
      for (int64_t k = 0; k < c.K; ++k) {
        const int64_t gi = i * G + k / c.group;
        want[i * c.K + k] = static_cast<float>(unpacked[i * c.K + k] - (c.zeros ? zero[gi] : 0)) * scale[gi];
      }
    auto dp = upload(packed);
    auto ds = upload(scale);
    auto dz = upload(zero);
    DeviceBuffer<float> dw(n);
    poison(dw);
    dequantize_s4_cuda(dp.get(), c.N, c.K, c.is_signed, ds.get(), c.zeros ? dz.get() : nullptr, c.group, dw.get(),
                       nullptr);
    EXPECT_TRUE(same_floats(download(dw), want));
  }
}

// ---- int4 weight-only GEMV ----

// A random int4 weight in the CPU packing with fp16-exact group scales and optional zero points.
struct S4Weight {
  int64_t N, K, group, G;
  bool is_signed;
  std::vector<int8_t> values;
  std::vector<uint8_t> packed;
  std::vector<float> scale;
  std::vector<int32_t> zero;  // empty: none
  float w(int64_t n, int64_t k) const {
    const int64_t gi = n * G + k / group;
    return static_cast<float>(values[n * K + k] - (zero.empty() ? 0 : zero[gi])) * scale[gi];
  }
};

S4Weight random_s4_weight(int64_t N, int64_t K, int64_t group, bool is_signed, bool zeros, uint32_t seed) {
  S4Weight w{N, K, group, kernels::num_groups(K, group), is_signed, {}, {}, {}, {}};
  w.values = is_signed ? random_s8(N * K, seed, -8, 7) : random_s8(N * K, seed, 0, 15);
  w.packed.resize((N * K + 1) / 2);
  if (is_signed) {
    kernels::pack_s4_reference(w.values.data(), N * K, w.packed.data());
  } else {
    kernels::pack_u4_reference(w.values.data(), N * K, w.packed.data());
  }
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<float> us(1e-3f, 0.1f);
  w.scale.resize(N * w.G);
  for (auto& s : w.scale) s = static_cast<float>(static_cast<_Float16>(us(rng)));  // fp16-exact, as frozen
  if (zeros) {
    std::uniform_int_distribution<int32_t> uz(is_signed ? -8 : 0, is_signed ? 7 : 15);
    w.zero.resize(N * w.G);
    for (auto& z : w.zero) z = uz(rng);
  }
  return w;
}

// The bound of gemv_f32s4_cuda.h against the exact value (double sums of the exact products),
// and the CPU reference (linear_f32_s4_reference) within twice the bound.
TEST_F(Gpu, GemvS4MatchesReferenceWithinItsBound) {
  struct Case {
    int64_t M, N, K, group;
    bool is_signed, zeros, bias;
  };
  for (const Case c : {Case{1, 768, 768, 128, true, false, true}, Case{1, 33, 4096, 128, true, true, false},
                       Case{2, 64, 4096, 64, false, true, true}, Case{3, 17, 104, 8, true, false, true},
                       Case{5, 130, 1024, 1024, true, false, false}, Case{8, 96, 2048, 32, false, false, true},
                       Case{11, 40, 512, 128, true, true, true}, Case{16, 4100, 256, 128, true, false, true},
                       // 16- and 8-byte loads with K tails past the block's step, zero points.
                       Case{1, 7, 4128, 32, true, true, true}, Case{4, 9, 48, 16, false, true, false},
                       Case{3, 50, 2080, 32, false, true, true}, Case{2, 5, 96, 96, true, false, true}}) {
    SCOPED_TRACE("M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                 " group=" + std::to_string(c.group) + (c.is_signed ? " qint4" : " quint4") +
                 (c.zeros ? " zero points" : "") + (c.bias ? " bias" : ""));
    const S4Weight w = random_s4_weight(c.N, c.K, c.group, c.is_signed, c.zeros, 21u);
    const std::vector<float> x = random_floats(c.M * c.K, 2.0f, 22u);
    const std::vector<float> bias = c.bias ? random_floats(c.N, 1.0f, 23u) : std::vector<float>();
    std::vector<float> cpu(c.M * c.N);
    kernels::linear_f32_s4_reference(x.data(), w.values.data(), w.scale.data(), c.zeros ? w.zero.data() : nullptr,
                                     c.group, c.bias ? bias.data() : nullptr, cpu.data(), c.M, c.N, c.K);
    auto dx = upload(x);
    auto dp = upload(w.packed);
    auto ds = upload(w.scale);
    auto dz = upload(w.zero);
    auto db = upload(bias);
    DeviceBuffer<float> dy(c.M * c.N);
    poison(dy);
    gemv_f32s4_cuda(dx.get(), c.M, dp.get(), c.N, c.K, c.is_signed, ds.get(), c.zeros ? dz.get() : nullptr, c.group,
                    c.bias ? db.get() : nullptr, dy.get(), nullptr);
    const std::vector<float> got = download(dy);
    const double gamma = static_cast<double>(c.K / 8 + 64) * std::ldexp(1.0, -24);
    int bad = 0;
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t n = 0; n < c.N; ++n) {
        double exact = c.bias ? bias[n] : 0.0, mag = c.bias ? std::fabs(bias[n]) : 0.0;
        for (int64_t k = 0; k < c.K; ++k) {
          const double p = static_cast<double>(x[m * c.K + k]) * w.w(n, k);
          exact += p;
          mag += std::fabs(p);
        }
        const double g = got[m * c.N + n];
        if (!(std::fabs(g - exact) <= gamma * mag) || !(std::fabs(g - cpu[m * c.N + n]) <= 2 * gamma * mag)) {
          if (++bad <= 5)
            ADD_FAILURE() << "y[" << m << ", " << n << "] = " << g << ", exact " << exact << ", CPU reference "
                          << cpu[m * c.N + n] << ", bound " << gamma * mag;
        }
      }
    EXPECT_EQ(bad, 0);
  }
}

TEST_F(Gpu, GemvS4RefusesWhatItsRulesRefuse) {
  std::string why;
  EXPECT_FALSE(gemv_f32s4_supported(17, 64, 32, &why));
  EXPECT_NE(why.find("M=17"), std::string::npos) << why;
  EXPECT_FALSE(gemv_f32s4_supported(1, 76, 32, &why));
  EXPECT_NE(why.find("K=76"), std::string::npos) << why;
  EXPECT_FALSE(gemv_f32s4_supported(1, 64, 12, &why));
  EXPECT_NE(why.find("group_size=12"), std::string::npos) << why;
  DeviceBuffer<float> x(64 + 1), y(4);
  DeviceBuffer<uint8_t> p(128);
  DeviceBuffer<float> s(4);
  try {
    gemv_f32s4_cuda(x.get() + 1, 1, p.get(), 4, 64, true, s.get(), nullptr, 64, nullptr, y.get(), nullptr);
    ADD_FAILURE() << "a misaligned x was accepted";
  } catch (const qforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("16-byte"), std::string::npos) << e.what();
  }
}

// ---- int8 weight-only GEMV ----

// The bound of gemv_f32s8_cuda.h against the exact value (double sums of the exact products), on
// every output; the CPU reference (one fmaf chain over k: K roundings) within the sum of both
// bounds; two calls bit for bit. Shapes: every M bucket (1, 2, 3-4, 5-8, 9-16), K with 16-, 8-
// and 4-byte rows (K % 16 = 0, 8, 4), K below one lane's step, N not a multiple of the block's
// rows, codes at an offset of 4 or 8 bytes (narrower loads by alignment), the Llama-3-8B down
// projection's K.
TEST_F(Gpu, GemvS8MatchesReferenceWithinItsBound) {
  struct Case {
    int64_t M, N, K, code_offset;
    bool bias;
  };
  double worst = 0.0;
  for (const Case c : {Case{1, 768, 768, 0, true}, Case{1, 33, 4096, 0, false}, Case{1, 7, 14336, 0, true},
                       Case{2, 64, 4104, 0, true}, Case{3, 17, 100, 0, false}, Case{4, 130, 1024, 4, true},
                       Case{5, 9, 24, 0, true}, Case{8, 96, 2056, 0, false}, Case{9, 40, 512, 4, true},
                       Case{16, 4100, 256, 0, true}, Case{1, 5, 4, 0, true}, Case{16, 3, 12, 4, false},
                       Case{1, 19, 4096, 4, true}, Case{1, 11, 160, 8, false}}) {
    SCOPED_TRACE("M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                 " code offset " + std::to_string(c.code_offset) + (c.bias ? " bias" : ""));
    const std::vector<int8_t> q = random_s8(c.N * c.K, 31u);
    std::vector<float> scale(c.N);
    std::mt19937 rng(32u);
    std::uniform_real_distribution<float> us(1e-4f, 0.05f);
    for (auto& s : scale) s = us(rng);
    const std::vector<float> x = random_floats(c.M * c.K, 2.0f, 33u);
    const std::vector<float> bias = c.bias ? random_floats(c.N, 1.0f, 34u) : std::vector<float>();
    std::vector<float> cpu(c.M * c.N);
    kernels::linear_f32_s8_reference(x.data(), q.data(), scale.data(), c.bias ? bias.data() : nullptr, cpu.data(), c.M,
                                     c.N, c.K);
    std::vector<int8_t> shifted(static_cast<size_t>(c.code_offset), 0);
    shifted.insert(shifted.end(), q.begin(), q.end());
    auto dx = upload(x);
    auto dq = upload(shifted);
    auto ds = upload(scale);
    auto db = upload(bias);
    DeviceBuffer<float> dy(c.M * c.N), dy2(c.M * c.N);
    poison(dy);
    poison(dy2);
    const auto run = [&](DeviceBuffer<float>& out) {
      gemv_f32s8_cuda(dx.get(), c.M, dq.get() + c.code_offset, c.N, c.K, ds.get(), c.bias ? db.get() : nullptr,
                      out.get(), nullptr);
    };
    run(dy);
    run(dy2);
    const std::vector<float> got = download(dy);
    EXPECT_TRUE(same_floats(got, download(dy2)));
    const double gamma = static_cast<double>(c.K / 64 + 64) * std::ldexp(1.0, -24);
    const double gamma_cpu = gamma + static_cast<double>(c.K + 2) * std::ldexp(1.0, -24);
    int bad = 0;
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t n = 0; n < c.N; ++n) {
        double exact = c.bias ? bias[n] : 0.0, mag = c.bias ? std::fabs(bias[n]) : 0.0;
        for (int64_t k = 0; k < c.K; ++k) {
          const double p = static_cast<double>(x[m * c.K + k]) * scale[n] * q[n * c.K + k];
          exact += p;
          mag += std::fabs(p);
        }
        const double g = got[m * c.N + n];
        if (mag > 0) worst = std::max(worst, std::fabs(g - exact) / (gamma * mag));
        if (!(std::fabs(g - exact) <= gamma * mag) || !(std::fabs(g - cpu[m * c.N + n]) <= gamma_cpu * mag)) {
          if (++bad <= 5)
            ADD_FAILURE() << "y[" << m << ", " << n << "] = " << g << ", exact " << exact << ", CPU reference "
                          << cpu[m * c.N + n] << ", bound " << gamma * mag;
        }
      }
    EXPECT_EQ(bad, 0);
  }
  std::printf("gemv_f32s8_cuda: largest error / bound %.4f\n", worst);
}

// The launcher refuses what gemv_s8_rules.h refuses (the rules themselves: cuda_math_test).
TEST_F(Gpu, GemvS8RefusesWhatItsRulesRefuse) {
  DeviceBuffer<float> x(64 + 1), y(4), s(4);
  DeviceBuffer<int8_t> q(4 * 64 + 4);
  const auto refused = [&](const float* xp, const int8_t* qp, const char* want) {
    try {
      gemv_f32s8_cuda(xp, 1, qp, 4, 64, s.get(), nullptr, y.get(), nullptr);
      ADD_FAILURE() << "accepted; wanted the refusal '" << want << "'";
    } catch (const qforge::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused(x.get() + 1, q.get(), "x pointer not 16-byte aligned");
  refused(x.get(), q.get() + 2, "int8 codes pointer not 4-byte aligned");
  try {
    gemv_f32s8_cuda(x.get(), 17, q.get(), 4, 64, s.get(), nullptr, y.get(), nullptr);
    ADD_FAILURE() << "M=17 was accepted";
  } catch (const qforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("M=17 outside 1..16"), std::string::npos) << e.what();
  }
}

// The bound of gemv_f32s4_mma_cuda.h against the exact value (double sums of the exact
// products), per output; the largest error / bound ratio is printed. Rows of x of very
// different magnitudes (1e-30 .. 1e30) check the per-block scaling; two calls are bit-equal,
// and so are two of gemv_f32s4_mma_staged_cuda (same arithmetic, x staged once per call). K
// from 1 to 112 blocks of 128: warps with 0 to 14 steps, the load ring partly and fully used;
// N = 9000 at M = 2: a grid of more than two blocks per SM, the staged kernel's shallow ring.
TEST_F(Gpu, GemvS4MmaMatchesReferenceWithinItsBound) {
  std::string why;
  ASSERT_TRUE(gemv_f32s4_mma_runs_here(&why)) << why;
  struct Case {
    int64_t M, N, K, group;
    bool is_signed, zeros, bias;
  };
  double worst = 0;
  for (const Case c : {Case{1, 768, 768, 128, true, false, true}, Case{1, 33, 4096, 128, true, true, false},
                       Case{2, 64, 4096, 256, false, true, true}, Case{3, 17, 1152, 128, true, false, true},
                       Case{4, 130, 1024, 1024, true, false, false}, Case{5, 96, 2048, 128, false, false, true},
                       Case{8, 40, 512, 128, true, true, true}, Case{9, 4100, 256, 128, true, false, true},
                       Case{16, 300, 1920, 384, false, true, true}, Case{12, 1, 128, 128, true, true, true},
                       Case{16, 4096, 4096, 128, true, false, false}, Case{1, 40, 14336, 128, true, true, true},
                       Case{3, 70, 5248, 128, false, false, true}, Case{13, 48, 5248, 128, true, true, false},
                       Case{2, 9000, 512, 128, true, true, true}, Case{1, 5000, 1024, 128, true, true, true}}) {
    SCOPED_TRACE("M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                 " group=" + std::to_string(c.group) + (c.is_signed ? " qint4" : " quint4") +
                 (c.zeros ? " zero points" : "") + (c.bias ? " bias" : ""));
    ASSERT_TRUE(gemv_f32s4_mma_supported(c.M, c.K, c.group, &why)) << why;
    const S4Weight w = random_s4_weight(c.N, c.K, c.group, c.is_signed, c.zeros, 31u);
    std::vector<float> x = random_floats(c.M * c.K, 2.0f, 32u);
    const float row_scale[] = {1.0f, 1e-30f, 1e30f, 3e-3f, 7e4f};
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t k = 0; k < c.K; ++k) x[m * c.K + k] *= row_scale[m % 5];
    const std::vector<float> bias = c.bias ? random_floats(c.N, 1.0f, 33u) : std::vector<float>();
    auto dx = upload(x);
    auto dp = upload(w.packed);
    auto ds = upload(w.scale);
    auto dz = upload(w.zero);
    auto db = upload(bias);
    DeviceBuffer<float> dy(c.M * c.N);
    poison(dy);
    const auto run = [&] {
      gemv_f32s4_mma_cuda(dx.get(), c.M, dp.get(), c.N, c.K, c.is_signed, ds.get(), c.zeros ? dz.get() : nullptr,
                          c.group, c.bias ? db.get() : nullptr, dy.get(), nullptr);
      return download(dy);
    };
    const std::vector<float> got = run();
    EXPECT_TRUE(same_floats(run(), got)) << "two calls differ";
    DeviceBuffer<uint8_t> work(gemv_f32s4_mma_staged_workspace_bytes(c.M, c.K));
    for (int call = 0; call < 2; ++call) {
      poison(dy);
      gemv_f32s4_mma_staged_cuda(dx.get(), c.M, dp.get(), c.N, c.K, c.is_signed, ds.get(),
                                 c.zeros ? dz.get() : nullptr, c.group, c.bias ? db.get() : nullptr, dy.get(),
                                 work.get(), nullptr);
      EXPECT_TRUE(same_floats(download(dy), got))
          << "gemv_f32s4_mma_staged_cuda call " << call << " differs from gemv_f32s4_mma_cuda";
    }
    // The tiled layout: the GPU repack equals the layout's definition (s4_tiled_index, built
    // here on the host, padding rows zero), and both entry points and the dequantization read the
    // same codes from it, bit for bit.
    std::vector<uint8_t> want_tiled(s4_tiled_bytes(c.N, c.K), 0);
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t k = 0; k < c.K; ++k) {
        const int64_t i = s4_tiled_index(n, k, c.K);
        want_tiled[i / 2] |= static_cast<uint8_t>(s4_field_at(w.packed.data(), n * c.K + k) << (4 * (i % 2)));
      }
    DeviceBuffer<uint8_t> dt(want_tiled.size());
    repack_s4_tiles_cuda(dp.get(), c.N, c.K, dt.get(), nullptr);
    ASSERT_EQ(download(dt), want_tiled);
    poison(dy);
    gemv_f32s4_mma_cuda(dx.get(), c.M, dt.get(), c.N, c.K, c.is_signed, ds.get(), c.zeros ? dz.get() : nullptr, c.group,
                        c.bias ? db.get() : nullptr, dy.get(), nullptr, /*tiled=*/true);
    EXPECT_TRUE(same_floats(download(dy), got)) << "gemv_f32s4_mma_cuda on tiled codes differs";
    poison(dy);
    gemv_f32s4_mma_staged_cuda(dx.get(), c.M, dt.get(), c.N, c.K, c.is_signed, ds.get(), c.zeros ? dz.get() : nullptr,
                               c.group, c.bias ? db.get() : nullptr, dy.get(), work.get(), nullptr, /*tiled=*/true);
    EXPECT_TRUE(same_floats(download(dy), got)) << "gemv_f32s4_mma_staged_cuda on tiled codes differs";
    DeviceBuffer<float> dw_rows(c.N * c.K), dw_tiled(c.N * c.K);
    poison(dw_rows);
    poison(dw_tiled);
    dequantize_s4_cuda(dp.get(), c.N, c.K, c.is_signed, ds.get(), c.zeros ? dz.get() : nullptr, c.group, dw_rows.get(),
                       nullptr);
    dequantize_s4_cuda(dt.get(), c.N, c.K, c.is_signed, ds.get(), c.zeros ? dz.get() : nullptr, c.group,
                       dw_tiled.get(), nullptr, /*tiled=*/true);
    EXPECT_TRUE(same_floats(download(dw_tiled), download(dw_rows))) << "dequantize_s4_cuda of tiled codes differs";
    const double gamma = static_cast<double>(c.K / 128 + 128) * std::ldexp(1.0, -24);
    int bad = 0;
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t n = 0; n < c.N; ++n) {
        double exact = c.bias ? bias[n] : 0.0, mag = c.bias ? std::fabs(bias[n]) : 0.0, split = 0;
        for (int64_t k0 = 0; k0 < c.K; k0 += 128) {
          double amax = 0, wsum = 0;
          for (int64_t k = k0; k < k0 + 128; ++k) {
            const double xv = x[m * c.K + k], wv = w.w(n, k);
            exact += xv * wv;
            mag += std::fabs(xv * wv);
            amax = std::max(amax, std::fabs(xv));
            wsum += std::fabs(wv);
          }
          split += amax * wsum;
        }
        const double bound = gamma * mag + std::ldexp(split, -38);
        const double g = got[m * c.N + n], err = std::fabs(g - exact);
        if (bound > 0) worst = std::max(worst, err / bound);
        if (!(err <= bound) && ++bad <= 5)
          ADD_FAILURE() << "y[" << m << ", " << n << "] = " << g << ", exact " << exact << ", bound " << bound;
      }
    EXPECT_EQ(bad, 0);
  }
  std::printf("gemv_f32s4_mma_cuda: largest |error| / bound = %.3g\n", worst);
}

TEST_F(Gpu, GemvS4MmaRefusesWhatItsRulesRefuse) {
  std::string why;
  EXPECT_FALSE(gemv_f32s4_mma_supported(17, 128, 128, &why));
  EXPECT_NE(why.find("M=17"), std::string::npos) << why;
  EXPECT_FALSE(gemv_f32s4_mma_supported(1, 4104, 128, &why));
  EXPECT_NE(why.find("K=4104 not a multiple of 128"), std::string::npos) << why;
  EXPECT_FALSE(gemv_f32s4_mma_supported(1, 4096, 64, &why));
  EXPECT_NE(why.find("group_size=64 not a multiple of 128"), std::string::npos) << why;
  EXPECT_TRUE(gemv_f32s4_mma_supported(16, 14336, 128, &why)) << why;
  DeviceBuffer<float> x(128), y(4), s(4);
  DeviceBuffer<uint8_t> p(256 + 4);
  try {
    gemv_f32s4_mma_cuda(x.get(), 1, p.get() + 4, 4, 128, true, s.get(), nullptr, 128, nullptr, y.get(), nullptr);
    ADD_FAILURE() << "misaligned codes were accepted";
  } catch (const qforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("packed codes pointer not 16-byte aligned"), std::string::npos) << e.what();
  }
  try {
    gemv_f32s4_mma_staged_cuda(x.get(), 1, p.get(), 4, 128, true, s.get(), nullptr, 128, nullptr, y.get(), nullptr,
                               nullptr);
    ADD_FAILURE() << "a null workspace was accepted";
  } catch (const qforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
  }
}

// ---- one-launch int8 Linear (linear_s8_fused_cuda) ----

// The three references in a row: dynamic quantization (or the given codes with one scale), the
// exact int32 GEMM, the dequantizing epilogue.
std::vector<float> fused_linear_reference(const std::vector<float>* x, const std::vector<int8_t>* codes,
                                          float static_scale, const std::vector<int8_t>& W,
                                          const std::vector<float>& w_scale, const float* bias, int64_t M,
                                          int64_t N, int64_t K) {
  std::vector<int8_t> q(M * K);
  std::vector<float> a_scale(M, static_scale);
  if (x != nullptr) {
    kernels::quantize_rows_s8_reference(x->data(), M, K, ActScale::kPerRow, q.data(), K, a_scale.data());
  } else {
    q = *codes;
  }
  std::vector<int32_t> acc(M * N);
  kernels::gemm_s8s8s32_reference(q.data(), W.data(), acc.data(), M, N, K);
  std::vector<float> y(M * N);
  kernels::dequantize_s32_f32_reference(acc.data(), a_scale.data(), w_scale.data(), bias, y.data(), M, N);
  return y;
}

// Runs the call twice (split K: on the same workspace and tickets, which the first call must
// leave zero), output and flag poisoned before each run; both bit for bit want.
void run_fused_twice(LinearS8FusedArgs a, FusedTile tile, int64_t splits, DeviceBuffer<float>& dy,
                     DeviceBuffer<unsigned long long>& dbad, const std::vector<float>& want) {
  const int64_t ws_ints = fused_workspace_ints(a.M, a.N, a.K, splits);
  const int64_t tickets = fused_ticket_count(tile, a.M, a.N);
  DeviceBuffer<int32_t> dws(std::max<int64_t>(ws_ints, 1));
  auto dtickets = upload(std::vector<unsigned>(static_cast<size_t>(tickets), 0u));
  poison(dws);  // every partial sum the reduction reads is written first
  a.splits = splits;
  a.workspace = ws_ints > 0 ? dws.get() : nullptr;
  a.tickets = ws_ints > 0 ? dtickets.get() : nullptr;
  for (int call = 0; call < 2; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    poison(dy);
    poison(dbad);
    linear_s8_fused_cuda(a, tile, nullptr);
    check_cuda(cudaGetLastError(), "linear_s8_fused_cuda");
    EXPECT_NO_THROW(throw_if_nonfinite(dbad.get(), a.K, nullptr));
    ASSERT_TRUE(same_floats(download(dy), want));
    for (const unsigned v : download(dtickets)) ASSERT_EQ(v, 0u) << "a split-K ticket was left non-zero";
  }
}

// Every tile the rules allow on this device, dynamic and static, with and without bias, output
// poisoned with NaN before each run: bit for bit the references' result.
void run_fused_shape(int64_t M, int64_t N, int64_t K, uint32_t seed) {
  const std::vector<float> x = random_floats(M * K, 5.0f, seed, 0.03f);
  const std::vector<int8_t> codes = random_s8(M * K, seed + 1), W = random_s8(N * K, seed + 2);
  std::vector<float> w_scale = random_floats(N, 0.02f, seed + 3);
  for (float& v : w_scale) v = std::fabs(v) + 1e-4f;
  const std::vector<float> bias = random_floats(N, 3.0f, seed + 4);
  const float static_scale = 0.0173f;
  auto dx = upload(x), dws = upload(w_scale), dbias = upload(bias);
  auto dcodes = upload(codes), dW = upload(W);
  DeviceBuffer<float> dy(M * N);
  DeviceBuffer<unsigned long long> dbad(1);
  for (const bool dynamic : {true, false}) {
    for (const bool with_bias : {true, false}) {
      const std::vector<float> want = fused_linear_reference(dynamic ? &x : nullptr, dynamic ? nullptr : &codes,
                                                             static_scale, W, w_scale,
                                                             with_bias ? bias.data() : nullptr, M, N, K);
      for (int t = 0; t < kFusedTileCount; ++t)
        for (const int64_t splits : {int64_t{1}, int64_t{2}, int64_t{4}}) {
          const auto tile = static_cast<FusedTile>(t);
          if (!linear_s8_fused_supported(M, N, K, tile, linear_s8_fused_max_smem(), nullptr, splits)) continue;
          SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + " tile " +
                       fused_tile_name(tile) + " splits=" + std::to_string(splits) +
                       (dynamic ? " dynamic" : " static") + (with_bias ? " bias" : ""));
          LinearS8FusedArgs a;
          a.x = dynamic ? dx.get() : nullptr;
          a.codes = dynamic ? nullptr : dcodes.get();
          a.static_scale = static_scale;
          a.weight = dW.get();
          a.w_scale = dws.get();
          a.bias = with_bias ? dbias.get() : nullptr;
          a.y = dy.get();
          a.M = M, a.N = N, a.K = K;
          a.first_nonfinite = dbad.get();
          run_fused_twice(a, tile, splits, dy, dbad, want);
        }
    }
  }
}

TEST_F(Gpu, LinearS8FusedMatchesReferencesForEveryTileCuda) {
  struct NK {
    int64_t N, K;
  };
  // K = 800 ends on half a 64-wide tile; N = 72, 776, 3080 end inside a 64 / 128 column tile;
  // N = 13 and 1 end inside an n8 fragment (the per-element column mask).
  const NK nks[] = {{8, 32}, {72, 768}, {776, 800}, {3080, 768}, {13, 800}, {1, 32}};
  uint32_t seed = 300;
  for (const int64_t M : {int64_t{1}, int64_t{3}, int64_t{16}, int64_t{17}, int64_t{128}, int64_t{200}})
    for (const NK nk : nks) run_fused_shape(M, nk.N, nk.K, seed += 10);
  run_fused_shape(130, 768, 3072, 999);  // BERT's FFN down: the code panel at K = 3072
}

TEST_F(Gpu, LinearS8FusedDispatchTakesEveryBertShapeCuda) {
  for (const int64_t M : {int64_t{1}, int64_t{16}, int64_t{17}, int64_t{128}, int64_t{2048}}) {
    for (const auto& nk : {std::pair<int64_t, int64_t>{768, 768}, {3072, 768}, {768, 3072}}) {
      DeviceBuffer<float> x(16);
      DeviceBuffer<int8_t> w(16);
      LinearS8FusedArgs a;
      a.x = x.get();
      a.weight = w.get();
      a.M = M, a.N = nk.first, a.K = nk.second;
      FusedTile tile{};
      int64_t splits = 0;
      std::string why;
      const bool taken = linear_s8_fused_choose(a, &tile, &splits, &why);
      if (M > kFusedMaxM) {  // the chain serves large M, and the refusal says why
        EXPECT_FALSE(taken) << "M=" << M;
        EXPECT_NE(why.find("above " + std::to_string(kFusedMaxM)), std::string::npos) << why;
        continue;
      }
      EXPECT_TRUE(taken) << "M=" << M << " N=" << a.N << " K=" << a.K << ": " << why;
      EXPECT_EQ(tile, fused_tile_for(M, a.K));
      EXPECT_EQ(splits, fused_splits_for(tile, a.N, a.K));
    }
  }
}

TEST_F(Gpu, LinearS8FusedReportsFirstNonFiniteAndRefusesBadCallsCuda) {
  const int64_t M = 40, N = 72, K = 320;
  std::vector<float> x = random_floats(M * K, 2.0f, 21u);
  x[17 * K + 250] = INFINITY;
  x[33 * K + 3] = NAN;
  x[17 * K + 260] = NAN;
  auto dx = upload(x), dws = upload(std::vector<float>(N, 0.01f));
  auto dW = upload(random_s8(N * K, 5));
  DeviceBuffer<float> dy(M * N);
  DeviceBuffer<unsigned long long> dbad(1);
  LinearS8FusedArgs a;
  a.x = dx.get();
  a.weight = dW.get();
  a.w_scale = dws.get();
  a.y = dy.get();
  a.M = M, a.N = N, a.K = K;
  a.first_nonfinite = dbad.get();
  LinearS8FusedArgs bad;
  // K = 320 is 5 weight tiles: 2 slices of 3 and 2, the reporting slice 0 reads the whole row.
  DeviceBuffer<int32_t> dwork(fused_workspace_ints(M, N, K, 2));
  auto dtickets = upload(std::vector<unsigned>(static_cast<size_t>(fused_ticket_count(FusedTile::k16x64, M, N)), 0u));
  for (int t = 0; t < kFusedTileCount; ++t)
    for (const int64_t splits : {int64_t{1}, int64_t{2}}) {
      poison(dbad);
      LinearS8FusedArgs c = a;
      c.splits = splits;
      c.workspace = dwork.get();
      c.tickets = dtickets.get();
      linear_s8_fused_cuda(c, static_cast<FusedTile>(t), nullptr);
      try {
        throw_if_nonfinite(dbad.get(), K, nullptr);
        ADD_FAILURE() << "no error for non-finite input, tile " << fused_tile_name(static_cast<FusedTile>(t))
                      << " splits=" << splits;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("activation row 17 column 250 is not finite"), std::string::npos)
            << e.what();
      }
    }
  bad = a;
  bad.splits = 2;  // split K without its workspace is refused
  EXPECT_THROW(linear_s8_fused_cuda(bad, FusedTile::k16x64, nullptr), Error);
  // Refusals name the rule and launch nothing.
  bad = a;
  bad.K = 48;
  EXPECT_THROW(linear_s8_fused_cuda(bad, FusedTile::k16x64, nullptr), Error);
  bad = a;
  bad.x = dx.get() + 1;
  try {
    linear_s8_fused_cuda(bad, FusedTile::k16x64, nullptr);
    ADD_FAILURE() << "a misaligned x was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("activation pointer not 16-byte aligned"), std::string::npos) << e.what();
  }
  bad = a;
  bad.codes = reinterpret_cast<const int8_t*>(dW.get());
  EXPECT_THROW(linear_s8_fused_cuda(bad, FusedTile::k16x64, nullptr), Error);  // both x and codes
  check_cuda(cudaDeviceSynchronize(), "linear_s8_fused_cuda");
}

}  // namespace
}  // namespace qforge::cuda
