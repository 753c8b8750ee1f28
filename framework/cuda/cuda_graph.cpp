// CudaGraphStep (cuda_graph.h) on at::cuda::CUDAGraph, with the API LibTorch 1.13 and 2.x share:
// capture_begin() / capture_end() / replay() with default arguments, on a pool stream.
#include "framework/cuda/cuda_graph.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "framework/core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace qforge {

struct CudaGraphStep::Impl {
  at::cuda::CUDAGraph graph;
  bool captured = false;
  c10::DeviceIndex device = 0;
};

CudaGraphStep::CudaGraphStep() : impl_(std::make_unique<Impl>()) {}
CudaGraphStep::~CudaGraphStep() = default;

bool CudaGraphStep::captured() const { return impl_->captured; }

std::vector<at::Tensor> CudaGraphStep::capture(const std::function<std::vector<at::Tensor>()>& step) {
  QF_REQUIRE(!impl_->captured, "CudaGraphStep: already captured; make a new one to capture again");
  const at::NoGradGuard no_grad;
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  impl_->device = side.device_index();
  // The inputs were written on the caller's stream; the side stream must see them.
  cuda::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(before capture)");
  std::vector<at::Tensor> outputs;
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    step();  // warm-up: whatever is made once (plans, handles, workspaces) is made outside capture
    side.synchronize();
    impl_->graph.capture_begin();
    try {
      outputs = step();
    } catch (...) {
      try {
        impl_->graph.capture_end();  // leave the stream out of capture mode; the step's error wins
      } catch (...) {
      }
      throw;
    }
    impl_->graph.capture_end();
  }
  impl_->captured = true;
  return outputs;
}

void CudaGraphStep::replay() {
  QF_REQUIRE(impl_->captured, "CudaGraphStep: replay() before capture()");
  const c10::cuda::CUDAGuard guard(impl_->device);
  impl_->graph.replay();
}

}  // namespace qforge
