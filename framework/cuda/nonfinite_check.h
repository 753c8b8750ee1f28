// When a frozen CUDA Linear reports a non-finite input of its dynamic int8 quantization. The
// kernel records the first bad index in a device word; by default (kDeferred) the host reads it
// without synchronising the stream and raises the error at the next CUDA Linear call on that
// device once the copy has landed, or at cuda_check_nonfinite(). kSynchronous (or the environment
// variable QFORGE_CUDA_SYNC_CHECK=1) reads it at the end of every call, as the CPU does. Calls
// captured in a CUDA graph never synchronise in either mode: their record is read after replays,
// by a later eager call or cuda_check_nonfinite(). docs/kernels.md "Non-finite inputs on CUDA".
#pragma once

namespace qforge {

enum class CudaNonfiniteCheck { kDeferred, kSynchronous };

// The mode for the whole process; the default comes from QFORGE_CUDA_SYNC_CHECK ("1": synchronous).
void set_cuda_nonfinite_check(CudaNonfiniteCheck mode);
CudaNonfiniteCheck cuda_nonfinite_check();

// Waits for every device, then throws qforge::Error for the first non-finite input recorded and not
// yet reported (naming its row and column), clearing every record read. Must not be called while
// the current CUDA stream is capturing. Does nothing in a build without CUDA.
void cuda_check_nonfinite();

}  // namespace qforge
