// Prefill GEMM on AVX-512 VNNI: block-32 int8 activations x n16k8 (or n16b32) int4 weights with
// per-group fp16 scales, float out (linear_q8b32_s4_reference bit for bit; the numerics of
// gemv_q8s4f32_n16k8_avx512vnni, in larger tiles). A 4-row x 2-block register tile keeps one
// int32 accumulator per row, column block and 32-value block b; it starts at -z' * s_b (one
// VPDPWSSD: -z' in the low int16 of each lane, s_b's low int16 broadcast, high halves times 0),
// VPDPBUSD adds sum u * q (u = w - qmin the unsigned operand), then per block and group
//   u = fma(float(i_b), d_b, u),  t = fma(u, scale, t)  (t in an L1 buffer, once per group).
// Compiled with the AVX-512 VNNI flags.
#include <immintrin.h>

#include "kernels/cpu/gemm_q8_kernels.h"
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {

namespace {

constexpr int kLowInt16 = 0x0000FFFF;  // the low int16 of an int32 lane

template <S4Layout L>
struct Kernel {
  using Args = GemvQ8S4Args;
  static constexpr int kMaxRows = 4;
  static constexpr int kMaxBlocks = 2;

  // Block b of every tile row into u: the int32 dot products, their zero-point term, one float FMA.
  template <int MR, int NR>
  __attribute__((always_inline)) static void block(const GemvQ8S4Args& args, int64_t m0, int64_t b, int64_t octs,
                                                   const TileOperands<MR, NR, uint8_t, int8_t>& op,
                                                   const __m512i (&zneg)[NR], __m512 (&u)[MR][NR]) {
    const __m512i nibble = _mm512_set1_epi8(kS4NibbleMask);
    __m512i acc[MR][NR];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512i s = _mm512_set1_epi32(args.s[(m0 + r) * args.kb + b]);
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), zneg[c], s);
    }
    // The block's octs lie 64 bytes apart in either layout: one base address per operand, and a
    // constant trip count for whole blocks. Computing each n16b32 oct's offset (divisions by the
    // pair) in a loop of run-time length made GCC 12 also copy the accumulators every oct: the
    // n16b32 GEMM took 1.08-1.21x the n16k8 one's time, now 0.82-0.90x (qbench
    // model_llama_prefill_gemm, q4_0 against q4 rows of one run, docs/performance.md).
    const int64_t o0 = b * kOctsPerBlock;
    const uint8_t* wp[NR];
    const int8_t* ap[MR];
    #pragma GCC unroll 16
    for (int c = 0; c < NR; ++c) wp[c] = op.w[c] + s4_oct_offset<L>(o0);
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) ap[r] = op.a[r] + o0 * kS4BlockK;
    const auto oct = [&](int64_t i) __attribute__((always_inline)) {
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) {
        const __m512i v = _mm512_loadu_si512(wp[c] + i * kS4BlockBytes);
        const __m512i lo = _mm512_and_si512(v, nibble);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, kS4NibbleBits), nibble);
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], lo, _mm512_set1_epi32(load_u32(ap[r] + i * kS4BlockK)));
          acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], hi,
                                          _mm512_set1_epi32(load_u32(ap[r] + i * kS4BlockK + kS8BlockK)));
        }
      }
    };
    const int64_t n = chunk_end(b, kOctsPerBlock, octs) - o0;
    if (n == kOctsPerBlock) {
      #pragma GCC unroll 4
      for (int64_t i = 0; i < kOctsPerBlock; ++i) oct(i);
    } else {
      for (int64_t i = 0; i < n; ++i) oct(i);
    }
    #pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 d = _mm512_set1_ps(args.d[(m0 + r) * args.kb + b]);
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) u[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][c]), d, u[r][c]);
    }
  }

  template <int MR, int NR>
  static void tile(const GemvQ8S4Args& args, int64_t m0, int64_t nb0) {
    const S4N16K8View& w = args.w;
    const int64_t octs = w.kp / kS4BlockK;
    const int64_t blocks_per_group = w.groups == 1 ? args.kb : w.group_size / (kOctsPerBlock * kS4BlockK);
    const TileOperands<MR, NR, uint8_t, int8_t> op(w.data, nb0, s4_column_block_offset(w, 1), args.q, m0, args.ldq);
    alignas(64) float t[MR][NR][kAvx512Lanes] = {};
    for (int64_t g = 0; g < w.groups; ++g) {
      __m512i zneg[NR];
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) {
        __m512i z;
        __m512 scale;
        s4_group_meta(w, nb0 + c, g, z, scale);
        zneg[c] = _mm512_and_si512(_mm512_sub_epi32(_mm512_setzero_si512(), z), _mm512_set1_epi32(kLowInt16));
      }
      __m512 u[MR][NR];
      fill_tile(u, _mm512_setzero_ps());
      const int64_t b_end = chunk_end(g, blocks_per_group, args.kb);
      for (int64_t b = g * blocks_per_group; b < b_end; ++b) block<MR, NR>(args, m0, b, octs, op, zneg, u);
      #pragma GCC unroll 16
      for (int c = 0; c < NR; ++c) {
        __m512i z;
        __m512 scale;
        s4_group_meta(w, nb0 + c, g, z, scale);
        #pragma GCC unroll 16
        for (int r = 0; r < MR; ++r)
          _mm512_store_ps(t[r][c], _mm512_fmadd_ps(u[r][c], scale, _mm512_load_ps(t[r][c])));
      }
    }
    store_columns<MR, NR>(args.y, args.ldy, m0, nb0, w.n, nullptr, args.bias, [&](int r, int c, __m512, __m512 bias) {
      return _mm512_add_ps(_mm512_load_ps(t[r][c]), bias);
    });
  }
};

}  // namespace

void gemm_q8s4f32_n16k8_avx512vnni(const GemvQ8S4Args& args, int64_t nb_begin, int64_t nb_end) {
  using K = Kernel<S4Layout::kN16K8>;
  for_each_tile<K>(args, nb_begin, nb_end, K::kMaxBlocks, [](int64_t, int) {});
}

void gemm_q8s4f32_n16b32_avx512vnni(const GemvQ8S4Args& args, int64_t nb_begin, int64_t nb_end) {
  using K = Kernel<S4Layout::kN16B32>;
  for_each_tile<K>(args, nb_begin, nb_end, K::kMaxBlocks, [](int64_t, int) {});
}

}  // namespace qforge::kernels::detail
