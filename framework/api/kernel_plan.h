// Kernel plan: what a frozen layer runs and why it falls back, decided from what the layer is
// asked to do (its scheme), its shape and the machine's ISA level. Every layer's plan() is a pure
// function of those; freeze() stores the plan once, and describe(), the dry run and the forward
// read it. The kernel choice of each op comes from its kernel table (kernels/cpu/kernel_choice.h); on a
// CUDA device plan_linear_cuda() says what the GPU runs (kernels/cuda/cublaslt_int8_rules.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "framework/core/isa.h"
#include "framework/api/quantizer.h"

namespace qforge {

// How a frozen Linear computes (docs/kernels.md, "Frozen Linear").
enum class LinearPath : uint8_t {
  kDequant,       // dequantize the weight per call, at::linear
  kS8Dynamic,     // int8 weights x per-token dynamic int8 activations
  kS8Static,      // int8 weights x static int8 activations
  kS4Dynamic,     // 4-bit weights x per-token dynamic int8 activations
  kS4Static,      // 4-bit weights x static int8 activations
  kS8WeightOnly,  // int8 weights, float activations
  kS4WeightOnly,  // 4-bit weights, float activations
  kLutWeightOnly, // codebook (k-means) weights through the look-up-table kernel, float activations
  kFp4WeightOnly, // MXFP4 / NVFP4 weights (E2M1 codes, block scales), float activations
  kS8GroupWeightOnly,  // int8 weights with a scale per group along K (GGUF Q8_0), float activations
};
const char* to_string(LinearPath path);

// What the weight-only int8 / int4 / int8-group paths do with their float input on decode-sized calls (at most
// kernels::kWeightOnlyMaxM rows; larger calls too where AVX-512 VNNI has a block-32 GEMM for the
// layout, else exact). docs/kernels.md, "Decode activations".
enum class DecodeActivations : uint8_t {
  kExact,      // float activations times the packed weights (linear_f32_s8/s4_reference)
  kQ8Block32,  // each row quantized to int8 in blocks of 32 per call (llama.cpp's Q8_0 activation
               // side), then integer dot products (linear_q8b32_s8/s4_reference)
};
const char* to_string(DecodeActivations d);  // "exact", "q8_block32"

struct KernelPlan {
  LinearPath path = LinearPath::kDequant;  // the integer path of Linear, Conv and MatMul layers
  std::string kernel;                      // what a decode-sized call runs
  std::string fallback;                    // why that is not the first choice ("" when it is)
  // Weight-only paths with DecodeActivations::kQ8Block32: a block-32 kernel quantizes the
  // activations of decode-sized calls (false when the exact int4 GEMV serves the groups, on CUDA).
  bool decode_q8 = false;
  // From large_m rows on a call runs large_m_kernel instead, read from the op's kernel table (the
  // weight-only paths: the weight dequantized once, then the float GEMM; int4 with int8
  // activations on AVX-512 VNNI: the panel GEMM; convolutions: rows are output pixels, oneDNN's
  // convolution); 0 when one kernel serves every M.
  int64_t large_m = 0;
  std::string large_m_kernel;
  // From mid_m rows up to large_m - 1 a call runs mid_m_kernel (CUDA int4: the staged tensor-core
  // GEMV, kernels/cuda/gemv_s4_rules.h); 0 when no such switch.
  int64_t mid_m = 0;
  std::string mid_m_kernel;
};

// The int4 layout a weight-only int4 layer was packed in: n16b32, or n16k8 with why not n16b32
// where the weight was a candidate (the packer's choice, which its plan then follows).
struct S4Packing {
  bool n16b32 = false;
  std::string why;
};

// Whether a weight-only int4 layer of spec `ws` packs as n16b32 (PackedLinearS4's one-stream form:
// codes and fp16 scales of symmetric qint4 groups of 32, Q4_0's 18 bytes per 32 weights) at ISA
// level `isa` (where the decode table has an n16b32 GEMV); false otherwise, with *why set when the
// spec is qint4 in groups of 32 (why not).
bool s4_one_stream(const QSpec& ws, int64_t in_features, Isa isa, std::string* why);
// The packer's half: the same without the symmetry check, so an asymmetric spec whose zero points
// are 0 or -1 beside positive scales (gguf load's negative block scales) still asks PackedLinearS4
// for n16b32, which folds them in or says why not (layout_status()).
bool s4_one_stream_packing(const QSpec& ws, int64_t in_features, Isa isa, std::string* why);

// The kernel text a layer report (describe()) shows: the decode-sized kernel, then mid_m_kernel
// with its rows when the plan switches at mid_m ("gemv_f32s4_mma_cuda | gemv_f32s4_mma_staged_cuda
// at M 2..16"); the kernel alone otherwise.
std::string plan_kernel_text(const KernelPlan& plan);

// The plan of a frozen Linear with `in_features` inputs, weights `weights` (nullopt: float
// weights, which freeze() refuses) and activations `activations` (`activation` is their spec for
// the static and dynamic modes), at ISA level `isa`.
// `decode` changes the kernels of the weight-only int8 / int4 paths only (their path stays).
// `packed`: the packed int4 layout of a frozen layer (null: the layout the packer picks at `isa`).
KernelPlan plan_linear(const std::optional<QSpec>& weights, ActivationMode activations, const QSpec& activation,
                       int64_t in_features, Isa isa = usable_isa(),
                       DecodeActivations decode = DecodeActivations::kExact, const S4Packing* packed = nullptr);

// The plan of the same frozen Linear on a CUDA device (out_features: cuBLASLt's shape rules need
// it). The path (what freeze() packs) is the CPU plan's; kernel and fallback say what the GPU
// runs: the int8 paths the fused kernel when cuda_linear_s8_fused() and its shape rules allow (at
// M = 1 on the smallest opt-in shared memory of sm_80+ GPUs), else the cuBLASLt IMMA GEMM (or its
// CUDA fallback, with the rule that failed),
// everything else a float weight (dequantized per call) through at::linear, with the reason.
KernelPlan plan_linear_cuda(const std::optional<QSpec>& weights, ActivationMode activations, const QSpec& activation,
                            int64_t in_features, int64_t out_features);

// Whether frozen int8 Linears on CUDA (kS8Dynamic, kS8Static) run the one-launch fused kernel
// (kernels/cuda/linear_s8_fused_cuda.h) where its rules allow, or the three-launch chain
// (quantize rows, cuBLASLt IMMA GEMM, epilogue). Process-wide; kCudaLinearS8FusedDefault until
// set. Plans made before a change keep what they said: set it before freeze() / to(cuda).
constexpr bool kCudaLinearS8FusedDefault = false;
void set_cuda_linear_s8_fused(bool on);
bool cuda_linear_s8_fused();

// The plan of a frozen MatMul (two activations, attention's Q.K^T and P.V) whose operands are
// quantized `activations` with spec `activation`: kS8Static / kS8Dynamic run bmm_s8s8f32 on CPU
// tensors (static: symmetric int8 scales per tensor or per head; dynamic: the first operand per row, the
// second per column, the contracted dimension being the one each scale spans), kDequant
// fake-quantizes both operands and runs at::matmul in float, with the reason.
KernelPlan plan_matmul(ActivationMode activations, const QSpec& activation, Isa isa = usable_isa());

}  // namespace qforge
