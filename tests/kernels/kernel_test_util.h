// Shared helpers of the kernel tests: deterministic random data, the shape sweep, ISA list.
#pragma once

#include <gtest/gtest.h>

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/isa.h"

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

}  // namespace qforge::kernels::testing
