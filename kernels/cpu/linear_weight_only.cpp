// Dispatcher of the weight-only (float activation) linears.
#include "kernels/cpu/linear_weight_only.h"

#include <cstring>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/gemv_s4.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel_blocks.h"
#include "kernels/cpu/reference.h"

namespace qforge::kernels {

namespace {

// x rows padded with 0.0f to kp (kernels read whole k blocks).
[[maybe_unused]] std::vector<float> padded_rows(const float* x, int64_t M, int64_t K,
                                                int64_t kp) {
  std::vector<float> out(static_cast<size_t>(M * kp), 0.0f);
  for (int64_t m = 0; m < M; ++m) {
    std::memcpy(out.data() + m * kp, x + m * K, static_cast<size_t>(K) * sizeof(float));
  }
  return out;
}

}  // namespace

void linear_f32s8f32(const float* x, int64_t M, const S8N16K4View& w, const float* w_scale,
                     const float* bias, float* y, RunInfo* info) {
  QF_REQUIRE(w.data != nullptr && w.n > 0 && w.k > 0 && w.kp == round_up(w.k, kS8BlockK),
             "kernels/cpu: linear_f32s8f32 got an empty or inconsistent packed weight (N=", w.n,
             " K=", w.k, " Kp=", w.kp, ")");
  QF_REQUIRE(M >= 0 && (M == 0 || (x != nullptr && y != nullptr && w_scale != nullptr)),
             "kernels/cpu: linear_f32s8f32 got M=", M, " or a null pointer");
  RunInfo local;
  RunInfo& ri = info != nullptr ? *info : local;
  ri = RunInfo{};
  std::string why;
  constexpr const char* kAvx512 = "gemv_f32s8f32_n16k4_avx512";
  if (isa_usable(Isa::kAvx512, &why)) {
#ifdef QFORGE_KERNELS_AVX512
    ri.kernel = kAvx512;
    if (M == 0) return;
    const std::vector<float> xp = padded_rows(x, M, w.k, w.kp);
    detail::GemvF32S8Args args;
    args.x = xp.data();
    args.m = M;
    args.ldx = w.kp;
    args.w = w;
    args.w_scale = w_scale;
    args.bias = bias;
    args.y = y;
    args.ldy = w.n;
    detail::parallel_over_blocks(round_up(w.n, kS8BlockN) / kS8BlockN, kS8BlockN * w.kp * M,
                                 [&](int64_t b, int64_t e) {
                                   detail::gemv_f32s8f32_n16k4_avx512(args, b, e);
                                 });
    return;
#endif
  }
  ri.skip(kAvx512, why);
  ri.kernel = "reference";
  if (M == 0) return;
  std::vector<int8_t> W(static_cast<size_t>(w.n * w.k));
  unpack_s8_n16k4_reference(w.data, w.n, w.k, W.data());
  linear_f32_s8_reference(x, W.data(), w_scale, bias, y, M, w.n, w.k);
}

void linear_f32s4f32(const float* x, int64_t M, const S4N16K8View& w, const float* bias, float* y,
                     RunInfo* info) {
  QF_REQUIRE(w.data != nullptr && w.n > 0 && w.k > 0 && w.kp == round_up(w.k, kS4BlockK) &&
                 w.group_size > 0 && w.groups == num_groups(w.k, w.group_size),
             "kernels/cpu: linear_f32s4f32 got an empty or inconsistent packed weight (N=", w.n,
             " K=", w.k, " group_size=", w.group_size, ")");
  QF_REQUIRE(M >= 0 && (M == 0 || (x != nullptr && y != nullptr)),
             "kernels/cpu: linear_f32s4f32 got M=", M, " or a null pointer");
  RunInfo local;
  RunInfo& ri = info != nullptr ? *info : local;
  ri = RunInfo{};
  std::string why;
  constexpr const char* kAvx512 = "gemv_f32s4f32_n16k8_avx512";
  if (!isa_usable(Isa::kAvx512, &why)) {
    ri.skip(kAvx512, why);
  } else if (w.group_size % kS4BlockK != 0) {
    ri.skip(kAvx512, "group_size=" + std::to_string(w.group_size) + " not a multiple of 8");
  } else {
#ifdef QFORGE_KERNELS_AVX512
    ri.kernel = kAvx512;
    if (M == 0) return;
    const std::vector<float> xp = padded_rows(x, M, w.k, w.kp);
    detail::GemvF32S4Args args;
    args.x = xp.data();
    args.m = M;
    args.ldx = w.kp;
    args.w = w;
    args.bias = bias;
    args.y = y;
    args.ldy = w.n;
    detail::parallel_over_blocks(round_up(w.n, kS4BlockN) / kS4BlockN, kS4BlockN * w.kp * M,
                                 [&](int64_t b, int64_t e) {
                                   detail::gemv_f32s4f32_n16k8_avx512(args, b, e);
                                 });
    return;
#endif
  }
  ri.kernel = "reference";
  if (M == 0) return;
  const int64_t N = w.n, G = w.groups;
  std::vector<int8_t> codes(static_cast<size_t>(N * w.k));
  unpack_s4_n16k8_reference(w.data, N, w.k, 0, codes.data());
  std::vector<float> scale(static_cast<size_t>(N * G));
  std::vector<int32_t> zero(static_cast<size_t>(N * G));
  unpack_s4_group_meta(w.scales, w.zeros, N, G, scale.data(), zero.data());
  linear_f32_s4_reference(x, codes.data(), scale.data(), zero.data(), w.group_size, bias, y, M, N,
                          w.k);
}

}  // namespace qforge::kernels
