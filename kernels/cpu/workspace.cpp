// Per-thread scratch buffers (workspace.h).
#include "kernels/cpu/workspace.h"

#include <array>
#include <cstdlib>
#include <memory>
#include <new>

#include "kernels/cpu/packed_layout.h"

namespace qforge::kernels::detail {

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

struct Buffer {
  std::unique_ptr<void, FreeDeleter> data;
  size_t bytes = 0;
};

}  // namespace

void* thread_scratch(Scratch slot, size_t bytes) {
  thread_local std::array<Buffer, static_cast<size_t>(Scratch::kCount)> buffers;
  Buffer& b = buffers[static_cast<size_t>(slot)];
  if (b.bytes < bytes || b.data == nullptr) {
    const size_t size = static_cast<size_t>(round_up(static_cast<int64_t>(bytes > 0 ? bytes : 1), kPackedAlignment));
    b.data.reset(std::aligned_alloc(static_cast<size_t>(kPackedAlignment), size));
    if (b.data == nullptr) throw std::bad_alloc();
    b.bytes = size;
  }
  return b.data.get();
}

}  // namespace qforge::kernels::detail
