// gemv_f32lut_avx2: the codebook Linear on AVX2 + FMA (kernels/cpu/lut_linear.h, layout in lut_layout.h). A 16-entry
// table is two 8-float halves: VPERMPS looks a lane up in both (it reads the low 3 bits) and index
// bit 3 picks one (VBLENDVPS on the sign bit of idx << 28). Each 16-lane accumulator of the
// reference is two ymm halves doing the same fmaf sequence, then the same reduction, so results
// equal linear_f32_lut_reference bit for bit. Compiled with -mavx2 -mfma.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/lut_layout.h"

namespace qforge::kernels::detail {

namespace {

// Moves index bit 3 to the sign bit, which VBLENDVPS tests.
constexpr int kBit3ToSign = 28;
constexpr int64_t kCacheLine = 64;
constexpr int64_t kBlocksPerLine = kCacheLine / kLutBlockBytes;

// As in gemv_f32lut_avx512: prefetch the rows kLutRowBlock ahead at the position being read (the
// hardware prefetcher alone leaves DRAM bandwidth unused); an address past the buffer is a
// harmless hint, formed as an integer.
inline void prefetch(const void* base, int64_t byte_offset) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(base) + byte_offset), _MM_HINT_T0);
}

inline __m256 lookup(__m256i idx, __m256 lo, __m256 hi) {
  const __m256 from_lo = _mm256_permutevar8x32_ps(lo, idx);
  const __m256 from_hi = _mm256_permutevar8x32_ps(hi, idx);
  return _mm256_blendv_ps(from_lo, from_hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, kBit3ToSign)));
}

// Rows [n0, n0 + R) for x row m; P planes of 8 / P stored bits. 16 ymm registers: R * P * 2
// accumulators and R * 2 table halves.
template <int P, int R>
void tile(const LutArgs& a, int64_t n0, int64_t m) {
  constexpr int kShift = 8 / P;
  constexpr int64_t kBlock = kLutEntries * P;
  constexpr int kHalf = 8;
  const int64_t nb = a.kp / kBlock, row_bytes = nb * kLutBlockBytes;
  const int64_t blocks_per_group = a.groups > 1 ? a.group_size / kBlock : nb;
  const float* x = a.x + m * a.ldx;
  const uint8_t* w[R];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) w[r] = a.packed + (n0 + r) * row_bytes;

  __m256 acc[R][P][2];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 8
    for (int p = 0; p < P; ++p) acc[r][p][0] = acc[r][p][1] = _mm256_setzero_ps();

  for (int64_t g = 0, b0 = 0; b0 < nb; ++g, b0 += blocks_per_group) {
    __m256 tlo[R], thi[R];
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float* t = a.tables + ((n0 + r) * a.groups + g) * kLutEntries;
      tlo[r] = _mm256_loadu_ps(t);
      thi[r] = _mm256_loadu_ps(t + kHalf);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      prefetch(a.tables,
               ((n0 + kLutRowBlock + r) * a.groups + g) * kLutEntries * static_cast<int64_t>(sizeof(float)));
    }
    // Not std::min: its instance would be one symbol shared by files built with other -m flags.
    const int64_t b1 = nb < b0 + blocks_per_group ? nb : b0 + blocks_per_group;
    for (int64_t b = b0; b < b1; ++b) {
      if (b % kBlocksPerLine == 0) {
        #pragma GCC unroll 8
        for (int r = 0; r < R; ++r) prefetch(w[r], kLutRowBlock * row_bytes + b * kLutBlockBytes);
      }
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[r] + b * kLutBlockBytes));
        const __m256i lanes[2] = {_mm256_cvtepu8_epi32(bytes), _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, kHalf))};
        #pragma GCC unroll 8
        for (int p = 0; p < P; ++p) {
          #pragma GCC unroll 2
          for (int h = 0; h < 2; ++h) {
            const __m256i idx = p == 0 ? lanes[h] : _mm256_srli_epi32(lanes[h], p * kShift);
            const __m256 xv = _mm256_loadu_ps(x + b * kBlock + p * kLutEntries + h * kHalf);
            acc[r][p][h] = _mm256_fmadd_ps(xv, lookup(idx, tlo[r], thi[r]), acc[r][p][h]);
          }
        }
      }
    }
  }

  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    __m256 lo = acc[r][0][0], hi = acc[r][0][1];
    #pragma GCC unroll 8
    for (int p = 1; p < P; ++p) {
      lo = _mm256_add_ps(lo, acc[r][p][0]);
      hi = _mm256_add_ps(hi, acc[r][p][1]);
    }
    // Widths 8 (the two halves), 4, 2, 1 of the reference.
    const __m256 t8 = _mm256_add_ps(lo, hi);
    const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
    const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    const float t = _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
    a.y[m * a.ldy + n0 + r] = a.bias != nullptr ? t + a.bias[n0 + r] : t;
  }
}

// Weight rows per tile: two for 4-bit storage (8 accumulators), one for 2-bit (already 8).
template <int P>
constexpr int kTileRows = P == 2 ? 2 : 1;

template <int P>
void run(const LutArgs& a, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + kTileRows<P> <= n1; n += kTileRows<P>) {
    for (int64_t m = 0; m < a.m; ++m) tile<P, kTileRows<P>>(a, n, m);
  }
  for (; n < n1; ++n) {
    for (int64_t m = 0; m < a.m; ++m) tile<P, 1>(a, n, m);
  }
}

}  // namespace

void gemv_f32lut_avx2(const LutArgs& a, int64_t n0, int64_t n1) {
  if (a.storage_bits == 2) {
    run<4>(a, n0, n1);
  } else {
    run<2>(a, n0, n1);
  }
}

}  // namespace qforge::kernels::detail
