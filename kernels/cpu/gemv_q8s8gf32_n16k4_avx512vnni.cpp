// Decode GEMV on AVX-512 VNNI: block-32 int8 activations x n16k4 int8 weights with a scale (and
// optional zero point) per column and group, float out (linear_q8b32_s4_reference's formula on
// int8 codes, bit for bit; the tile and its numerics: q8s8g_tile_avx512vnni.h). One row: tiles of
// up to 4 column blocks; several rows: one column block times up to 4 rows (its K-long weight
// panel stays in L1 while the rows reuse it). Compiled with the AVX-512 VNNI flags.
#include "kernels/cpu/q8s8g_tile_avx512vnni.h"

namespace qforge::kernels::detail {

void gemv_q8s8gf32_n16k4_avx512vnni(const GemvQ8S8GArgs& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Q8S8GTile<4, 4, /*kShare=*/true>>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
