// When cuBLASLt can run qforge's int8 GEMM C[M, N] (int32) = A[M, K] (int8) x W[N, K]^T (int8).
// Pure host code (no CUDA headers) so the CPU test suite checks it. The rules are the ones
// cuBLASLt documents for IMMA (int8 tensor-core) kernels with the regular (non-COL32) ordering:
//   - only the "TN" form: cuBLASLt's A operand transposed, B not transposed;
//   - cuBLASLt's m and k multiples of 4;
//   - leading dimensions of A, B and C multiples of 4;
//   - every matrix pointer 4-byte aligned (16 bytes is faster).
// Row-major qforge matrices are column-major transposes, so qforge computes C^T = W * A^T: the
// weight is cuBLASLt's A (op T, [K, N] column-major, ld = ldb), the activation is cuBLASLt's B
// (op N, [K, M] column-major, ld = lda), C^T is [N, M] column-major (ld = ldc). cuBLASLt's
// (m, n, k) is therefore qforge's (N, M, K): N and K must be multiples of 4, M is free.
#pragma once

#include <cstdint>
#include <string>

namespace qforge::cuda {

// IMMA with the regular ordering needs these multiples (cuBLASLt documentation).
constexpr int64_t kImmaDimMultiple = 4;
constexpr int64_t kImmaLdMultiple = 4;
constexpr uintptr_t kImmaPointerAlignment = 4;

// True when cuBLASLt's int8 path accepts the shapes. lda: row stride of A [M, K] (activations);
// ldb: row stride of W [N, K] (weights); ldc: row stride of C [M, N]; all in elements.
// Otherwise false, with the first failing rule written to *why (when why is not null).
inline bool cublaslt_int8_supported(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                                    int64_t ldc, std::string* why) {
  auto fail = [why](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  const auto s = [](int64_t v) { return std::to_string(v); };
  if (M <= 0 || N <= 0 || K <= 0)
    return fail("empty problem M=" + s(M) + " N=" + s(N) + " K=" + s(K));
  if (lda < K) return fail("lda=" + s(lda) + " < K=" + s(K));
  if (ldb < K) return fail("ldb=" + s(ldb) + " < K=" + s(K));
  if (ldc < N) return fail("ldc=" + s(ldc) + " < N=" + s(N));
  if (N % kImmaDimMultiple != 0)
    return fail("N=" + s(N) + " not a multiple of 4 (cuBLASLt IMMA m)");
  if (K % kImmaDimMultiple != 0)
    return fail("K=" + s(K) + " not a multiple of 4 (cuBLASLt IMMA k)");
  if (lda % kImmaLdMultiple != 0) return fail("lda=" + s(lda) + " not a multiple of 4");
  if (ldb % kImmaLdMultiple != 0) return fail("ldb=" + s(ldb) + " not a multiple of 4");
  if (ldc % kImmaLdMultiple != 0) return fail("ldc=" + s(ldc) + " not a multiple of 4");
  if (why != nullptr) why->clear();
  return true;
}

// True when the three matrix pointers meet IMMA's 4-byte alignment; else false with the reason.
inline bool cublaslt_int8_pointers_supported(const void* a, const void* w, const void* c,
                                             std::string* why) {
  const struct {
    const char* name;
    const void* p;
  } ptrs[] = {{"A", a}, {"W", w}, {"C", c}};
  for (const auto& x : ptrs) {
    if (reinterpret_cast<uintptr_t>(x.p) % kImmaPointerAlignment != 0) {
      if (why != nullptr) *why = std::string(x.name) + " pointer not 4-byte aligned";
      return false;
    }
  }
  if (why != nullptr) why->clear();
  return true;
}

}  // namespace qforge::cuda
