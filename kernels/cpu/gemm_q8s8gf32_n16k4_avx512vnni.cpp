// Prefill GEMM on AVX-512 VNNI: block-32 int8 activations x n16k4 int8 weights with a scale (and
// optional zero point) per column and group (PackedLinearS8G: GGUF's Q8_0), float out
// (linear_q8b32_s4_reference on the int8 codes bit for bit, so a call of M rows equals M one-row
// calls of gemv_q8s8gf32_n16k4_avx512vnni). The GEMV's tile (q8s8g_tile_avx512vnni.h) in 4-row x
// 2-block register tiles over panels of 2 column blocks: each weight vector loaded feeds 4 rows
// and each activation broadcast 2 blocks (the GEMV's several-row tile, 4 x 1, reloads every
// broadcast per block). Compiled with the AVX-512 VNNI flags.
#include "kernels/cpu/gemm_q8_kernels.h"
#include "kernels/cpu/q8s8g_tile_avx512vnni.h"

namespace qforge::kernels::detail {

void gemm_q8s8gf32_n16k4_avx512vnni(const GemvQ8S8GArgs& args, int64_t nb_begin, int64_t nb_end) {
  for_each_tile<Q8S8GTile<4, 2, /*kShare=*/false>>(args, nb_begin, nb_end);
}

}  // namespace qforge::kernels::detail
