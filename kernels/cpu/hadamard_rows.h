// The row loop of the Hadamard kernels, shared by the ISA files (each instantiates it with its own
// vector type and flags). V: kLanes floats per Vec, load / store / add / sub / mul / set1, and
// low_passes(v) (the Sylvester passes h = 1 .. kLanes/2 inside one vector, in the reference's
// order). Every element sees the reference's operations in its order, so results are bit-equal.
#pragma once

#include "kernels/cpu/hadamard.h"

namespace qforge::kernels::detail {
namespace {

// (a, b) <- (a + b, a - b) over len floats: vectors, then the scalar tail.
template <class V>
void hadamard_butterfly(float* a, float* b, int64_t len) {
  constexpr int64_t L = V::kLanes;
  int64_t e = 0;
  for (; e + L <= len; e += L) {
    const typename V::Vec va = V::load(a + e), vb = V::load(b + e);
    V::store(a + e, V::add(va, vb));
    V::store(b + e, V::sub(va, vb));
  }
  hadamard_butterfly_scalar(a, b, e, len);
}

// y_j = (sum_i B[j][i] · x_i) · s for one block: L outputs per vector (B[j][i] = ±1, so the
// product is exact and the sum the reference's), the tail scalar; then y back into x.
template <class V>
void hadamard_base_block(const HadamardArgs& a, float* x, float* y) {
  constexpr int64_t L = V::kLanes;
  const int64_t m = a.m;
  int64_t j = 0;
  for (; j + L <= m; j += L) {
    typename V::Vec acc = V::set1(0.0f);
    for (int64_t i = 0; i < m; ++i) acc = V::add(acc, V::mul(V::set1(x[i]), V::load(a.base_t + i * m + j)));
    V::store(y + j, V::mul(acc, V::set1(a.scale)));
  }
  hadamard_base_outputs_scalar(a, x, j, y);
  for (int64_t e = 0; e < m; ++e) x[e] = y[e];
}

template <class V>
void hadamard_rows_simd(const HadamardArgs& a, int64_t r0, int64_t r1, float* scratch) {
  constexpr int64_t L = V::kLanes;
  for (int64_t r = r0; r < r1; ++r) {
    float* x = a.x + r * a.n;
    int64_t h = 1;
    if (a.m == 1 && a.pow2 >= L) {
      // Passes h < L only mix lanes of one vector: all of them per vector, then h = L on.
      for (int64_t e = 0; e < a.n; e += L) V::store(x + e, V::low_passes(V::load(x + e)));
      h = L;
    }
    for (; h < a.pow2; h *= 2) {
      const int64_t len = h * a.m;  // blocks j .. j + h - 1 are contiguous, as are their partners
      for (int64_t i = 0; i < a.n; i += 2 * len) hadamard_butterfly<V>(x + i, x + i + len, len);
    }
    if (a.m > 1) {
      for (int64_t blk = 0; blk < a.pow2; ++blk) hadamard_base_block<V>(a, x + blk * a.m, scratch);
      continue;
    }
    const typename V::Vec s = V::set1(a.scale);
    int64_t e = 0;
    for (; e + L <= a.n; e += L) V::store(x + e, V::mul(V::load(x + e), s));
    for (; e < a.n; ++e) x[e] = x[e] * a.scale;
  }
}

}  // namespace
}  // namespace qforge::kernels::detail
