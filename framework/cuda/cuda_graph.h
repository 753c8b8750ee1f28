// A step of CUDA work (a frozen model's forward, a decode step) captured once in a CUDA graph and
// replayed: one launch of the whole graph instead of one host round per kernel, which is how a
// decode step gets under the per-launch floor. Built on LibTorch's at::cuda::CUDAGraph; defined by
// framework/cuda/cuda_graph.cpp with a CUDA-enabled LibTorch, by no_cuda.cpp (throwing) otherwise.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace qforge {

class CudaGraphStep {
 public:
  CudaGraphStep();
  ~CudaGraphStep();
  CudaGraphStep(const CudaGraphStep&) = delete;
  CudaGraphStep& operator=(const CudaGraphStep&) = delete;

  // On the current CUDA device and under NoGradGuard: waits for the device, runs step once eagerly
  // on a side stream (warm-up: cuBLASLt plans, workspaces, the non-finite slots), then captures a
  // second run. Returns the captured outputs, which every replay() rewrites in place. step must read
  // its inputs from tensors the caller keeps and refills in place (copy_) before each replay.
  std::vector<at::Tensor> capture(const std::function<std::vector<at::Tensor>()>& step);

  // Launches the captured graph on the current stream (stream-ordered, no synchronization).
  void replay();

  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qforge
