// Small-M int8-activation x int4-weight GEMM with per-group scales over the n16k8 layout,
// chosen at run time from its kernel table (gemv_s4_kernels()): gemm_s8s4f32_n16k8_avx512vnni
// (M >= 4) or gemv_s8s4f32_n16k8_avx512vnni (M < 4) -> gemv_s8s4f32_n16k8_avx2 -> reference.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/run_info.h"

namespace qforge::kernels {

// From this M on, unpacking each weight panel once (gemm_*) beats unpacking per row tile.
inline constexpr int64_t kS4PanelMinM = 4;

// One call of the int8 x int4 GEMM as its kernel table sees it (a null when planning).
struct GemvS4Problem {
  const int8_t* a = nullptr;
  int64_t m = 0;
  const float* a_scale = nullptr;
  S4N16K8View w;
  const float* bias = nullptr;
  float* y = nullptr;
};

// The ordered kernel table of gemv_s8s4f32.
const KernelTable<GemvS4Problem>& gemv_s4_kernels();

// y[M, N] (dense) as gemm_s8s4f32_reference with W = codes - z' (bit-exact). A is dense
// [M, K] in [-127, 127]; a_scale [M]; bias [N] or nullptr. The fast kernels need
// w.group_size % 8 == 0, otherwise the reference runs and info->fallback says so.
void gemv_s8s4f32(const int8_t* A, int64_t M, const float* a_scale, const S4N16K8View& w,
                  const float* bias, float* y, RunInfo* info = nullptr);

// Blocked per-group metadata of S4N16K8View from plain [N, G] arrays: scales as fp16 bits (0 in
// padding) and zero-point codes z - qmin (w_zero == nullptr means z = 0). Each output has
// round_up(N, 16) * G entries. Throws qforge::Error naming the first [n, g] whose scale is not
// finite and exactly representable as IEEE float16, or whose zero point is off the grid.
void pack_s4_group_meta(const float* w_scale, const int32_t* w_zero, int64_t N, int64_t G,
                        int qmin, Fp16Bits* scales, int8_t* zeros);

// Int4 codes (u = W - qmin) and plain [N, G] scales and zero-point codes of a packed weight, for
// the reference runners.
struct S4Unpacked {
  std::vector<int8_t> codes;  // [N, K]
  std::vector<float> scale;   // [N, G]
  std::vector<int32_t> zero;  // [N, G]
};
S4Unpacked unpack_s4(const S4N16K8View& w);

// A stored group scale as float (exact).
float fp16_bits_to_float(Fp16Bits bits);
// float -> fp16 bits when x converts exactly (finite, float(half(x)) == x), else false.
bool fp16_bits_exact(float x, Fp16Bits* bits);

// Inverse of pack_s4_group_meta: plain [N, G] float scales (exact) and zero-point codes.
void unpack_s4_group_meta(const Fp16Bits* scales, const int8_t* zeros, int64_t N, int64_t G,
                          float* w_scale, int32_t* zero_codes);

}  // namespace qforge::kernels
