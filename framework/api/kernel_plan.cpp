// plan_linear: the paths of a frozen Linear and the kernel each runs at decode size.
#include "framework/api/kernel_plan.h"

#include <algorithm>
#include <atomic>

#include "framework/api/quantizer.h"
#include "framework/core/error.h"
#include "kernels/cpu/fp4_linear.h"
#include "kernels/cpu/kernel_choice.h"
#include "kernels/cpu/linear_decode.h"
#include "kernels/cpu/linear_s8g.h"
#include "kernels/cpu/linear_weight_only.h"
#include "kernels/cpu/lut_linear.h"
#include "kernels/cuda/cublaslt_int8_rules.h"
#include "kernels/cuda/gemv_s4_rules.h"
#include "kernels/cuda/gemv_s8_rules.h"
#include "kernels/cuda/linear_s8_fused_rules.h"

namespace qforge {

namespace {

// Static activations can feed the int8 kernels when they are symmetric per-tensor qint8 within
// [-127, 127] (the AVX2 kernel's VPMADDUBSW sign trick).
bool static_act_fits_kernels(const QSpec& a, std::string* why) {
  if (!(a.qtype == qint8 && a.granularity == Granularity::kPerTensor)) {
    *why = "static activations are not per-tensor qint8";
    return false;
  }
  if (!a.symmetric) {
    *why = "affine static activations (zero point) have no integer kernel";
    return false;
  }
  if (a.quant_min() < -127) {
    *why = "static activation grid includes -128 (use narrow_range for the integer kernels)";
    return false;
  }
  return true;
}

// Dynamic per-token activations: qint8 rows on [-127, 127], and the narrower signed grids (W4A4's
// qint4 rows on [-7, 7], qint3, qint2) as int8 codes (quantize_rows_s8's qmax), for the CPU Linear
// and MatMul kernels alike (a CUDA Linear's int8 row quantizer takes int8's grid only:
// LinearImpl::plan says so).
bool dynamic_act_fits_kernels(const QSpec& a, std::string* why) {
  if (a.qtype == qint8 || QuantizerImpl::dynamic_qtype_supported(a.qtype)) return true;
  *why = detail::str_cat("dynamic ", a.qtype.name, " per-token activations have no integer kernel (signed integer rows only)");
  return false;
}

// The kernels of `op` at decode size and, where its table switches entry by rows, above.
void plan_kernels(kernels::LinearOp op, Isa isa, int64_t group, KernelPlan* plan,
                  kernels::S4Layout layout = kernels::S4Layout::kN16K8) {
  const kernels::RunInfo ri = kernels::choose_decode_kernel(op, isa, group, layout);
  plan->kernel = ri.kernel;
  plan->fallback = ri.fallback;
  kernels::RunInfo large;
  plan->large_m = kernels::choose_large_m(op, isa, group, &large, layout);
  plan->large_m_kernel = large.kernel;
}

// MXFP4 / NVFP4 weights: the fp4 weight-only kernels (kernels/cpu/fp4_linear.h) wherever the
// block fits them; activations other than float enter as their fake-quant values.
KernelPlan plan_fp4(const QSpec& ws, ActivationMode act, int64_t in_features, Isa isa) {
  KernelPlan plan;
  plan.kernel = "dequantize+at::linear";
  std::string why;
  if (!kernels::PackedLinearFp4::supports(in_features, ws.group_size, &why)) {
    plan.fallback = why + ": dequantized per call";
    return plan;
  }
  plan.path = LinearPath::kFp4WeightOnly;
  plan_kernels(kernels::LinearOp::kF32Fp4, isa, 0, &plan);
  if (act != ActivationMode::kNone)
    plan.fallback += detail::str_cat(plan.fallback.empty() ? "" : "; ", to_string(act),
                                     " activations are fake-quantized in float (the fp4 kernels take float inputs)");
  return plan;
}

// Weight-only int8 with group scales: the exact or the block-32 decode table of PackedLinearS8G.
KernelPlan plan_s8_groups(const QSpec& ws, int64_t in_features, Isa isa, DecodeActivations decode) {
  KernelPlan plan;
  plan.path = LinearPath::kS8GroupWeightOnly;
  const bool q8 = decode == DecodeActivations::kQ8Block32;
  const int64_t group = ws.group_size < in_features ? ws.group_size : 0;
  plan_kernels(q8 ? kernels::LinearOp::kQ8S8G : kernels::LinearOp::kF32S8G, isa, group, &plan);
  plan.decode_q8 = q8 && plan.kernel != kernels::kExactS8GGemvKernel;
  return plan;
}

// Whether a weight-only int4 plan reads n16b32: the packed layout once packed (set_max_isa may
// have moved since), else the packer's rule at `isa`.
bool s4_stream(LinearPath path, const QSpec& ws, int64_t in_features, Isa isa, const S4Packing* packed,
               std::string* why) {
  if (path != LinearPath::kS4WeightOnly) return false;
  if (packed == nullptr) return s4_one_stream(ws, in_features, isa, why);
  *why = packed->why;
  return packed->n16b32;
}

}  // namespace

const char* to_string(LinearPath path) {
  switch (path) {
    case LinearPath::kDequant: return "dequantize";
    case LinearPath::kS8Dynamic: return "s8_dynamic";
    case LinearPath::kS8Static: return "s8_static";
    case LinearPath::kS4Dynamic: return "s4_dynamic";
    case LinearPath::kS4Static: return "s4_static";
    case LinearPath::kS8WeightOnly: return "s8_weight_only";
    case LinearPath::kS4WeightOnly: return "s4_weight_only";
    case LinearPath::kLutWeightOnly: return "lut_weight_only";
    case LinearPath::kFp4WeightOnly: return "fp4_weight_only";
    case LinearPath::kS8GroupWeightOnly: return "s8g_weight_only";
  }
  return "?";
}

const char* to_string(DecodeActivations d) {
  switch (d) {
    case DecodeActivations::kExact: return "exact";
    case DecodeActivations::kQ8Block32: return "q8_block32";
  }
  return "?";
}

bool s4_one_stream_packing(const QSpec& ws, int64_t in_features, Isa isa, std::string* why) {
  // Only qint4 groups of 32 are Q4_0-shaped; other int4 layers are not told why they are n16k8.
  const bool q4_0 = ws.qtype == qint4 && ws.granularity == Granularity::kPerGroup &&
                    std::min(ws.group_size, in_features) == std::min(kernels::kS4B32K, in_features);
  if (!q4_0) return false;
  // n16b32 where its decode table has a GEMV at `isa` (the plan reads the table, never a level).
  const kernels::RunInfo gemv = kernels::choose_decode_kernel(kernels::LinearOp::kQ8S4, isa, kernels::kS4B32K,
                                                              kernels::S4Layout::kN16B32);
  if (gemv.kernel == "reference") {
    *why = std::string("n16b32 (Q4_0's one-stream form) not used: no n16b32 decode kernel at ") + isa_name(isa) +
           " (" + gemv.fallback + ")";
    return false;
  }
  return true;
}

bool s4_one_stream(const QSpec& ws, int64_t in_features, Isa isa, std::string* why) {
  if (!s4_one_stream_packing(ws, in_features, isa, why)) return false;
  if (!ws.symmetric) {
    *why = "n16b32 (Q4_0's one-stream form) not used: zero points beside the codes (n16k8; only zero points 0 "
           "and -1, a GGUF file's negative block scales, fold into it when packed)";
    return false;
  }
  return true;
}

KernelPlan plan_linear(const std::optional<QSpec>& weights, ActivationMode act, const QSpec& activation,
                       int64_t in_features, Isa isa, DecodeActivations decode, const S4Packing* packed) {
  KernelPlan plan;
  plan.kernel = "dequantize+at::linear";
  if (!weights) {
    plan.kernel = "at::linear";
    plan.fallback = "float weights";
    return plan;
  }
  const QSpec& ws = *weights;
  // Per-row scales: per-tensor, per-group, or per-channel along the output features.
  const bool per_row_scales = ws.granularity != Granularity::kPerChannel || ws.axis == 0 || ws.axis == -2;
  // Symmetric signed int8 has zero points 0 by construction.
  const bool s8_weights =
      ws.qtype == qint8 && ws.symmetric && per_row_scales && ws.granularity != Granularity::kPerGroup;
  const bool s4_weights = nibble_packed(ws.qtype) && per_row_scales;
  // int8 per group along K (either sign of scale, any zero point in the grid): PackedLinearS8G.
  const bool s8_groups = ws.qtype == qint8 && ws.granularity == Granularity::kPerGroup;
  std::string why;
  if (ws.qtype.is_codebook()) {
    // One codebook per output row (or per group of a row, or one shared by all rows).
    const int64_t group = ws.granularity == Granularity::kPerGroup ? ws.group_size : in_features;
    if (!per_row_scales) {
      plan.fallback = "codebooks along an axis other than the output features have no look-up-table kernel: "
                      "dequantized per call";
      return plan;
    }
    if (!kernels::PackedLinearLut::supports(ws.qtype.bits, in_features, group, &why)) {
      plan.fallback = why + ": dequantized per call";
      return plan;
    }
    plan.path = LinearPath::kLutWeightOnly;
    plan_kernels(kernels::LinearOp::kF32Lut, isa, 0, &plan);
    if (act != ActivationMode::kNone) {
      plan.fallback += detail::str_cat(plan.fallback.empty() ? "" : "; ", to_string(act),
                                       " activations are fake-quantized in float (the look-up-table kernel takes "
                                       "float inputs)");
    }
    return plan;
  }
  if (ws.qtype.is_microscaling()) return plan_fp4(ws, act, in_features, isa);
  if (act == ActivationMode::kNone && s8_groups) return plan_s8_groups(ws, in_features, isa, decode);
  if (act == ActivationMode::kNone && (s8_weights || s4_weights)) {
    plan.path = s8_weights ? LinearPath::kS8WeightOnly : LinearPath::kS4WeightOnly;
  } else if (act == ActivationMode::kNone) {
    plan.fallback = detail::str_cat("no weight-only kernel for ", ws.to_string(), " weights: dequantized per call");
    return plan;
  } else if (act == ActivationMode::kStatic && !static_act_fits_kernels(activation, &why)) {
    plan.fallback = why;
    return plan;
  } else if (act == ActivationMode::kDynamicPerToken && !dynamic_act_fits_kernels(activation, &why)) {
    plan.fallback = why + ": the weight is dequantized per call and the activations fake-quantized in float";
    return plan;
  } else if (s8_weights) {
    plan.path = act == ActivationMode::kStatic ? LinearPath::kS8Static : LinearPath::kS8Dynamic;
  } else if (s4_weights) {
    plan.path = act == ActivationMode::kStatic ? LinearPath::kS4Static : LinearPath::kS4Dynamic;
  } else {
    plan.fallback = detail::str_cat("no integer kernel for ", ws.to_string(), " weights");
    return plan;
  }
  const int64_t group = ws.granularity == Granularity::kPerGroup ? std::min(ws.group_size, in_features) : in_features;
  kernels::LinearOp op = kernels::LinearOp::kS8S8;
  const bool q8 = decode == DecodeActivations::kQ8Block32;
  switch (plan.path) {
    case LinearPath::kS8Dynamic:
    case LinearPath::kS8Static: op = kernels::LinearOp::kS8S8; break;
    case LinearPath::kS4Dynamic:
    case LinearPath::kS4Static: op = kernels::LinearOp::kS8S4; break;
    case LinearPath::kS8WeightOnly: op = q8 ? kernels::LinearOp::kQ8S8 : kernels::LinearOp::kF32S8; break;
    case LinearPath::kS4WeightOnly: op = q8 ? kernels::LinearOp::kQ8S4 : kernels::LinearOp::kF32S4; break;
    case LinearPath::kLutWeightOnly:
    case LinearPath::kFp4WeightOnly:
    case LinearPath::kS8GroupWeightOnly:
    case LinearPath::kDequant: break;
  }
  const bool s4 = op == kernels::LinearOp::kS8S4 || op == kernels::LinearOp::kF32S4;
  // kQ8S4 takes 0 for one group per row (any in_features fits its blocks).
  const int64_t op_group = s4 ? group : op == kernels::LinearOp::kQ8S4 && group < in_features ? group : 0;
  std::string stream_why;
  const bool stream = s4_stream(plan.path, ws, in_features, isa, packed, &stream_why);
  plan_kernels(op, isa, op_group, &plan, stream ? kernels::S4Layout::kN16B32 : kernels::S4Layout::kN16K8);
  if (!stream_why.empty()) plan.fallback += (plan.fallback.empty() ? "" : "; ") + stream_why;
  plan.decode_q8 = (op == kernels::LinearOp::kQ8S8 || op == kernels::LinearOp::kQ8S4) &&
                   plan.kernel != kernels::kExactS4GemvKernel;
  return plan;
}

KernelPlan plan_matmul(ActivationMode act, const QSpec& activation, Isa isa) {
  KernelPlan plan;
  if (act == ActivationMode::kNone) {
    plan.kernel = "at::matmul";
    return plan;
  }
  plan.kernel = "fake_quant+at::matmul";
  std::string why;
  // Per-head static scales (per channel on the heads axis) are arrays the kernel takes per slice;
  // the grid itself must fit as a per-tensor one would.
  QSpec grid = activation;
  if (act == ActivationMode::kStatic && grid.granularity == Granularity::kPerChannel)
    grid.granularity = Granularity::kPerTensor;
  if (act == ActivationMode::kStatic && !static_act_fits_kernels(grid, &why)) {
    plan.fallback = why + ": operands are quantize-dequantized in float";
    return plan;
  }
  if (act == ActivationMode::kDynamicPerToken && !dynamic_act_fits_kernels(activation, &why)) {
    plan.fallback = why + ": operands are quantize-dequantized in float";
    return plan;
  }
  plan.path = act == ActivationMode::kStatic ? LinearPath::kS8Static : LinearPath::kS8Dynamic;
  const kernels::RunInfo ri = kernels::choose_decode_kernel(kernels::LinearOp::kS8S8, isa);
  plan.kernel = "bmm_s8s8f32+" + ri.kernel;
  plan.fallback = ri.fallback;
  return plan;
}

std::string plan_kernel_text(const KernelPlan& plan) {
  if (plan.mid_m == 0) return plan.kernel;
  const std::string rows = plan.large_m > plan.mid_m ? detail::str_cat(plan.mid_m, "..", plan.large_m - 1)
                                                     : detail::str_cat(">= ", plan.mid_m);
  return detail::str_cat(plan.kernel, " | ", plan.mid_m_kernel, " at M ", rows);
}

namespace {
std::atomic<bool> g_cuda_linear_s8_fused{kCudaLinearS8FusedDefault};
}  // namespace

void set_cuda_linear_s8_fused(bool on) { g_cuda_linear_s8_fused.store(on, std::memory_order_relaxed); }

bool cuda_linear_s8_fused() { return g_cuda_linear_s8_fused.load(std::memory_order_relaxed); }

KernelPlan plan_linear_cuda(const std::optional<QSpec>& weights, ActivationMode act, const QSpec& activation,
                            int64_t in_features, int64_t out_features) {
  KernelPlan plan = plan_linear(weights, act, activation, in_features, Isa::kReference);
  // The GPU runs one kernel at every M.
  plan.large_m = 0;
  plan.large_m_kernel.clear();
  plan.decode_q8 = false;  // the CUDA kernels take float activations
  plan.mid_m = 0;
  plan.mid_m_kernel.clear();
  switch (plan.path) {
    case LinearPath::kS8Dynamic:
    case LinearPath::kS8Static: {
      // A decode-sized call (M = 1; M is free for cuBLASLt) with dense rows: lda = ldb = K, ldc = N.
      std::string why, fused_why;
      if (cuda_linear_s8_fused() &&
          cuda::linear_s8_fused_supported(1, out_features, in_features, cuda::fused_tile_for(1, in_features),
                                          cuda::kFusedMinOptInSmem, &fused_why)) {
        plan.kernel = "linear_s8_fused_cuda";
        plan.fallback.clear();
      } else if (cuda::cublaslt_int8_supported(1, out_features, in_features, in_features, in_features, out_features,
                                               &why)) {
        plan.kernel = "gemm_s8s8s32_cublaslt";
        plan.fallback.clear();
      } else {
        plan.kernel = "gemm_s8s8s32_cuda";
        plan.fallback = "gemm_s8s8s32_cublaslt: " + why;
      }
      if (!fused_why.empty())
        plan.fallback = "linear_s8_fused_cuda: " + fused_why + (plan.fallback.empty() ? "" : "; " + plan.fallback);
      break;
    }
    case LinearPath::kS4Dynamic:
    case LinearPath::kS4Static:
    case LinearPath::kS4WeightOnly: {
      // Decode-sized calls (M <= 16) read the packed codes once; larger M dequantize per call.
      std::string why;
      const int64_t group = weights->granularity == Granularity::kPerGroup ? weights->group_size : in_features;
      std::string mma_why;
      if (cuda::gemv_f32s4_mma_supported(1, in_features, group, &mma_why)) {
        // Tensor cores (sm_80+; older GPUs run gemv_f32s4_cuda); M = 1 stages on large shapes too.
        plan.kernel = cuda::gemv_f32s4_mma_kernel_for(1, out_features, in_features);
        plan.fallback.clear();
        if (!cuda::gemv_f32s4_mma_staged_for(1, out_features, in_features)) {
          plan.mid_m = cuda::kGemvS4MmaStagedMinM;
          plan.mid_m_kernel = cuda::gemv_f32s4_mma_kernel_for(plan.mid_m, out_features, in_features);
        }
        plan.large_m = cuda::kGemvS4MaxM + 1;
        plan.large_m_kernel = "dequantize_s4_cuda+at::linear";
      } else if (cuda::gemv_f32s4_supported(1, in_features, group, &why)) {
        plan.kernel = "gemv_f32s4_cuda";
        plan.fallback = "gemv_f32s4_mma_cuda: " + mma_why;
        plan.large_m = cuda::kGemvS4MaxM + 1;
        plan.large_m_kernel = "dequantize_s4_cuda+at::linear";
      } else {
        plan.kernel = "dequantize_s4_cuda+at::linear";
        plan.fallback = "gemv_f32s4_cuda: " + why + ": the int4 weight is dequantized to float per call "
                        "(dequantize_s4_cuda), then at::linear";
      }
      break;
    }
    case LinearPath::kS8WeightOnly: {
      // Decode-sized calls (M <= 16) read the int8 codes once; larger M dequantize per call.
      std::string why;
      if (cuda::gemv_f32s8_supported(1, in_features, &why)) {
        plan.kernel = "gemv_f32s8_cuda";
        plan.fallback.clear();
        plan.large_m = cuda::kGemvS8MaxM + 1;
        plan.large_m_kernel = "dequantize+at::linear";
      } else {
        plan.kernel = "dequantize+at::linear";
        plan.fallback = "gemv_f32s8_cuda: " + why + ": the int8 weight is dequantized to float per call, then "
                        "at::linear";
      }
      break;
    }
    case LinearPath::kS8GroupWeightOnly:
      plan.kernel = "dequantize+at::linear";
      plan.fallback = "no int8 group-scale kernel on CUDA: the weight is dequantized once to a float weight on the "
                      "device, then at::linear";
      break;
    case LinearPath::kFp4WeightOnly:
      plan.kernel = "dequantize+at::linear";
      plan.fallback = "no fp4 kernel on CUDA (block-scaled tensor cores need Blackwell): the weight is dequantized "
                      "once to a float weight on the device, then at::linear";
      break;
    case LinearPath::kLutWeightOnly:
      plan.kernel = "dequantize+at::linear";
      plan.fallback = "no look-up-table kernel on CUDA: the codebook weight is dequantized once to a float weight on "
                      "the device, then at::linear";
      break;
    case LinearPath::kDequant:
      if (!weights) break;  // float weights: at::linear
      plan.fallback += " (on CUDA: the dequantized float weight stays on the device)";
      break;
  }
  return plan;
}

}  // namespace qforge
