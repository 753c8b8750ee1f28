// Shared helpers of the kernel tests: deterministic random data, the shape sweep, ISA list.
#pragma once

#include <gtest/gtest.h>

#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/gemv_s4.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/reference.h"

namespace qforge::kernels::testing {

inline std::vector<int8_t> random_s8(size_t n, int lo, int hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<int8_t> v(n);
  for (auto& x : v) x = static_cast<int8_t>(d(rng));
  return v;
}

inline std::vector<float> random_f32(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Uniform floats rounded through float16 (as at::kHalf rounds): int4 group scales must be
// fp16-exact, since PackedLinearS4 stores them as IEEE float16.
inline std::vector<float> random_f16_exact(size_t n, float lo, float hi, uint32_t seed) {
  std::vector<float> v = random_f32(n, lo, hi, seed);
  for (auto& x : v) x = static_cast<float>(c10::Half(x));
  return v;
}

// Sizes that break kernels: 1-10, multiples of 16, powers of two +-1.
inline const std::vector<int64_t>& sweep_sizes() {
  static const std::vector<int64_t> s{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65};
  return s;
}
inline const std::vector<int64_t>& sweep_rows() {
  static const std::vector<int64_t> m{1, 2, 3, 7, 16};
  return m;
}
inline constexpr int64_t kDeepK = 4096 + 3;

// ISA levels usable on this machine, highest first (each test runs once per level).
inline std::vector<Isa> usable_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kAvx512Vnni, Isa::kAvx512, Isa::kAvx2, Isa::kReference}) {
    if (isa_usable(isa)) out.push_back(isa);
  }
  return out;
}

// True when this machine can run kernels of level `isa` (compiled in, CPU support), whatever the
// cap: tests run table entries directly with it.
inline bool machine_has(Isa isa) {
  return isa_compiled(isa) && static_cast<int>(cpu_isa()) >= static_cast<int>(isa);
}

// Bitwise equality of two float arrays, reporting the first difference.
inline ::testing::AssertionResult bitwise_equal(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "index " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename T>
::testing::AssertionResult exact_equal(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) {
      return ::testing::AssertionFailure() << "index " << i << ": " << +a[i] << " vs " << +b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

struct S8Weights {
  std::vector<int8_t> w, data;
  std::vector<int32_t> colsum;
  S8N16K4View view;
};

// Random int8 weights [N, K] in [-128, 127] and their n16k4 packing.
inline S8Weights make_s8(int64_t N, int64_t K, uint32_t seed) {
  S8Weights p;
  p.w = random_s8(N * K, -128, 127, seed);
  p.data.resize(round_up(N, 16) * round_up(K, 4));
  p.colsum.resize(round_up(N, 16));
  pack_s8_n16k4_reference(p.w.data(), N, K, p.data.data(), p.colsum.data());
  p.view = {p.data.data(), p.colsum.data(), N, K, round_up(K, 4)};
  return p;
}

struct S4Weights {
  std::vector<int8_t> w;
  std::vector<float> scale;
  std::vector<int32_t> zero;
  std::vector<uint8_t> data;
  std::vector<Fp16Bits> scales;
  std::vector<int8_t> zeros;
  S4N16K8View view;
};

// Random 4-bit grid values in [qmin, qmin + 15] with fp16-exact group scales and zero points, packed n16k8.
inline S4Weights make_s4(int64_t N, int64_t K, int64_t g, int qmin, uint32_t seed) {
  const int64_t G = num_groups(K, g), np = round_up(N, 16), kp = round_up(K, 8);
  S4Weights p;
  p.w = random_s8(N * K, qmin, qmin + 15, seed);
  p.scale = random_f16_exact(N * G, 0.001f, 0.2f, seed + 1);
  const auto z = random_s8(N * G, qmin, qmin + 15, seed + 2);
  p.zero.assign(z.begin(), z.end());
  p.data.resize(np * kp / 2);
  p.scales.resize(np * G);
  p.zeros.resize(np * G);
  pack_s4_n16k8_reference(p.w.data(), N, K, qmin, p.data.data());
  pack_s4_group_meta(p.scale.data(), p.zero.data(), N, G, qmin, p.scales.data(), p.zeros.data());
  p.view = {p.data.data(), p.scales.data(), p.zeros.data(), N, K, kp, g, G};
  return p;
}

// Symmetric qint4 groups of 32 (GGUF Q4_0's grid) with fp16-exact scales, packed n16b32 (the view's
// data is `data`; scales and zeros are left empty); w, scale and zero as make_s4's. negative_scales:
// every other block's scale negated, as llama.cpp's Q4_0 quantizer writes about half its blocks.
inline S4Weights make_s4_n16b32(int64_t N, int64_t K, uint32_t seed, bool negative_scales = false) {
  S4Weights n16k8 = make_s4(N, K, std::min<int64_t>(kS4B32K, K), -8, seed);
  S4Weights p;
  p.w = n16k8.w;
  p.scale = n16k8.scale;
  if (negative_scales)
    for (size_t i = 0; i < p.scale.size(); i += 2) p.scale[i] = -p.scale[i];
  p.zero.assign(n16k8.zero.size(), 0);
  std::vector<int8_t> zero_codes(n16k8.zeros.size());
  pack_s4_group_meta(p.scale.data(), nullptr, N, n16k8.view.groups, -8, n16k8.scales.data(), zero_codes.data());
  p.data.resize(round_up(N, kS4BlockN) / kS4BlockN * s4_b32_column_bytes(n16k8.view.groups));
  pack_s4_n16b32_reference(n16k8.data.data(), n16k8.scales.data(), N, K, p.data.data());
  p.view = n16k8.view;
  p.view.data = p.data.data();
  p.view.scales = nullptr;
  p.view.zeros = nullptr;
  p.view.layout = S4Layout::kN16B32;
  return p;
}

}  // namespace qforge::kernels::testing
