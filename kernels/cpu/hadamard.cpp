// Hadamard transform: sizes, the Paley base matrices (built once, cached), the scalar rows that
// define the result, the kernel table and its dispatcher over rows.
#include "kernels/cpu/hadamard.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/parallel_blocks.h"

namespace qforge::kernels {
namespace {

bool is_prime(int64_t q) {
  if (q < 2) return false;
  for (int64_t d = 2; d * d <= q; ++d) {
    if (q % d == 0) return false;
  }
  return true;
}

enum class Paley { kNone, kI, kII };

// Which Paley construction gives order m (I first where both do, e.g. 12 = 11 + 1 = 2(5 + 1)).
Paley paley_kind(int64_t m) {
  if (m < 4 || m % 4 != 0 || m > kHadamardMaxBaseOrder) return Paley::kNone;
  if (is_prime(m - 1) && (m - 1) % 4 == 3) return Paley::kI;
  if (is_prime(m / 2 - 1) && (m / 2 - 1) % 4 == 1) return Paley::kII;
  return Paley::kNone;
}

bool find_size(int64_t n, HadamardSize* out) {
  if (n < 1) return false;
  int64_t pow2 = 1;
  while (pow2 <= n / 2 && n % (2 * pow2) == 0) pow2 *= 2;  // pow2 <= n / 2: 2 * pow2 cannot overflow
  for (; pow2 >= 1; pow2 /= 2) {
    const int64_t m = n / pow2;
    if (m == 1 || paley_kind(m) != Paley::kNone) {
      *out = HadamardSize{pow2, m};
      return true;
    }
  }
  return false;
}

// Jacobsthal matrix entry chi(j - i) mod q (Legendre symbol; 0 on the diagonal).
std::vector<int> jacobsthal(int64_t q) {
  std::vector<bool> residue(static_cast<size_t>(q), false);
  for (int64_t k = 1; k < q; ++k) residue[static_cast<size_t>(k * k % q)] = true;
  std::vector<int> Q(static_cast<size_t>(q * q), 0);
  for (int64_t i = 0; i < q; ++i) {
    for (int64_t j = 0; j < q; ++j) {
      const int64_t d = ((j - i) % q + q) % q;
      Q[static_cast<size_t>(i * q + j)] = d == 0 ? 0 : (residue[static_cast<size_t>(d)] ? 1 : -1);
    }
  }
  return Q;
}

// The (q + 1)-order core [[0, 1ᵀ], [sign·1, Q]]: sign -1 for Paley I (skew), +1 for Paley II (a
// symmetric conference matrix).
std::vector<int> paley_core(int64_t q, int sign) {
  const std::vector<int> Q = jacobsthal(q);
  const int64_t c = q + 1;
  std::vector<int> C(static_cast<size_t>(c * c), 0);
  for (int64_t k = 1; k < c; ++k) {
    C[static_cast<size_t>(k)] = 1;
    C[static_cast<size_t>(k * c)] = sign;
  }
  for (int64_t i = 0; i < q; ++i) {
    for (int64_t j = 0; j < q; ++j) C[static_cast<size_t>((i + 1) * c + j + 1)] = Q[static_cast<size_t>(i * q + j)];
  }
  return C;
}

// Paley I: H = I + [[0, 1ᵀ], [-1, Q]]. Paley II: each 0 of the conference matrix becomes
// [[1, -1], [-1, -1]] and each ±1 becomes ±[[1, 1], [1, -1]].
std::vector<float> build_paley(int64_t m) {
  std::vector<float> B(static_cast<size_t>(m * m));
  if (paley_kind(m) == Paley::kI) {
    const std::vector<int> C = paley_core(m - 1, -1);
    for (int64_t k = 0; k < m * m; ++k) B[static_cast<size_t>(k)] = static_cast<float>(C[static_cast<size_t>(k)]);
    for (int64_t k = 0; k < m; ++k) B[static_cast<size_t>(k * m + k)] += 1.0f;
    return B;
  }
  const int64_t c = m / 2;
  const std::vector<int> C = paley_core(c - 1, 1);
  static const int kZero[2][2] = {{1, -1}, {-1, -1}};
  static const int kOne[2][2] = {{1, 1}, {1, -1}};
  for (int64_t i = 0; i < c; ++i) {
    for (int64_t j = 0; j < c; ++j) {
      const int v = C[static_cast<size_t>(i * c + j)];
      for (int di = 0; di < 2; ++di) {
        for (int dj = 0; dj < 2; ++dj) {
          B[static_cast<size_t>((2 * i + di) * m + 2 * j + dj)] =
              static_cast<float>(v == 0 ? kZero[di][dj] : v * kOne[di][dj]);
        }
      }
    }
  }
  return B;
}

// The cached base matrix and its transpose (the SIMD rows read Bᵀ rows).
struct Base {
  std::vector<float> b, bt;
};

std::unique_ptr<Base> build_base(int64_t m) {
  auto base = std::make_unique<Base>();
  base->b = m == 1 ? std::vector<float>{1.0f} : build_paley(m);
  base->bt.resize(base->b.size());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      base->bt[static_cast<size_t>(j * m + i)] = base->b[static_cast<size_t>(i * m + j)];
      float dot = 0.0f;  // B·Bᵀ = m·I: exact in float (integers below 2^24)
      for (int64_t k = 0; k < m; ++k) dot += base->b[static_cast<size_t>(i * m + k)] * base->b[static_cast<size_t>(j * m + k)];
      QF_CHECK(dot == (i == j ? static_cast<float>(m) : 0.0f), "Paley matrix of order ", m, " is not Hadamard");
    }
  }
  return base;
}

// Built outside the lock: the O(m³) check (about 1e9 MACs at m = 1020) holds up no other order.
const Base& cached_base(int64_t m) {
  static std::mutex mu;
  static std::map<int64_t, std::unique_ptr<Base>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = cache.find(m);
    if (it != cache.end()) return *it->second;
  }
  std::unique_ptr<Base> built = build_base(m);
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<Base>& slot = cache[m];
  if (slot == nullptr) slot = std::move(built);  // a thread that raced here built the same matrix
  return *slot;
}

// The first Paley orders that are not powers of two (those add nothing to m = 1), for messages.
std::string paley_orders_text() {
  std::string text;
  int listed = 0;
  for (int64_t m = 4; m <= kHadamardMaxBaseOrder && listed < 8; ++m) {
    if ((m & (m - 1)) == 0 || paley_kind(m) == Paley::kNone) continue;
    text += std::to_string(m) + ", ";
    ++listed;
  }
  return text + "...";
}

// The largest supported size below n and the smallest above (0: none in int64), base by base:
// m · 2^k just below and just above n, without walking n's neighbours one by one.
std::pair<int64_t, int64_t> nearest_sizes(int64_t n) {
  int64_t below = 0, above = 0;
  for (int64_t m = 1; m <= kHadamardMaxBaseOrder; ++m) {
    if (m != 1 && paley_kind(m) == Paley::kNone) continue;
    int64_t s = m;
    for (; s < n && s <= std::numeric_limits<int64_t>::max() / 2; s *= 2) below = std::max(below, s);
    if (s < n) {
      below = std::max(below, s);  // s * 2 would overflow: no size of this base above n
    } else if (s > n && (above == 0 || s < above)) {
      above = s;
    }
  }
  return {below, above};
}

detail::HadamardArgs make_args(float* x, int64_t n, bool transpose) {
  const HadamardSize s = hadamard_size(n);
  detail::HadamardArgs a;
  a.x = x;
  a.n = n;
  a.pow2 = s.pow2;
  a.m = s.m;
  if (s.m > 1) a.base_t = transpose ? cached_base(s.m).b.data() : cached_base(s.m).bt.data();
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  return a;
}

void run_rows(const HadamardProblem& p, detail::HadamardRowsFn rows) {
  const detail::HadamardArgs a = make_args(p.x, p.n, p.transpose);
  int64_t log2 = 0;
  while ((int64_t{1} << log2) < a.pow2) ++log2;
  const int64_t ops_per_row = p.n * (log2 + a.m);
  detail::parallel_over_blocks(p.rows, ops_per_row, [&](int64_t r0, int64_t r1) {
    std::vector<float> scratch(static_cast<size_t>(a.m));
    rows(a, r0, r1, scratch.data());
  });
}

void run_avx512(const HadamardProblem& p) { run_rows(p, detail::hadamard_rows_avx512); }
void run_avx2(const HadamardProblem& p) { run_rows(p, detail::hadamard_rows_avx2); }
void run_scalar(const HadamardProblem& p) { run_rows(p, detail::hadamard_rows_scalar); }

}  // namespace

bool hadamard_supported(int64_t n) {
  HadamardSize s;
  return find_size(n, &s);
}

HadamardSize hadamard_size(int64_t n) {
  HadamardSize s;
  if (find_size(n, &s)) return s;
  QF_REQUIRE(n >= 1, "kernels/cpu: a Hadamard transform needs a size >= 1, got ", n);
  const std::pair<int64_t, int64_t> near = nearest_sizes(n);
  throw Error(qforge::detail::str_cat(
      "kernels/cpu: no Hadamard transform of size ", n, " (sizes are 2^k * m with m = 1 or a Paley order up to ",
      kHadamardMaxBaseOrder, ": ", paley_orders_text(), "); nearest supported sizes: ", near.first, " and ",
      near.second == 0 ? std::string("none larger in int64") : std::to_string(near.second)));
}

const float* hadamard_base_matrix(int64_t m) {
  QF_REQUIRE(m == 1 || paley_kind(m) != Paley::kNone, "kernels/cpu: no Paley Hadamard matrix of order ", m,
             " (orders q + 1 for a prime q = 3 mod 4, 2(q + 1) for a prime q = 1 mod 4, up to ",
             kHadamardMaxBaseOrder, ")");
  return cached_base(m).b.data();
}

namespace detail {

void hadamard_butterfly_scalar(float* a, float* b, int64_t begin, int64_t end) {
  for (int64_t e = begin; e < end; ++e) {
    const float u = a[e], v = b[e];
    a[e] = u + v;
    b[e] = u - v;
  }
}

void hadamard_base_outputs_scalar(const HadamardArgs& a, const float* x, int64_t j_begin, float* y) {
  for (int64_t j = j_begin; j < a.m; ++j) {
    float acc = 0.0f;
    for (int64_t i = 0; i < a.m; ++i) acc = acc + x[i] * a.base_t[i * a.m + j];
    y[j] = acc * a.scale;
  }
}

void hadamard_rows_scalar(const HadamardArgs& a, int64_t r0, int64_t r1, float* scratch) {
  for (int64_t r = r0; r < r1; ++r) {
    float* x = a.x + r * a.n;
    for (int64_t h = 1; h < a.pow2; h *= 2) {
      const int64_t len = h * a.m;
      for (int64_t i = 0; i < a.n; i += 2 * len) hadamard_butterfly_scalar(x + i, x + i + len, 0, len);
    }
    if (a.m == 1) {
      for (int64_t e = 0; e < a.n; ++e) x[e] = x[e] * a.scale;
      continue;
    }
    for (int64_t blk = 0; blk < a.pow2; ++blk) {
      float* xb = x + blk * a.m;
      hadamard_base_outputs_scalar(a, xb, 0, scratch);
      for (int64_t e = 0; e < a.m; ++e) xb[e] = scratch[e];
    }
  }
}

}  // namespace detail

void hadamard_transform_reference(float* x, int64_t rows, int64_t n, bool transpose) {
  QF_REQUIRE(rows >= 0 && (rows == 0 || x != nullptr), "kernels/cpu: hadamard_transform got rows=", rows,
             x == nullptr ? " and a null pointer" : "");
  const detail::HadamardArgs a = make_args(x, n, transpose);
  std::vector<float> scratch(static_cast<size_t>(a.m));
  detail::hadamard_rows_scalar(a, 0, rows, scratch.data());
}

const KernelTable<HadamardProblem>& hadamard_kernels() {
  static const KernelTable<HadamardProblem> table{
      {"hadamard_f32_avx512", Isa::kAvx512, nullptr, nullptr, QF_KERNEL_AVX512(run_avx512)},
      {"hadamard_f32_avx2", Isa::kAvx2, nullptr, nullptr, QF_KERNEL_AVX2(run_avx2)},
      {"hadamard_f32_reference", Isa::kReference, nullptr, nullptr, run_scalar},
  };
  return table;
}

void hadamard_transform(float* x, int64_t rows, int64_t n, bool transpose, RunInfo* info) {
  QF_REQUIRE(rows >= 0 && (rows == 0 || x != nullptr), "kernels/cpu: hadamard_transform got rows=", rows,
             x == nullptr ? " and a null pointer" : "");
  hadamard_size(n);  // the size error before any kernel choice
  run_kernel_table(hadamard_kernels(), HadamardProblem{x, rows, n, transpose}, rows, info);
}

}  // namespace qforge::kernels
