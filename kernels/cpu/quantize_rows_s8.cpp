// Dispatcher of the dynamic activation quantizers: quantize_rows_s8_avx512 -> reference.
#include "kernels/cpu/quantize_rows_s8.h"

#include "framework/core/error.h"
#include "kernels/cpu/isa.h"

namespace qforge::kernels {

void quantize_rows_s8(const float* x, int64_t M, int64_t K, ActScale mode, int8_t* q, int64_t ldq,
                      float* a_scale, RunInfo* info) {
  QF_REQUIRE(M == 0 || K == 0 || (x != nullptr && q != nullptr && a_scale != nullptr),
             "kernels/cpu: quantize_rows_s8 got a null pointer");
  RunInfo local;
  RunInfo& ri = info != nullptr ? *info : local;
  ri = RunInfo{};
  ri.kernel = "reference";
  quantize_rows_s8_reference(x, M, K, mode, q, ldq, a_scale);
}

}  // namespace qforge::kernels
