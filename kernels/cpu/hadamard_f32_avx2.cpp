// Hadamard transform rows, AVX2: 8 floats per vector; passes h = 1, 2, 4 inside a vector by lane
// permutes, each lane's result partner + lane · (±1) (exact sign, so a + b and a - b as the reference).
#include <immintrin.h>

#include "kernels/cpu/hadamard_rows.h"

namespace qforge::kernels::detail {
namespace {

struct Avx2 {
  static constexpr int64_t kLanes = 8;
  using Vec = __m256;
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec set1(float v) { return _mm256_set1_ps(v); }
  // Lanes with bit h clear get partner + self (a + b), lanes with it set partner - self (a - b).
  static Vec low_passes(Vec v) {
    const Vec s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const Vec s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const Vec s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    v = _mm256_add_ps(_mm256_permute_ps(v, 0xB1), _mm256_mul_ps(v, s1));
    v = _mm256_add_ps(_mm256_permute_ps(v, 0x4E), _mm256_mul_ps(v, s2));
    return _mm256_add_ps(_mm256_permute2f128_ps(v, v, 0x01), _mm256_mul_ps(v, s4));
  }
};

}  // namespace

void hadamard_rows_avx2(const HadamardArgs& a, int64_t r0, int64_t r1, float* scratch) {
  hadamard_rows_simd<Avx2>(a, r0, r1, scratch);
}

}  // namespace qforge::kernels::detail
