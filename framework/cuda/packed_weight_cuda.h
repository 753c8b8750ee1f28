// The CUDA form of a frozen Linear's packed weight: what CpuPackedWeight::to(kCUDA) returns. It
// uploads what the CUDA path of its LinearPath reads (int8 codes and scales for cuBLASLt, packed
// int4 codes with their group scales for dequantize_s4_cuda, a float weight otherwise) and keeps
// the CPU original for weight(), bias(), bytes() and to(kCPU). Built in every build: without a
// CUDA-enabled LibTorch, cuda_ops (linear_cuda.h) refuses with the reason.
#pragma once

#include "framework/nn/packed_weight.h"

namespace qforge::nn {

// host on `device` (a CUDA device); throws qforge::Error when this build has no CUDA kernels.
PackedWeightPtr cuda_packed_weight(PackedWeightPtr host, const at::Device& device);

}  // namespace qforge::nn
