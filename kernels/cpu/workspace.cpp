// Per-thread scratch buffers (workspace.h).
#include "kernels/cpu/workspace.h"

#include <array>
#include <new>

#include "kernels/cpu/packed_layout.h"

namespace qforge::kernels::detail {

namespace {

struct Buffer {
  std::unique_ptr<void, ScratchFree> data;
  size_t bytes = 0;
};

// aligned_alloc needs a non-zero multiple of the alignment.
size_t aligned_size(size_t bytes) {
  return static_cast<size_t>(round_up(static_cast<int64_t>(bytes > 0 ? bytes : 1), kPackedAlignment));
}

}  // namespace

void* allocate_scratch(size_t bytes) {
  void* p = std::aligned_alloc(static_cast<size_t>(kPackedAlignment), aligned_size(bytes));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void* retained_scratch(Scratch slot, size_t bytes) {
  if (bytes > kWorkspaceRetainBytes) return nullptr;
  thread_local std::array<Buffer, static_cast<size_t>(Scratch::kCount)> buffers;
  Buffer& b = buffers[static_cast<size_t>(slot)];
  if (b.bytes < bytes || b.data == nullptr) {
    b.data.reset(allocate_scratch(bytes));
    b.bytes = aligned_size(bytes);
  }
  return b.data.get();
}

}  // namespace qforge::kernels::detail
