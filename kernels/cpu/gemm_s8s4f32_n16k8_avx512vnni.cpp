// Larger-M int8 x int4 GEMM on AVX-512 VNNI (same results as gemv_s8s4f32_n16k8_avx512vnni and
// gemm_s8s4f32_reference, bit for bit). Unpacking nibbles once per column panel instead of once
// per row tile: up to 4 column blocks are expanded into an n16k4 int8 scratch panel (it stays in
// L2), then 4-row x 4-block register tiles run VPDPBUSD on it with 16 int32 accumulators; the
// per-group float accumulators live in an L1 buffer. Compiled with the AVX-512 VNNI flags.
#include <immintrin.h>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/s4_tile_avx512.h"
#include "kernels/cpu/tile_driver.h"

// "#pragma GCC unroll" on the register-tile loops: without it GCC 12 unrolls them too late and
// keeps the accumulators in memory.
namespace qforge::kernels::detail {

namespace {

// Expands n16k8 blocks of column blocks [nb, nb + nr) into n16k4 blocks of codes (u8 in [0,15]):
// the low nibbles of n16k8 block kb are n16k4 block 2kb, the high nibbles block 2kb + 1.
void unpack_panel(const S4N16K8View& w, int64_t nb, int nr, uint8_t* panel) {
  const int64_t kblocks = w.kp / kS4BlockK;
  const __m512i nibble = _mm512_set1_epi8(kS4NibbleMask);
  #pragma GCC unroll 16
  for (int c = 0; c < nr; ++c) {
    const uint8_t* src = w.data + (nb + c) * kblocks * kS4BlockBytes;
    uint8_t* dst = panel + c * kblocks * 2 * kS8BlockBytes;
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      const __m512i v = _mm512_loadu_si512(src + kb * kS4BlockBytes);
      _mm512_storeu_si512(dst + (2 * kb) * kS8BlockBytes, _mm512_and_si512(v, nibble));
      _mm512_storeu_si512(dst + (2 * kb + 1) * kS8BlockBytes,
                          _mm512_and_si512(_mm512_srli_epi16(v, kS4NibbleBits), nibble));
    }
  }
}

struct Kernel {
  using Args = GemvS4Args;
  static constexpr int kMaxRows = 4;
  static constexpr int kMaxBlocks = static_cast<int>(kS4PanelBlocks);

  template <int MR, int NR>
  static void tile(const GemvS4Args& args, int64_t m0, int64_t nb0, const uint8_t* panel) {
    const S4N16K8View& w = args.w;
    const int64_t k4blocks = w.kp / kS8BlockK;  // n16k4 blocks per column block in the panel
    const int64_t k4_per_group = w.group_size / kS8BlockK;
    const TileOperands<MR, NR, uint8_t, int8_t> op(panel, 0, k4blocks * kS8BlockBytes, args.a, m0, args.lda);

    s4_group_tile<MR, NR>(args, m0, nb0, [&](int64_t g, __m512i(&acc)[MR][NR]) __attribute__((always_inline)) {
      dpbusd_quads<true, MR, NR, /*kAlignedWeights=*/true>(op.w, op.a, g * k4_per_group,
                                                           chunk_end(g, k4_per_group, k4blocks), acc);
    });
  }
};

}  // namespace

void gemm_s8s4f32_n16k8_avx512vnni(const GemvS4Args& args, int64_t nb_begin, int64_t nb_end,
                                   uint8_t* panel) {
  for_each_tile<Kernel>(
      args, nb_begin, nb_end, Kernel::kMaxBlocks,
      [&](int64_t nb, int nr) { unpack_panel(args.w, nb, nr, panel); }, static_cast<const uint8_t*>(panel));
}

}  // namespace qforge::kernels::detail
