// Dispatcher of the dequantizing epilogue.
#include "kernels/cpu/dequantize_s32_f32.h"

#include <algorithm>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/parallel_blocks.h"
#include "kernels/cpu/reference.h"

namespace qforge::kernels {

namespace {
[[maybe_unused]] constexpr int64_t kMinElementsPerTask = int64_t{1} << 16;
}

void dequantize_s32_f32(const int32_t* acc, const float* a_scale, const float* w_scale,
                        const float* bias, float* y, int64_t M, int64_t N, RunInfo* info) {
  run_isa_or_reference(
      Isa::kAvx512, "dequantize_s32_f32_avx512", info,
      [&](std::string*) {
#ifdef QFORGE_KERNELS_AVX512
        const int64_t grain = std::max<int64_t>(1, kMinElementsPerTask / std::max<int64_t>(1, N));
        detail::parallel_over(M, grain, [&](int64_t b, int64_t e) {
          detail::dequantize_s32_f32_avx512(acc, a_scale, w_scale, bias, y, N, b, e);
        });
        return true;
#else
        return false;
#endif
      },
      [&] { dequantize_s32_f32_reference(acc, a_scale, w_scale, bias, y, M, N); });
}

}  // namespace qforge::kernels
