// The static part of the packed-linear ops' kernel tables: which entry a call of M rows (M = 1:
// decode size) runs at a given ISA level, and which entries were skipped and why. It depends only
// on the op, the level, M and the group size, never on data, so freeze() can plan a layer once and
// describe() and the dry run can show the plan without running anything. It walks the same table
// the dispatchers run (kernel_table.h), so the two cannot disagree.
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

enum class LinearOp : uint8_t {
  kS8S8,   // int8 activations x int8 weights (gemv_s8s8f32; PackedLinearS8::run)
  kS8S4,   // int8 activations x 4-bit weights (gemv_s8s4f32; PackedLinearS4::run)
  kF32S8,  // float activations x int8 weights (linear_f32s8f32, weight-only)
  kF32S4,  // float activations x 4-bit weights (linear_f32s4f32, weight-only)
  kF32Lut, // float activations x codebook weights (PackedLinearLut::run, weight-only)
  kF32Fp4, // float activations x MXFP4 / NVFP4 weights (PackedLinearFp4::run, weight-only)
  kQ8S8,   // block-32 int8 activations x int8 weights (linear_q8b32s8f32; PackedLinearS8::run_decode)
  kQ8S4,   // block-32 int8 activations x 4-bit weights (linear_q8b32s4f32; PackedLinearS4::run_decode)
  kF32S8G, // float activations x int8 weights with group scales (linear_f32s8gf32; PackedLinearS8G::run_weight_only)
  kQ8S8G,  // block-32 int8 activations x int8 group-scale weights (linear_q8b32s8gf32; PackedLinearS8G::run_decode)
};

const char* to_string(LinearOp op);

// The kernel the dispatcher of `op` runs for M rows when `usable` is the highest usable level (a
// level also needs to be compiled in). `group_size` matters for the 4-bit and int8-group ops (0
// for the others; for kQ8S4, kF32S8G and kQ8S8G, 0 means one group per row).
// Data-dependent conditions (int8 activations holding -128) are assumed not to hold.
// `layout` matters for kF32S4 and kQ8S4 (PackedLinearS4's n16k8 or n16b32 form).
RunInfo choose_kernel(LinearOp op, Isa usable, int64_t m, int64_t group_size = 0,
                      S4Layout layout = S4Layout::kN16K8);

// choose_kernel for M = 1, what a decode-sized call runs.
RunInfo choose_decode_kernel(LinearOp op, Isa usable, int64_t group_size = 0, S4Layout layout = S4Layout::kN16K8);

// The first M above decode size (M = 1) at which the dispatcher of `op` runs another entry of its
// table, with that entry in *large; 0 (and *large untouched) when one entry serves every M.
int64_t choose_large_m(LinearOp op, Isa usable, int64_t group_size, RunInfo* large,
                       S4Layout layout = S4Layout::kN16K8);

// The frozen integer convolution's plan (conv_s8_kernels()) at level `usable`, for int8 or int4
// weights with `k` columns (C * kh * kw; int4: rounded up to kS4BlockK, its one group):
// `kernel` is the chain an input of kMinConvChunkRows output pixels runs ("im2col_s8+<GEMM>"),
// and from large_rows output pixels on (0: never) the chain large_kernel. depthwise: a
// groups == C == N convolution (int8 weights, k = kh * kw), whose one kernel serves every size.
// groups > 1 (not depthwise; k = C / groups * kh * kw): oneDNN's grouped convolution at every size
// where its entry serves (int8 weights) and `usable` allows it, else the groups = 1 chain run once
// per group (" per group (G groups)" in the text, oneDNN's reason in the fallback).
struct ConvChoice {
  RunInfo kernel;
  int64_t large_rows = 0;
  RunInfo large_kernel;
  bool needs_onednn_copy = false;  // an entry it plans runs oneDNN's convolution (freeze() builds the copy)
};
ConvChoice choose_conv_kernel(bool int4, Isa usable, int64_t k, bool depthwise = false, int64_t groups = 1);

}  // namespace qforge::kernels
