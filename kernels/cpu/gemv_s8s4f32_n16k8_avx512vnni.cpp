// Small-M int8 x int4 GEMM on AVX-512 VNNI with per-group scales, float output.
// Weights are unsigned 4-bit codes u = w - qmin in [0, 15], so they are VPDPBUSD's unsigned
// operand and the int8 activations its signed one: no +128 offset is needed. Per group g:
//   acc_g = sum_k u * a - z'[n, g] * sum_k a      (z' = z - qmin, the zero point as a code)
// then t = fma(float(acc_g), scale[n, g], t) per lane, groups in order, exactly as
// gemm_s8s4f32_reference. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/s4_tile_avx512.h"
#include "kernels/cpu/tile_driver.h"

namespace qforge::kernels::detail {

namespace {

// One row: up to 4 column blocks (8 int + 4 float accumulators). Several rows: one block of
// 16 columns (its K/2-byte panel stays in L1) times up to 4 rows.
struct Kernel {
  using Args = GemvS4Args;
  static constexpr int kMaxRows = 4;
  static constexpr int kMaxBlocks = 4;
  static constexpr bool kRowsShareBlock = true;

  template <int MR, int NR>
  static void tile(const GemvS4Args& args, int64_t m0, int64_t nb0) {
    const S4N16K8View& w = args.w;
    const int64_t kblocks = w.kp / kS4BlockK;
    const int64_t blocks_per_group = w.group_size / kS4BlockK;
    const TileOperands<MR, NR, uint8_t, int8_t> op(w.data, nb0, kblocks * kS4BlockBytes, args.a, m0, args.lda);

    alignas(64) float t[MR][NR][kS4BlockN];
    std::memset(t, 0, sizeof(t));
    alignas(64) int32_t sums[MR][NR][kS4BlockN];

    for (int64_t g = 0; g < w.groups; ++g) {
      const int64_t kb_end = chunk_end(g, blocks_per_group, kblocks);
      __m512i acc[MR][NR];
      s4_dot_octs<MR, NR>(op.w, op.a, g * blocks_per_group, kb_end, acc);
      s4_end_group<MR, NR>(args, m0, nb0, g, acc, sums, t);
    }
    s4_finish_tile<MR, NR>(args, m0, nb0, t);
  }
};

}  // namespace

void gemv_s8s4f32_n16k8_avx512vnni(const GemvS4Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
