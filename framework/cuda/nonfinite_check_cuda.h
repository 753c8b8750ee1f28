// The non-finite check of CUDA dynamic quantization as frozen Linears call it (the policy of
// nonfinite_check.h). A call takes a flag before its quantize kernel and hands it to
// check_nonfinite() after; every CUDA Linear call starts with raise_completed_nonfinite().
#pragma once

#include <ATen/core/Tensor.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qforge::cuda_ops {

// The device word a kernel records its first non-finite index into (kNoNonFinite when clean).
struct NonfiniteFlag {
  at::Tensor storage;                  // holds a per-call word (undefined for a captured call's slot)
  unsigned long long* ptr = nullptr;   // what the kernel gets
  int64_t capture_slot = -1;           // >= 0: a per-device slot read after graph replays
  at::Device device{at::kCPU};
};

// A clean flag on `device` for a call on `stream`: per call when eager (at::full, stream-ordered);
// during stream capture a sticky per-device slot (kept by every replay of the graph).
NonfiniteFlag nonfinite_flag(const at::Device& device, cudaStream_t stream);

// After the kernel that wrote flag (K its row length): reads it now (synchronous mode), queues an
// async read (deferred mode) or, during capture, only remembers K for the slot.
void check_nonfinite(const NonfiniteFlag& flag, int64_t K, cudaStream_t stream);

// Throws the first earlier record on `device` whose async read has landed; never waits, and does
// nothing during capture.
void raise_completed_nonfinite(const at::Device& device, cudaStream_t stream);

}  // namespace qforge::cuda_ops
