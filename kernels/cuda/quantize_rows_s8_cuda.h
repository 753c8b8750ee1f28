// CUDA dynamic int8 activation quantization, the twin of quantize_rows_s8_reference: one block
// per row, the formulas of quantize_rows_s8_math.h. Tested on a GPU by tests/cuda/cuda_kernels_test.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/cpu/reference.h"

namespace qforge::cuda {

// x [M, K] (dense) -> q [M, ldq] int8 (columns [K, ldq) set to 0), a_scale [M]. Device pointers,
// stream-ordered. ActScale::kPerTensor gives every row the scale of the largest |x| overall.
// Non-finite inputs: the kernel cannot throw, so when first_nonfinite (device, nullable) is given
// it receives the smallest linear index m * K + k of a NaN / Inf (set it to kNoNonFinite first);
// the outputs are then unspecified. throw_if_nonfinite() turns that into the reference's error;
// framework/cuda/nonfinite_check_cuda.h decides when a frozen Linear reads it.
void quantize_rows_s8_cuda(const float* x, int64_t M, int64_t K, kernels::ActScale mode, int8_t* q,
                           int64_t ldq, float* a_scale, unsigned long long* first_nonfinite,
                           cudaStream_t stream);

constexpr unsigned long long kNoNonFinite = ~0ULL;

// The reference's message for the recorded index idx = m * K + k: "... row m column k is not finite ...".
std::string nonfinite_message(unsigned long long idx, int64_t K);

// Synchronizes the stream, reads *first_nonfinite and throws qforge::Error naming row and column
// (as quantize_rows_s8_reference does) when one was recorded.
void throw_if_nonfinite(const unsigned long long* first_nonfinite, int64_t K, cudaStream_t stream);

}  // namespace qforge::cuda
