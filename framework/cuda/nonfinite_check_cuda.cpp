// The deferred non-finite check (nonfinite_check.h, nonfinite_check_cuda.h). Per device: a ring of
// pinned words, each filled by an async copy of one eager call's flag and followed by an event,
// read in call order once its event has completed; and an array of sticky device words for calls
// captured in CUDA graphs, copied back (async) at eager calls and read when that copy has landed.
#include "framework/cuda/nonfinite_check_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/cuda/nonfinite_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/quantize_rows_s8_cuda.h"

namespace qforge {
namespace cuda_ops {
namespace {

using cuda::check_cuda;
using cuda::kNoNonFinite;

constexpr int64_t kNonfiniteRing = 1024;          // eager reads in flight per device before the oldest is waited for
constexpr int64_t kNonfiniteCaptureSlots = 4096;  // captured calls per device that are checked (more run unchecked)

class CheckEvent {
 public:
  CheckEvent() { check_cuda(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming), "cudaEventCreateWithFlags"); }
  ~CheckEvent() { (void)cudaEventDestroy(e_); }
  CheckEvent(const CheckEvent&) = delete;
  CheckEvent& operator=(const CheckEvent&) = delete;
  cudaEvent_t get() const { return e_; }
  // True once the work before the record has run; never waits.
  bool done() const {
    const cudaError_t e = cudaEventQuery(e_);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: keep it out of the next launch's check
      return false;
    }
    check_cuda(e, "cudaEventQuery(non-finite check)");
    return true;
  }

 private:
  cudaEvent_t e_{};
};

struct PendingRead {
  int64_t slot;
  int64_t K;
};

struct NonfiniteState {
  at::Tensor ring_host;  // pinned int64 [kNonfiniteRing]
  std::vector<std::unique_ptr<CheckEvent>> ring_events;
  std::deque<PendingRead> pending;
  int64_t next = 0;
  at::Tensor slots;       // device int64 [kNonfiniteCaptureSlots], all bits set when clean
  at::Tensor slots_host;  // pinned int64 [kNonfiniteCaptureSlots]
  std::vector<int64_t> slot_k;  // K of each captured slot handed out (-1 until its call checked)
  CheckEvent slots_event;
  int64_t slots_in_flight = 0;  // > 0: an async copy of that many slots is under way

  explicit NonfiniteState(const at::Device& device) {
    const auto pinned = at::TensorOptions().dtype(at::kLong).pinned_memory(true);
    ring_host = at::empty({kNonfiniteRing}, pinned);
    slots_host = at::empty({kNonfiniteCaptureSlots}, pinned);
    for (int64_t i = 0; i < kNonfiniteRing; ++i) ring_events.push_back(std::make_unique<CheckEvent>());
    slots = at::full({kNonfiniteCaptureSlots}, -1, at::TensorOptions().dtype(at::kLong).device(device));
    // Replays may run on any stream: the slots must be clean before any of them.
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(non-finite slots)");
  }
  unsigned long long ring_value(int64_t slot) const {
    return static_cast<unsigned long long>(ring_host.data_ptr<int64_t>()[slot]);
  }
};

// Never destroyed: at exit LibTorch's allocators and the CUDA context may already be gone.
std::mutex& nonfinite_mutex() {
  static auto* m = new std::mutex;
  return *m;
}

std::map<int, std::unique_ptr<NonfiniteState>>& nonfinite_states() {
  static auto* s = new std::map<int, std::unique_ptr<NonfiniteState>>;
  return *s;
}

bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

// The device's state, made on its first eager use (nullptr during capture before that).
NonfiniteState* nonfinite_state_for(const at::Device& device, bool create) {
  auto& s = nonfinite_states()[device.index()];
  if (!s && create) s = std::make_unique<NonfiniteState>(device);
  return s.get();
}

// The first bad captured slot among slots_host[0, n), as a message; resets every bad slot on stream.
std::optional<std::string> take_bad_slots(NonfiniteState& s, int64_t n, cudaStream_t stream) {
  std::optional<std::string> first;
  const int64_t* v = s.slots_host.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const auto idx = static_cast<unsigned long long>(v[i]);
    if (idx == kNoNonFinite || s.slot_k[i] < 0) continue;
    if (!first) first = cuda::nonfinite_message(idx, s.slot_k[i]) + " (in a CUDA graph replay)";
    check_cuda(cudaMemsetAsync(s.slots.data_ptr<int64_t>() + i, 0xff, sizeof(int64_t), stream),
               "cudaMemsetAsync(non-finite slot)");
  }
  return first;
}

// Pops the oldest eager read (its event must have completed) and returns its message when bad.
std::optional<std::string> pop_pending(NonfiniteState& s) {
  const PendingRead p = s.pending.front();
  s.pending.pop_front();
  const unsigned long long idx = s.ring_value(p.slot);
  if (idx == kNoNonFinite) return std::nullopt;
  return cuda::nonfinite_message(idx, p.K);
}

}  // namespace

NonfiniteFlag nonfinite_flag(const at::Device& device, cudaStream_t stream) {
  NonfiniteFlag f;
  f.device = device;
  if (stream_capturing(stream)) {
    const std::lock_guard<std::mutex> lock(nonfinite_mutex());
    NonfiniteState* s = nonfinite_state_for(device, false);
    if (s != nullptr && static_cast<int64_t>(s->slot_k.size()) < kNonfiniteCaptureSlots) {
      f.capture_slot = static_cast<int64_t>(s->slot_k.size());
      s->slot_k.push_back(-1);
      f.ptr = reinterpret_cast<unsigned long long*>(s->slots.data_ptr<int64_t>() + f.capture_slot);
      return f;
    }
  }
  // A word per call (a fill kernel, so also valid inside a graph, where it then goes unchecked).
  f.storage = at::full({1}, -1, at::TensorOptions().dtype(at::kLong).device(device));
  f.ptr = reinterpret_cast<unsigned long long*>(f.storage.data_ptr<int64_t>());
  return f;
}

void check_nonfinite(const NonfiniteFlag& flag, int64_t K, cudaStream_t stream) {
  if (stream_capturing(stream)) {
    if (flag.capture_slot < 0) return;  // no slot left (or none made before capture): unchecked
    const std::lock_guard<std::mutex> lock(nonfinite_mutex());
    nonfinite_state_for(flag.device, false)->slot_k[flag.capture_slot] = K;
    return;
  }
  const std::lock_guard<std::mutex> lock(nonfinite_mutex());
  NonfiniteState& s = *nonfinite_state_for(flag.device, true);  // in both modes: later captures need its slots
  if (cuda_nonfinite_check() == CudaNonfiniteCheck::kSynchronous) {
    cuda::throw_if_nonfinite(flag.ptr, K, stream);
    return;
  }
  std::optional<std::string> bad;
  if (static_cast<int64_t>(s.pending.size()) == kNonfiniteRing) {
    // The host ran kNonfiniteRing calls ahead of the GPU: wait for the oldest read (rare back-pressure).
    check_cuda(cudaEventSynchronize(s.ring_events[s.pending.front().slot]->get()), "cudaEventSynchronize");
    bad = pop_pending(s);
  }
  const int64_t slot = s.next++ % kNonfiniteRing;
  check_cuda(cudaMemcpyAsync(s.ring_host.data_ptr<int64_t>() + slot, flag.ptr, sizeof(int64_t),
                             cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync(non-finite flag)");
  check_cuda(cudaEventRecord(s.ring_events[slot]->get(), stream), "cudaEventRecord(non-finite flag)");
  s.pending.push_back({slot, K});
  if (bad) throw Error(*bad);
}

void raise_completed_nonfinite(const at::Device& device, cudaStream_t stream) {
  if (stream_capturing(stream)) return;  // event queries are not allowed while capturing
  const std::lock_guard<std::mutex> lock(nonfinite_mutex());
  NonfiniteState* s = nonfinite_state_for(device, false);
  if (s == nullptr) return;
  while (!s->pending.empty() && s->ring_events[s->pending.front().slot]->done()) {
    if (auto bad = pop_pending(*s)) throw Error(*bad);
  }
  if (s->slot_k.empty()) return;
  if (s->slots_in_flight > 0) {
    if (!s->slots_event.done()) return;
    const int64_t n = s->slots_in_flight;
    s->slots_in_flight = 0;
    if (auto bad = take_bad_slots(*s, n, stream)) throw Error(*bad);
    return;
  }
  // Copy the captured slots back behind whatever this stream has queued (replays included).
  const auto n = static_cast<int64_t>(s->slot_k.size());
  check_cuda(cudaMemcpyAsync(s->slots_host.data_ptr<int64_t>(), s->slots.data_ptr<int64_t>(), n * sizeof(int64_t),
                             cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync(non-finite slots)");
  check_cuda(cudaEventRecord(s->slots_event.get(), stream), "cudaEventRecord(non-finite slots)");
  s->slots_in_flight = n;
}

}  // namespace cuda_ops

void cuda_check_nonfinite() {
  const std::lock_guard<std::mutex> lock(cuda_ops::nonfinite_mutex());
  std::optional<std::string> first;
  for (auto& [index, s] : cuda_ops::nonfinite_states()) {
    if (!s) continue;
    const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
    const c10::cuda::CUDAGuard guard(device);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    QF_REQUIRE(!cuda_ops::stream_capturing(stream), "cuda_check_nonfinite: the current stream of ", device,
               " is capturing a CUDA graph; check after capture_end()");
    cuda::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(cuda_check_nonfinite)");
    while (!s->pending.empty()) {
      auto bad = cuda_ops::pop_pending(*s);
      if (bad && !first) first = std::move(bad);
    }
    const auto n = static_cast<int64_t>(s->slot_k.size());
    s->slots_in_flight = 0;
    if (n == 0) continue;
    cuda::check_cuda(cudaMemcpy(s->slots_host.data_ptr<int64_t>(), s->slots.data_ptr<int64_t>(), n * sizeof(int64_t),
                                cudaMemcpyDeviceToHost),
                     "cudaMemcpy(non-finite slots)");
    auto bad = cuda_ops::take_bad_slots(*s, n, stream);
    cuda::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(non-finite slots)");
    if (bad && !first) first = std::move(bad);
  }
  if (first) throw Error(*first);
}

}  // namespace qforge
