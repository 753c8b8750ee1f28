// Small-M int8 x int4 GEMM on AVX-512 VNNI with per-group scales, float output.
// Weights are unsigned 4-bit codes u = w - qmin in [0, 15], so they are VPDPBUSD's unsigned
// operand and the int8 activations its signed one: no +128 offset is needed. Per group g:
//   acc_g = sum_k u * a - z'[n, g] * sum_k a      (z' = z - qmin, the zero point as a code)
// then t = fma(float(acc_g), scale[n, g], t) per lane, groups in order, exactly as
// gemm_s8s4f32_reference. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni.
#include <immintrin.h>

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
    s4_group_tile<MR, NR>(args, m0, nb0, [&](int64_t g, __m512i(&acc)[MR][NR]) __attribute__((always_inline)) {
      s4_dot_octs<MR, NR>(op.w, op.a, g * blocks_per_group, chunk_end(g, blocks_per_group, kblocks), acc);
    });
  }
};

}  // namespace

void gemv_s8s4f32_n16k8_avx512vnni(const GemvS4Args& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Kernel>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
