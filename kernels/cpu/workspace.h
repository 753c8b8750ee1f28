// Per-thread scratch buffers of the dispatchers (padded activations, group sums, unpacked weight
// panels): grown on first use, then reused, so a warm kernel call allocates nothing. Per thread
// because a frozen layer's run() is const and may be called from several threads at once, and
// ATen's workers each need their own panel; a buffer keeps the largest size its thread asked for.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qforge::kernels::detail {

// One buffer per use, so nested users (a packed layer quantizing its input, then the GEMV padding
// it) never share one.
enum class Scratch : uint8_t {
  kActivationCodes,   // PackedLinearS8/S4::run: the quantized input
  kActivationScales,  // PackedLinearS8/S4::run: its per-row scales
  kAccumulators,      // PackedLinearS8::run: oneDNN's int32 output
  kPaddedInput,       // dispatchers: input rows padded to whole k blocks
  kGroupSums,         // int4 dispatcher: per-row, per-group activation sums
  kPanel,             // int4 GEMM: unpacked weight panel (on each worker thread)
  kPackedOperand,     // bmm_s8s8f32: one slice's second operand packed to n16k4
  kPackedColumnSums,  // bmm_s8s8f32: its column sums
  kCount,
};

// At least `bytes` bytes, 64-byte aligned, owned by the calling thread and valid until its next
// call for the same slot. Contents are unspecified.
void* thread_scratch(Scratch slot, size_t bytes);

template <typename T>
T* thread_scratch(Scratch slot, int64_t count) {
  return static_cast<T*>(thread_scratch(slot, static_cast<size_t>(count) * sizeof(T)));
}

}  // namespace qforge::kernels::detail
