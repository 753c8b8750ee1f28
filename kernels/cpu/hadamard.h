// Fast Walsh–Hadamard transform: the orthonormal Hadamard rotation of the last dimension of a
// row-major float matrix, in place, as QuaRot / SpinQuant apply online (down_proj's input). For
// n = 2^k · m the matrix is H_n = S_{2^k} ⊗ B_m (Sylvester's ±1 matrix, Kronecker product with a
// Paley base matrix B_m, m = 1 or a Paley order), scaled by 1/sqrt(n); formula in docs/rotations.md.
// hadamard_transform_reference defines the result; the AVX2 / AVX-512 rows equal it bit for bit.
// No ATen here: the ISA files include this header.
#pragma once

#include <cstdint>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

// Largest Paley base order built (a B_m costs m² floats and m MACs per element).
inline constexpr int64_t kHadamardMaxBaseOrder = 1024;

// n = pow2 · m, with m == 1 or the order of a Paley matrix (I: q + 1 for a prime q ≡ 3 mod 4;
// II: 2(q + 1) for a prime q ≡ 1 mod 4). The smallest such m is chosen (the most butterfly passes).
struct HadamardSize {
  int64_t pow2 = 1;
  int64_t m = 1;
};

// True when a Hadamard transform of size n exists here (n >= 1).
bool hadamard_supported(int64_t n);
// The decomposition of n; throws qforge::Error naming the nearest supported sizes otherwise.
HadamardSize hadamard_size(int64_t n);
// B_m, row-major m × m of ±1 (m == 1: [1]); built once per order, cached for the process, checked
// B·Bᵀ = m·I when built (O(m³): about a second at m ≈ 1020, outside the cache's lock so other
// orders are not held up). Throws qforge::Error when m is not a supported base order.
const float* hadamard_base_matrix(int64_t m);

// The definition: each of the `rows` rows of x (length n) becomes H_n · row / sqrt(n), computed as
//   1. Sylvester passes h = 1, 2, 4, ... < pow2 over blocks of m: (a, b) <- (a + b, a - b) for
//      block j and j + h (j with bit h clear), element by element;
//   2. m == 1: each element times s; m > 1: each block y_j = (sum_{i=0..m-1} B[j][i] · x_i) · s,
//      summed in order i = 0, 1, ... from 0;  s = float(1 / sqrt(double(n))).
// transpose: Hᵀ · row / sqrt(n) instead (B[i][j] in step 2; Sylvester's matrix is symmetric), the
// inverse of the transform, which the backward of the online rotation needs.
void hadamard_transform_reference(float* x, int64_t rows, int64_t n, bool transpose = false);

// One call of the kernel table: the rows of x transformed in place.
struct HadamardProblem {
  float* x = nullptr;
  int64_t rows = 0;
  int64_t n = 0;
  bool transpose = false;
};
// hadamard_f32_avx512 -> hadamard_f32_avx2 -> hadamard_f32_reference.
const KernelTable<HadamardProblem>& hadamard_kernels();

// The transform with the table's choice, rows spread over the intra-op threads; info (when given)
// names the kernel. Throws qforge::Error for an unsupported n (naming the nearest sizes).
void hadamard_transform(float* x, int64_t rows, int64_t n, bool transpose = false, RunInfo* info = nullptr);

namespace detail {

// The rows kernels' arguments: rows [r0, r1) of x, scratch of m floats (caller-owned: no
// allocation in ISA files).
struct HadamardArgs {
  float* x = nullptr;
  int64_t n = 0, pow2 = 1, m = 1;
  const float* base_t = nullptr;  // Bᵀ row-major (row i holds B[.][i]; B itself to transpose); null when m == 1
  float scale = 1.0f;
};
using HadamardRowsFn = void (*)(const HadamardArgs& a, int64_t r0, int64_t r1, float* scratch);

void hadamard_rows_scalar(const HadamardArgs& a, int64_t r0, int64_t r1, float* scratch);
void hadamard_rows_avx2(const HadamardArgs& a, int64_t r0, int64_t r1, float* scratch);
void hadamard_rows_avx512(const HadamardArgs& a, int64_t r0, int64_t r1, float* scratch);

// The scalar pieces the SIMD rows use for their tails (same operations as the reference).
void hadamard_butterfly_scalar(float* a, float* b, int64_t begin, int64_t end);
void hadamard_base_outputs_scalar(const HadamardArgs& a, const float* x, int64_t j_begin, float* y);

}  // namespace detail
}  // namespace qforge::kernels
