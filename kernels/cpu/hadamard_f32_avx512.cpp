// Hadamard transform rows, AVX-512: 16 floats per vector; passes h = 1, 2 by in-lane permutes and
// h = 4, 8 by 128-bit block shuffles, each lane's result partner + lane · (±1) (exact sign).
#include <immintrin.h>

#include "kernels/cpu/hadamard_rows.h"

namespace qforge::kernels::detail {
namespace {

struct Avx512 {
  static constexpr int64_t kLanes = 16;
  using Vec = __m512;
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec set1(float v) { return _mm512_set1_ps(v); }
  // Lanes with bit h clear get partner + self (a + b), lanes with it set partner - self (a - b).
  static Vec low_passes(Vec v) {
    const Vec s1 = _mm512_setr_ps(1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1);
    const Vec s2 = _mm512_setr_ps(1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1);
    const Vec s4 = _mm512_setr_ps(1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1);
    const Vec s8 = _mm512_setr_ps(1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1);
    v = _mm512_add_ps(_mm512_permute_ps(v, 0xB1), _mm512_mul_ps(v, s1));
    v = _mm512_add_ps(_mm512_permute_ps(v, 0x4E), _mm512_mul_ps(v, s2));
    v = _mm512_add_ps(_mm512_shuffle_f32x4(v, v, 0xB1), _mm512_mul_ps(v, s4));
    return _mm512_add_ps(_mm512_shuffle_f32x4(v, v, 0x4E), _mm512_mul_ps(v, s8));
  }
};

}  // namespace

void hadamard_rows_avx512(const HadamardArgs& a, int64_t r0, int64_t r1, float* scratch) {
  hadamard_rows_simd<Avx512>(a, r0, r1, scratch);
}

}  // namespace qforge::kernels::detail
