// Small-M int8 x int4 GEMM on AVX-512 VNNI with per-group scales, float output.
// Weights are unsigned 4-bit codes u = w - qmin in [0, 15], so they are VPDPBUSD's unsigned
// operand and the int8 activations its signed one: no +128 offset is needed. Per group g:
//   acc_g = sum_k u * a - z'[n, g] * sum_k a      (z' = z - qmin, the zero point as a code)
// then t = fma(float(acc_g), scale[n, g], t) per lane, groups in order, exactly as
// gemm_s8s4f32_reference. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/s4_tile_epilogue_avx512.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {

namespace {

constexpr int kNibbleMask = 0x0F;

// One row: up to 4 column blocks (8 int + 4 float accumulators). Several rows: one block of
// 16 columns (its K/2-byte panel stays in L1) times up to 4 rows.
struct Kernel {
  using Args = GemvS4Args;
  static constexpr int kMaxRows = 4;
  static constexpr int kMaxBlocks = 4;
  // The driver below: one row takes up to 4 blocks, several rows one block.
  static constexpr bool tile_used(int mr, int nr) { return mr == 1 || nr == 1; }

  template <int MR, int NR>
  static void tile(const GemvS4Args& args, int64_t m0, int64_t nb0) {
    const S4N16K8View& w = args.w;
    const int64_t kblocks = w.kp / kS4BlockK;
    const int64_t blocks_per_group = w.group_size / kS4BlockK;
    const uint8_t* wp[NR];
    block_pointers(w.data, nb0, kblocks * kS4BlockBytes, wp);
    const int8_t* ap[MR];
    row_pointers(args.a, m0, args.lda, ap);
    const __m512i nibble = _mm512_set1_epi8(kNibbleMask);

    alignas(64) float t[MR][NR][kS4BlockN];
    std::memset(t, 0, sizeof(t));
    alignas(64) int32_t sums[MR][NR][kS4BlockN];

    for (int64_t g = 0; g < w.groups; ++g) {
      __m512i lo_acc[MR][NR], hi_acc[MR][NR];  // two chains halve the VPDPBUSD dependency
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r)
        #pragma GCC unroll 16
        for (int c = 0; c < NR; ++c) lo_acc[r][c] = hi_acc[r][c] = _mm512_setzero_si512();
      const int64_t kb_end =
          (g + 1) * blocks_per_group < kblocks ? (g + 1) * blocks_per_group : kblocks;
      for (int64_t kb = g * blocks_per_group; kb < kb_end; ++kb) {
        __m512i a_lo[MR], a_hi[MR];
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          a_lo[r] = _mm512_set1_epi32(load_u32(ap[r] + kb * kS4BlockK));
          a_hi[r] = _mm512_set1_epi32(load_u32(ap[r] + kb * kS4BlockK + kS8BlockK));
        }
        #pragma GCC unroll 16
        for (int c = 0; c < NR; ++c) {
          const __m512i v = _mm512_loadu_si512(wp[c] + kb * kS4BlockBytes);
          const __m512i lo = _mm512_and_si512(v, nibble);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, kS4NibbleBits), nibble);
          #pragma GCC unroll 16
          for (int r = 0; r < MR; ++r) {
            lo_acc[r][c] = _mm512_dpbusd_epi32(lo_acc[r][c], lo, a_lo[r]);
            hi_acc[r][c] = _mm512_dpbusd_epi32(hi_acc[r][c], hi, a_hi[r]);
          }
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < MR; ++r)
        #pragma GCC unroll 16
        for (int c = 0; c < NR; ++c) {
          _mm512_store_si512(sums[r][c], _mm512_add_epi32(lo_acc[r][c], hi_acc[r][c]));
        }
      s4_fold_group<MR, NR>(args, m0, nb0, g, sums, t);
    }
    s4_finish_tile<MR, NR>(args, m0, nb0, t);
  }
};

}  // namespace

void gemv_s8s4f32_n16k8_avx512vnni(const GemvS4Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end, args.m == 1 ? Kernel::kMaxBlocks : 1, [](int64_t, int) {});
}

}  // namespace qforge::kernels::detail
