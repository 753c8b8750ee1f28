// Dispatchers of the activation quantizers (dynamic and static): quantize_rows_s8_avx512 -> reference.
#include "kernels/cpu/quantize_rows_s8.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel_blocks.h"

namespace qforge::kernels {

void quantize_rows_s8(const float* x, int64_t M, int64_t K, ActScale mode, int8_t* q, int64_t ldq,
                      float* a_scale, RunInfo* info) {
  QF_REQUIRE(M >= 0 && K >= 0 && ldq >= K, "kernels/cpu: quantize_rows_s8 got M=", M, " K=", K,
             " ldq=", ldq);
  QF_REQUIRE(M == 0 || (x != nullptr && q != nullptr && a_scale != nullptr),
             "kernels/cpu: quantize_rows_s8 got a null pointer");
  RunInfo local;
  RunInfo& ri = info != nullptr ? *info : local;
  ri = RunInfo{};
  std::string why;
  if (isa_usable(Isa::kAvx512, &why)) {
#ifdef QFORGE_KERNELS_AVX512
    std::vector<float> amax(static_cast<size_t>(M));
    bool finite = true;
    for (int64_t m = 0; m < M && finite; ++m) finite = detail::row_amax_avx512(x + m * K, K, &amax[m]);
    if (finite) {
      ri.kernel = "quantize_rows_s8_avx512";
      if (mode == ActScale::kPerTensor && M > 0) {
        std::fill(amax.begin(), amax.end(), *std::max_element(amax.begin(), amax.end()));
      }
      for (int64_t m = 0; m < M; ++m) {
        // Same scalar expressions as the reference, so scale and inv match bit for bit.
        const float scale = amax[m] > 0.0f ? amax[m] / static_cast<float>(kActQMax) : 1.0f;
        a_scale[m] = scale;
        detail::quantize_row_avx512(x + m * K, K, 1.0f / scale, q + m * ldq, ldq);
      }
      return;
    }
    why = "non-finite input (the reference reports where)";
#endif
  }
  ri.skip("quantize_rows_s8_avx512", why);
  ri.kernel = "reference";
  quantize_rows_s8_reference(x, M, K, mode, q, ldq, a_scale);
}

void quantize_static_s8(const float* x, int64_t count, float inv, int qmin, int qmax, int8_t* q, RunInfo* info) {
  QF_REQUIRE(count >= 0 && -128 <= qmin && qmin <= qmax && qmax <= 127, "kernels/cpu: quantize_static_s8 got count=",
             count, " grid [", qmin, ", ", qmax, "]");
  QF_REQUIRE(count == 0 || (x != nullptr && q != nullptr), "kernels/cpu: quantize_static_s8 got a null pointer");
  RunInfo local;
  RunInfo& ri = info != nullptr ? *info : local;
  ri = RunInfo{};
  std::string why;
  if (isa_usable(Isa::kAvx512, &why)) {
#ifdef QFORGE_KERNELS_AVX512
    std::atomic<bool> finite{true};
    // 64 KiB of floats per task: enough work to be worth a thread.
    detail::parallel_over(count, int64_t{1} << 14, [&](int64_t i0, int64_t i1) {
      if (!detail::quantize_clamp_avx512(x + i0, i1 - i0, inv, qmin, qmax, q + i0)) finite = false;
    });
    if (finite) {
      ri.kernel = "quantize_static_s8_avx512";
      return;
    }
    why = "non-finite input (the reference reports where)";
#endif
  }
  ri.skip("quantize_static_s8_avx512", why);
  ri.kernel = "reference";
  quantize_static_s8_reference(x, count, inv, qmin, qmax, q);
}

}  // namespace qforge::kernels
