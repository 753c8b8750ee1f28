// Per-thread scratch buffers of the dispatchers (padded activations, group sums, unpacked weight
// panels): a slot's buffer is grown on first use, then reused, so a warm decode-sized call
// allocates nothing. Per thread because a frozen layer's run() is const and may be called from
// several threads at once, and ATen's workers each need their own panel. A thread keeps at most
// kWorkspaceRetainBytes per slot; a larger request gets a buffer of its own, freed after the call.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace qforge::kernels::detail {

// One buffer per use, so nested users (a packed layer quantizing its input, then the GEMV padding
// it) never share one.
enum class Scratch : uint8_t {
  kActivationCodes,   // PackedLinearS8/S4::run: the quantized input
  kActivationScales,  // PackedLinearS8/S4::run: its per-row scales (run_static: the one scale, per row)
  kRowMaxima,         // quantize_rows_s8: per-row max |x|, kept apart until every row is known finite
  kAccumulators,      // PackedLinearS8::run, oneDNN-served conv2d_s8: oneDNN's int32 output
  kPaddedInput,       // dispatchers: input rows padded to whole k blocks
  kGroupSums,         // int4 dispatcher: per-row, per-group activation sums
  kPanel,             // int4 GEMM: unpacked weight panel (on each worker thread)
  kPackedOperand,     // bmm_s8s8f32: one slice's second operand packed to n16k4
  kPackedColumnSums,  // bmm_s8s8f32: its column sums
  kOneDnnScratchpad,  // oneDNN matmul / convolution calls: the primitive's user-managed scratchpad
  kCount,
};

// Most bytes a thread keeps per slot between calls: decode-sized buffers (M <= 16 rows of a few
// thousand values, one weight panel) fit; prefill-sized ones (e.g. oneDNN's int32 output at M in
// the thousands) would otherwise stay allocated for the thread's lifetime.
inline constexpr size_t kWorkspaceRetainBytes = size_t{4} << 20;

// The calling thread's buffer of `slot`, grown to at least `bytes` (64-byte aligned, contents
// unspecified, valid until the thread's next request for the slot); nullptr when bytes exceeds
// kWorkspaceRetainBytes.
void* retained_scratch(Scratch slot, size_t bytes);
// A 64-byte aligned buffer of at least `bytes` bytes, for std::free.
void* allocate_scratch(size_t bytes);

struct ScratchFree {
  void operator()(void* p) const { std::free(p); }
};

// `count` values of scratch for one call: the thread's retained buffer of `slot` when it fits,
// else a buffer owned (and freed) by this object.
template <typename T>
class ScratchArray {
 public:
  ScratchArray(Scratch slot, int64_t count) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    void* p = retained_scratch(slot, bytes);
    if (p == nullptr) owned_.reset(p = allocate_scratch(bytes));
    data_ = static_cast<T*>(p);
  }
  T* data() const { return data_; }

 private:
  std::unique_ptr<void, ScratchFree> owned_;
  T* data_ = nullptr;
};

// Rows [0, M) of `out` (row stride kp): copy_row(m, dst) writes row m's first K values, the rest
// [K, kp) is zeroed (the kernels read whole k blocks).
template <typename T, typename CopyRow>
void pad_rows(T* out, int64_t M, int64_t K, int64_t kp, const CopyRow& copy_row) {
  for (int64_t m = 0; m < M; ++m) {
    copy_row(m, out + m * kp);
    std::fill(out + m * kp + K, out + (m + 1) * kp, T{});
  }
}

// x [M, K] dense, copied into `out` with rows padded to kp.
template <typename T>
void pad_rows(T* out, const T* x, int64_t M, int64_t K, int64_t kp) {
  pad_rows(out, M, K, kp,
           [&](int64_t m, T* dst) { std::memcpy(dst, x + m * K, static_cast<size_t>(K) * sizeof(T)); });
}

}  // namespace qforge::kernels::detail
