// Dynamic activation quantization with run-time kernel choice; results are bit-identical to
// quantize_rows_s8_reference (see reference.h for the exact formula).
#pragma once

#include <cstdint>

#include "kernels/cpu/reference.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

void quantize_rows_s8(const float* x, int64_t M, int64_t K, ActScale mode, int8_t* q, int64_t ldq,
                      float* a_scale, RunInfo* info = nullptr);

}  // namespace qforge::kernels
