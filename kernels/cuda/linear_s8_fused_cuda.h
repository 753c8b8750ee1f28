// The frozen int8 Linear in one launch on int8 tensor cores (mma.sync m16n8k32), the fused
// twin of quantize_rows_s8_cuda + gemm_s8s8s32 + dequantize_s32_f32_cuda:
//   dynamic: q, a_scale = quantize_rows_s8_reference(x, per row)   (in the kernel's prologue)
//   static:  q = codes, a_scale[m] = static_scale
//   y[m, n] = dequantize_s32_f32_value(sum_k q[m, k] W[n, k], a_scale[m], w_scale[n], bias[n])
// Bit for bit the CPU references' result (the int32 sums are exact, the formulas are the shared
// *_math.h ones). Shape and tile rules: linear_s8_fused_rules.h. Tested on a GPU by
// tests/cuda/cuda_kernels_test against the references.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/linear_s8_fused_rules.h"

namespace qforge::cuda {

struct LinearS8FusedArgs {
  const float* x = nullptr;       // dynamic: [M, K] float, 16-byte aligned (else null)
  const int8_t* codes = nullptr;  // static: [M, K] int8 codes, 16-byte aligned (else null)
  float static_scale = 1.0f;      // static: every row's activation scale
  const int8_t* weight = nullptr;  // [N, K] int8, 16-byte aligned
  const float* w_scale = nullptr;  // [N]
  const float* bias = nullptr;     // [N] or null
  float* y = nullptr;              // [M, N] float
  int64_t M = 0, N = 0, K = 0;
  // Dynamic path, nullable: receives the smallest m * K + k of a NaN / Inf in x (set it to
  // kNoNonFinite first; the outputs are then unspecified). throw_if_nonfinite reads it.
  unsigned long long* first_nonfinite = nullptr;
  // Split K (linear_s8_fused_rules.h): S slices; S > 1 needs workspace (fused_workspace_ints
  // int32) and tickets (fused_ticket_count unsigned, zero before the first call, left zero).
  // One call at a time per tickets array (they are per output tile, not per call).
  int64_t splits = 1;
  int32_t* workspace = nullptr;
  unsigned* tickets = nullptr;
};

// Runs tile t (fused_tile_for gives the dispatch rule's choice). Device pointers, stream-ordered.
// Throws qforge::Error when linear_s8_fused_supported / _pointers_supported refuse the call or
// the device is older than sm_80, naming the rule.
void linear_s8_fused_cuda(const LinearS8FusedArgs& a, FusedTile t, cudaStream_t stream);

// The dispatch rule's tile and K slices for this call on the current device, or false with the
// reason it cannot run (M above kFusedMaxM, shape, alignment, shared memory, device).
bool linear_s8_fused_choose(const LinearS8FusedArgs& a, FusedTile* tile, int64_t* splits, std::string* why);

// Opt-in shared memory per block of the current device (asked once per device).
int64_t linear_s8_fused_max_smem();

}  // namespace qforge::cuda
