// Internal interface between the dispatchers (gemv_s8.cpp, gemv_s4.cpp) and the ISA-specific
// small-M kernels, which live in files compiled with their own -m flags. Kernels see raw
// pointers only and work on a range of 16-column blocks, so the dispatcher can split N across
// threads with at::parallel_for. Nothing here includes ATen (ISA files skip the PCH).
#pragma once

#include <cstdint>

#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/reference.h"

namespace qforge::kernels::detail {

// The q8 decode / prefill kernels' block geometry: one 32-value activation block spans this many
// n16k4 (int8) or n16k8 (int4) weight blocks; int8 codes enter VPDPBUSD as c ^ 0x80 = c + 128.
inline constexpr int64_t kQuadsPerBlock = kQ8Block / kS8BlockK;
inline constexpr int64_t kOctsPerBlock = kQ8Block / kS4BlockK;
inline constexpr int kWeightOffset = 128;

// int8 activations x n16k4 int8 weights. Rows of A are padded to w.kp (lda >= w.kp).
struct GemvS8Args {
  const int8_t* a_s8 = nullptr;   // AVX2 kernel: values in [-127, 127], padding 0
  const uint8_t* a_u8 = nullptr;  // VNNI kernel: any padding (padded weights are 0)
  int32_t a_zero_point = 0;       // VNNI kernel computes sum_k (a_u8 - a_zero_point) * w
  int64_t m = 0, lda = 0;
  S8N16K4View w;
  // Output: int32 C[m][ldc] when c != nullptr, else the dequantizing epilogue into y[m][ldy]:
  // y = fmaf(float(acc) * w_scale[n], a_scale[m], bias ? bias[n] : 0).
  int32_t* c = nullptr;
  int64_t ldc = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  const float* a_scale = nullptr;  // [m]
  const float* w_scale = nullptr;  // [N]
  const float* bias = nullptr;     // [N] or nullptr
};

// int8 activations x n16k8 int4 weights, per-group scales, fused float epilogue (see
// gemm_s8s4f32_reference). Requires w.group_size % 8 == 0; rows of A padded to w.kp with 0.
struct GemvS4Args {
  const int8_t* a = nullptr;           // values in [-127, 127]
  int64_t m = 0, lda = 0;
  const int32_t* a_group_sum = nullptr;  // [m][w.groups]: sum of a over each group
  const float* a_scale = nullptr;        // [m]
  S4N16K8View w;
  const float* bias = nullptr;           // [N] or nullptr
  float* y = nullptr;
  int64_t ldy = 0;
};

// Each computes the output columns of 16-column blocks [nb_begin, nb_end), all m rows.
using GemvS8Fn = void (*)(const GemvS8Args&, int64_t nb_begin, int64_t nb_end);
using GemvS4Fn = void (*)(const GemvS4Args&, int64_t nb_begin, int64_t nb_end);

void gemv_u8s8s32_n16k4_avx512vnni(const GemvS8Args& args, int64_t nb_begin, int64_t nb_end);
void gemv_s8s8s32_n16k4_avx2(const GemvS8Args& args, int64_t nb_begin, int64_t nb_end);
void gemv_s8s4f32_n16k8_avx512vnni(const GemvS4Args& args, int64_t nb_begin, int64_t nb_end);
void gemv_s8s4f32_n16k8_avx2(const GemvS4Args& args, int64_t nb_begin, int64_t nb_end);

// Larger-M variant: unpacks up to kS4PanelBlocks column blocks at a time into `panel`
// (kS4PanelBlocks * w.kp * 16 bytes, 64-byte aligned, one per thread) and reuses them across
// all rows.
inline constexpr int64_t kS4PanelBlocks = 4;
using GemmS4Fn = void (*)(const GemvS4Args&, int64_t nb_begin, int64_t nb_end, uint8_t* panel);
void gemm_s8s4f32_n16k8_avx512vnni(const GemvS4Args& args, int64_t nb_begin, int64_t nb_end,
                                   uint8_t* panel);

// The float output shared by the weight-only and decode kernels over a packed view W:
// y[m][ldy], columns [0, w.n).
template <class View>
struct FloatOutArgs {
  View w;
  const float* w_scale = nullptr;  // [N], int8 weights only (int4 group scales are in the view)
  const float* bias = nullptr;     // [N] or nullptr
  float* y = nullptr;
  int64_t ldy = 0;
};

// Weight-only: float activations x packed int8 / int4 weights (linear_f32_s8_reference /
// linear_f32_s4_reference semantics, bit for bit: one column per lane, k in order). Rows of x are
// padded to w.kp with 0.0f. For int4, w.group_size % 8 == 0.
template <class View>
struct GemvF32Args : FloatOutArgs<View> {
  const float* x = nullptr;
  int64_t m = 0, ldx = 0;
};
using GemvF32S8Args = GemvF32Args<S8N16K4View>;
using GemvF32S4Args = GemvF32Args<S4N16K8View>;
void gemv_f32s8f32_n16k4_avx512(const GemvF32S8Args& args, int64_t nb_begin, int64_t nb_end);
void gemv_f32s4f32_n16k8_avx512(const GemvF32S4Args& args, int64_t nb_begin, int64_t nb_end);
void gemv_f32s4f32_n16b32_avx512(const GemvF32S4Args& args, int64_t nb_begin, int64_t nb_end);

// Decode: block-32 int8 activations (quantize_rows_q8b32_reference: codes q, scales d, code
// sums s, kb blocks per row, rows of q padded with 0 to ldq >= kb * 32) x packed int8 / int4
// weights, the float epilogue of linear_q8b32_s8_reference / linear_q8b32_s4_reference bit for
// bit (one column per lane, blocks in order). For int4, w.group_size % 32 == 0 or w.groups == 1.
template <class View>
struct GemvQ8Args : FloatOutArgs<View> {
  const int8_t* q = nullptr;
  const float* d = nullptr;
  const int32_t* s = nullptr;
  int64_t m = 0, ldq = 0, kb = 0;
};
using GemvQ8S8Args = GemvQ8Args<S8N16K4View>;
using GemvQ8S4Args = GemvQ8Args<S4N16K8View>;
void gemv_q8s8f32_n16k4_avx512vnni(const GemvQ8S8Args& args, int64_t nb_begin, int64_t nb_end);
void gemv_q8s8f32_n16k4_avx2(const GemvQ8S8Args& args, int64_t nb_begin, int64_t nb_end);
void gemv_q8s4f32_n16k8_avx512vnni(const GemvQ8S4Args& args, int64_t nb_begin, int64_t nb_end);
void gemv_q8s4f32_n16b32_avx512vnni(const GemvQ8S4Args& args, int64_t nb_begin, int64_t nb_end);
void gemv_q8s4f32_n16k8_avx2(const GemvQ8S4Args& args, int64_t nb_begin, int64_t nb_end);
void gemv_q8s4f32_n16b32_avx2(const GemvQ8S4Args& args, int64_t nb_begin, int64_t nb_end);

// int8 weights with group scales (S8GroupView): block-32 decode (linear_q8b32_s4_reference's
// formula on the int8 codes; w.group_size % 32 == 0 or w.groups == 1) and weight-only float
// (linear_f32_s4_reference's; w.group_size % 4 == 0 or w.groups == 1), bit for bit.
using GemvQ8S8GArgs = GemvQ8Args<S8GroupView>;
using GemvF32S8GArgs = GemvF32Args<S8GroupView>;
void gemv_q8s8gf32_n16k4_avx512vnni(const GemvQ8S8GArgs& args, int64_t nb_begin, int64_t nb_end);
void gemv_q8s8gf32_n16k4_avx2(const GemvQ8S8GArgs& args, int64_t nb_begin, int64_t nb_end);
void gemv_f32s8gf32_n16k4_avx512(const GemvF32S8GArgs& args, int64_t nb_begin, int64_t nb_end);
void gemv_f32s8gf32_n16k4_avx2(const GemvF32S8GArgs& args, int64_t nb_begin, int64_t nb_end);

}  // namespace qforge::kernels::detail
