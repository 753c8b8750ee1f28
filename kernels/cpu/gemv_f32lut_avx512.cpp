// gemv_f32lut_avx512: the codebook Linear with VPERMPS table look-ups (kernels/cpu/lut_linear.h, layout in lut_layout.h).
// A tile of R output rows x MR x rows: per weight row one 16-byte load, one zero-extension to 16
// lanes, and per plane a shift and one VPERMPS into the row's 16-entry table; each looked-up
// vector feeds MR fused multiply-adds, each x vector R of them. Lane l of plane a's accumulator
// does exactly the fmaf sequence of linear_f32_lut_reference, then the same reduction, so the
// result is bit for bit the reference's. Compiled with -mavx512f (and BW/VL/DQ).
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/lut_layout.h"

// "#pragma GCC unroll" on the register-tile loops keeps the accumulators in registers (GCC 12
// otherwise unrolls them too late), as in the other AVX-512 GEMV kernels.
namespace qforge::kernels::detail {

namespace {

constexpr int kRows = static_cast<int>(kLutRowBlock);
constexpr int64_t kCacheLine = 64;
constexpr int64_t kBlocksPerLine = kCacheLine / kLutBlockBytes;

// The hardware prefetcher alone leaves a single core at about half its DRAM bandwidth on these
// interleaved row streams (measured, docs/kernels.md): each tile also prefetches the next tile's
// rows at the position it reads. An address past the buffer (last tile) is a harmless hint, so it
// is formed as an integer, not by pointer arithmetic.
inline void prefetch(const void* base, int64_t byte_offset) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(base) + byte_offset), _MM_HINT_T0);
}

// t[0] of the reference's reduction of one 16-lane sum: widths 8, 4, 2, 1.
inline float reduce16(__m512 s) {
  const __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

// Rows [n0, n0 + R) x x rows [m0, m0 + MR); P planes of 8 / P stored bits.
template <int P, int R, int MR>
void tile(const LutArgs& a, int64_t n0, int64_t m0) {
  constexpr int kShift = 8 / P;
  constexpr int64_t kBlock = kLutEntries * P;
  const int64_t nb = a.kp / kBlock, row_bytes = nb * kLutBlockBytes;
  const int64_t blocks_per_group = a.groups > 1 ? a.group_size / kBlock : nb;
  const uint8_t* w[R];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) w[r] = a.packed + (n0 + r) * row_bytes;
  const float* x[MR];
  #pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) x[i] = a.x + (m0 + i) * a.ldx;

  __m512 acc[MR][R][P];
  #pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      #pragma GCC unroll 8
      for (int p = 0; p < P; ++p) acc[i][r][p] = _mm512_setzero_ps();

  for (int64_t g = 0, b0 = 0; b0 < nb; ++g, b0 += blocks_per_group) {
    __m512 table[R];
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) table[r] = _mm512_loadu_ps(a.tables + ((n0 + r) * a.groups + g) * kLutEntries);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      prefetch(a.tables, ((n0 + R + r) * a.groups + g) * kLutEntries * static_cast<int64_t>(sizeof(float)));
    }
    // Not std::min: its instance would be one symbol shared by files built with other -m flags.
    const int64_t b1 = nb < b0 + blocks_per_group ? nb : b0 + blocks_per_group;
    for (int64_t b = b0; b < b1; ++b) {
      if (b % kBlocksPerLine == 0) {
        #pragma GCC unroll 8
        for (int r = 0; r < R; ++r) prefetch(w[r], R * row_bytes + b * kLutBlockBytes);
      }
      __m512 xv[MR][P];
      #pragma GCC unroll 8
      for (int i = 0; i < MR; ++i)
        #pragma GCC unroll 8
        for (int p = 0; p < P; ++p) xv[i][p] = _mm512_loadu_ps(x[i] + b * kBlock + p * kLutEntries);
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i lanes = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[r] + b * kLutBlockBytes)));
        #pragma GCC unroll 8
        for (int p = 0; p < P; ++p) {
          // VPERMPS reads the low 4 bits; the tables repeat every 2^bits entries, so the bits of
          // the planes above need no mask.
          const __m512i idx = p == 0 ? lanes : _mm512_srli_epi32(lanes, p * kShift);
          const __m512 wv = _mm512_permutexvar_ps(idx, table[r]);
          #pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) acc[i][r][p] = _mm512_fmadd_ps(xv[i][p], wv, acc[i][r][p]);
        }
      }
    }
  }

  #pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512 s = acc[i][r][0];
      #pragma GCC unroll 8
      for (int p = 1; p < P; ++p) s = _mm512_add_ps(s, acc[i][r][p]);
      const float t = reduce16(s);
      a.y[(m0 + i) * a.ldy + n0 + r] = a.bias != nullptr ? t + a.bias[n0 + r] : t;
    }
  }
}

// Every x row against the same R weight rows, which stay in L1 from one x row to the next. Pairs
// of x rows share each look-up; a tile holds at most 16 accumulators (MR * R * P), so with four
// planes (2-bit) a pair of x rows takes a pair of weight rows.
template <int P, int R>
void rows(const LutArgs& a, int64_t n0) {
  int64_t m = 0;
  if constexpr (P == 2) {
    for (; m + 2 <= a.m; m += 2) tile<P, R, 2>(a, n0, m);
  } else {
    for (; m + 2 <= a.m; m += 2) {
      for (int r = 0; r + 2 <= R; r += 2) tile<P, 2, 2>(a, n0 + r, m);
      if constexpr (R % 2 == 1) tile<P, 1, 2>(a, n0 + R - 1, m);
    }
  }
  for (; m < a.m; ++m) tile<P, R, 1>(a, n0, m);
}

template <int P>
void run(const LutArgs& a, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + kRows <= n1; n += kRows) rows<P, kRows>(a, n);
  switch (n1 - n) {
    case 3: rows<P, 3>(a, n); break;
    case 2: rows<P, 2>(a, n); break;
    case 1: rows<P, 1>(a, n); break;
    default: break;
  }
}

static_assert(kRows == 4, "the tail switch above covers 1 .. kRows - 1 rows");

}  // namespace

void gemv_f32lut_avx512(const LutArgs& a, int64_t n0, int64_t n1) {
  if (a.storage_bits == 2) {
    run<4>(a, n0, n1);
  } else {
    run<2>(a, n0, n1);
  }
}

}  // namespace qforge::kernels::detail
