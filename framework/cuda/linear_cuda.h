// The CUDA execution of frozen layers: LibTorch tensors in, the kernels of kernels/cuda on the
// tensors' device and LibTorch's current stream. The CUDA forms of packed weights
// (framework/cuda/packed_weight_cuda.h) call them; the CPU forms run kernels/cpu. Defined by
// framework/cuda/linear_cuda.cpp when qforge is built against a CUDA-enabled LibTorch (CMake:
// QFORGE_TORCH_CUDA), otherwise by framework/cuda/no_cuda.cpp, whose functions throw saying so.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "kernels/cpu/run_info.h"

namespace qforge::cuda_ops {

// True when this build runs frozen layers on CUDA devices.
bool built();

// The error a frozen layer gives for a CUDA device this build cannot run ("" when it can).
std::string unavailable_reason();

// y [M, N] float = dequantize_s32_f32(gemm_s8s8s32(q, W), a_scale, w_scale, bias) on x's device:
//   dynamic (codes undefined): q and a_scale from x [M, K] float by quantize_rows_s8 per row;
//   static (codes int8 [M, K] given): a_scale = static_scale for every row.
// W int8 [N, K] row-major, w_scale float [N], bias float [N] or undefined, all on that device.
// With set_cuda_linear_s8_fused(true) and its rules met (M <= 16) one launch of
// linear_s8_fused_cuda does it all; else the GEMM is cuBLASLt IMMA or the CUDA fallback (info says
// which and why, with the fused kernel's refusal first). Non-finite inputs of the dynamic path
// throw when framework/cuda/nonfinite_check.h says (by default at a later call, without
// synchronising the stream; the outputs of the bad call are unspecified).
at::Tensor linear_s8(const at::Tensor& x, const at::Tensor& codes, float static_scale, const at::Tensor& weight,
                     const at::Tensor& w_scale, const at::Tensor& bias, kernels::RunInfo* info);

// Frozen int4 codes (dense row-major nibbles, as pack_s4_reference; tiled: the tensor-core
// GEMV's tiled layout, repack_s4_tiles) to float [N, K] on the device: w = (q - zero) * scale per
// group; zero may be undefined. scale / zero are [N, G].
at::Tensor dequantize_s4(const at::Tensor& packed, int64_t N, int64_t K, bool is_signed, const at::Tensor& scale,
                         const at::Tensor& zero, int64_t group_size, bool tiled);

// True when frozen int4 weights with this K and group size run the tensor-core GEMV on `device`
// (gemv_f32s4_mma_supported and gemv_f32s4_mma_runs_here: K and the group size multiples of 128,
// sm_80+); their codes are then kept on the device in its tiled layout only (repack_s4_tiles).
bool s4_tiles_serve(int64_t K, int64_t group_size, const at::Device& device);

// Dense int4 codes of an [N, K] weight (a CUDA uint8 tensor) rearranged into the tiled layout
// (kernels/cuda/unpack_s4_math.h: s4_tiled_bytes(N, K) bytes, rows padded to 16 with zero codes).
at::Tensor repack_s4_tiles(const at::Tensor& packed, int64_t N, int64_t K);

// y [M, N] float = x [M, K] float times the int4 weight (packed / scale / zero / group_size / tiled
// as dequantize_s4) plus bias: decode-sized calls (gemv_f32s4_supported, kernels/cuda/gemv_s4_rules.h)
// run an int4 GEMV that reads the packed weight once (on tensor cores when K and the group size
// are multiples of 128 on sm_80+: gemv_f32s4_mma_staged_cuda with a per-call caching-allocator
// workspace from M = 2, and at M = 1 when N or K >= 8192, gemv_f32s4_mma_cuda otherwise
// (gemv_f32s4_mma_staged_for in gemv_s4_rules.h); else gemv_f32s4_cuda); others dequantize the
// weight to float and run at::linear. Tiled codes (s4_tiles_serve) always take the tensor-core
// GEMV at decode sizes (x copied to 16-byte aligned memory first when it is not aligned).
// info names the kernel and, when it is not the first, why.
at::Tensor linear_s4(const at::Tensor& x, const at::Tensor& packed, int64_t N, int64_t K, bool is_signed,
                     const at::Tensor& scale, const at::Tensor& zero, int64_t group_size, bool tiled,
                     const at::Tensor& bias, kernels::RunInfo* info);

// y [M, N] float = x [M, K] float times the weight-only int8 weight (codes int8 [N, K], scale
// float [N]) plus bias: decode-sized calls (gemv_f32s8_supported, kernels/cuda/gemv_s8_rules.h)
// run gemv_f32s8_cuda, which reads the codes once per 8 rows; others dequantize the weight per call
// and run at::linear. info names the kernel and, when it is not the GEMV, why.
at::Tensor linear_s8_weight_only(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                                 const at::Tensor& bias, kernels::RunInfo* info);

}  // namespace qforge::cuda_ops
