// Kernel tables and dispatchers of the int8 group-scale linears (decode and exact).
#include "kernels/cpu/linear_s8g.h"

#include <algorithm>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/gemm_q8_kernels.h"
#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/gemv_s4.h"
#include "kernels/cpu/linear_decode.h"
#include "kernels/cpu/parallel_blocks.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/workspace.h"

namespace qforge::kernels {

namespace {

// The decode GEMV and the prefill GEMM: x quantized once (or the thread's last rows reused), then
// 16-column blocks split across threads.
template <void (*kKernel)(const detail::GemvQ8S8GArgs&, int64_t, int64_t)>
[[maybe_unused]] void run_q8s8g(const LinearS8GProblem& p) {
  const detail::Q8Rows& rows = detail::q8_rows(p.x, p.m, p.w.k);
  auto args = detail::q8_args<detail::GemvQ8S8GArgs>(rows, p.m, p.y, p.w.n, p.bias);
  args.w = p.w;
  detail::parallel_over_blocks(round_up(p.w.n, kS8BlockN) / kS8BlockN, kS8BlockN * p.w.kp * p.m,
                               [&](int64_t b, int64_t e) { kKernel(args, b, e); });
}

// The exact GEMV: rows padded to whole k quads.
template <void (*kKernel)(const detail::GemvF32S8GArgs&, int64_t, int64_t)>
[[maybe_unused]] void run_f32s8g(const LinearS8GProblem& p) {
  const S8GroupView& w = p.w;
  const detail::ScratchArray<float> padded(detail::Scratch::kPaddedInput, p.m * w.kp);
  detail::pad_rows(padded.data(), p.x, p.m, w.k, w.kp);
  detail::GemvF32S8GArgs args;
  args.x = padded.data(), args.m = p.m, args.ldx = w.kp;
  args.w = w, args.bias = p.bias, args.y = p.y, args.ldy = w.n;
  detail::parallel_over_blocks(round_up(w.n, kS8BlockN) / kS8BlockN, kS8BlockN * w.kp * p.m,
                               [&](int64_t b, int64_t e) { kKernel(args, b, e); });
}

void run_q8s8g_reference(const LinearS8GProblem& p) {
  const detail::Q8Rows& rows = detail::q8_rows(p.x, p.m, p.w.k);
  const S8GUnpacked u = unpack_s8g(p.w);
  linear_q8b32_s4_reference(rows.q.data(), rows.d.data(), rows.kb * kQ8Block, u.codes.data(), u.scale.data(),
                            u.zero.data(), p.w.group_size, p.bias, p.y, p.m, p.w.n, p.w.k);
}

void run_f32s8g_reference(const LinearS8GProblem& p) {
  const S8GUnpacked u = unpack_s8g(p.w);
  linear_f32_s4_reference(p.x, u.codes.data(), u.scale.data(), u.zero.data(), p.w.group_size, p.bias, p.y, p.m,
                          p.w.n, p.w.k);
}

// W = (float(c) - float(z)) * scale[n, g]: dequantize_int's (q - z) * s, since c - z is exact in
// float; each row read in place from its n16k4 block, the blocks split across the threads.
void run_s8g_dequant_gemm(const LinearS8GProblem& p) {
  const S8GroupView& w = p.w;
  detail::linear_f32_dequant_gemm(p.x, p.m, w.k, w.n, p.bias, p.y, [&](float* out) {
    detail::for_each_weight_row(w.n, w.kp, [&](int64_t n) {
      const int64_t nb = n / kS8BlockN, j = n % kS8BlockN;
      // Row n's 4 bytes in each 64-byte block of its column block (packed_layout.h).
      const int8_t* q = w.data + nb * w.kp * kS8BlockN + j * kS8BlockK;
      float* row = out + n * w.k;
      int64_t k = 0;
      for (; k + kS8BlockK <= w.k; k += kS8BlockK, q += kS8BlockBytes) {
        for (int64_t i = 0; i < kS8BlockK; ++i) row[k + i] = static_cast<float>(q[i]);
      }
      for (int64_t i = 0; k + i < w.k; ++i) row[k + i] = static_cast<float>(q[i]);
      for (int64_t g = 0; g < w.groups; ++g) {
        const int64_t meta = (nb * w.groups + g) * kS8BlockN + j;
        const float s = w.scales16 != nullptr ? fp16_bits_to_float(w.scales16[meta]) : w.scales32[meta];
        const float z = w.zeros != nullptr ? static_cast<float>(w.zeros[meta]) : 0.0f;
        for (k = g * w.group_size; k < std::min(w.k, (g + 1) * w.group_size); ++k) row[k] = (row[k] - z) * s;
      }
    });
  });
}

// Whole groups of whole blocks (of k quads for the exact GEMV), or one group per row.
bool groups_fit(const LinearS8GProblem& p, int64_t unit, std::string* why) {
  if (p.w.groups == 1 || p.w.group_size % unit == 0) return true;
  *why = "group_size=" + std::to_string(p.w.group_size) + " not a multiple of " + std::to_string(unit);
  return false;
}
bool q8_groups_fit(const LinearS8GProblem& p, std::string* why) { return groups_fit(p, kQ8Block, why); }
bool quad_groups_fit(const LinearS8GProblem& p, std::string* why) { return groups_fit(p, kS8BlockK, why); }

void run_exact_gemv(const LinearS8GProblem& p) { linear_f32s8gf32(p.x, p.m, p.w, p.bias, p.y); }

void require_view(const char* who, const float* x, int64_t M, const S8GroupView& w, float* y) {
  QF_REQUIRE(w.data != nullptr && w.n > 0 && w.k > 0 && w.kp == round_up(w.k, kS8BlockK) && w.group_size > 0 &&
                 w.groups == num_groups(w.k, w.group_size) && (w.scales16 != nullptr || w.scales32 != nullptr),
             "kernels/cpu: ", who, " got an empty or inconsistent packed weight (N=", w.n, " K=", w.k,
             " group_size=", w.group_size, ")");
  QF_REQUIRE(M >= 0 && (M == 0 || (x != nullptr && y != nullptr)), "kernels/cpu: ", who, " got M=", M,
             " or a null pointer");
}

}  // namespace

S8GUnpacked unpack_s8g(const S8GroupView& w) {
  S8GUnpacked u;
  u.codes.resize(static_cast<size_t>(w.n * w.k));
  unpack_s8_n16k4_reference(w.data, w.n, w.k, u.codes.data());
  u.scale.resize(static_cast<size_t>(w.n * w.groups));
  u.zero.resize(static_cast<size_t>(w.n * w.groups));
  for (int64_t n = 0; n < w.n; ++n) {
    for (int64_t g = 0; g < w.groups; ++g) {
      const int64_t meta = ((n / kS8BlockN) * w.groups + g) * kS8BlockN + n % kS8BlockN;
      u.scale[n * w.groups + g] = w.scales16 != nullptr ? fp16_bits_to_float(w.scales16[meta]) : w.scales32[meta];
      u.zero[n * w.groups + g] = w.zeros != nullptr ? w.zeros[meta] : 0;
    }
  }
  return u;
}

const KernelTable<LinearS8GProblem>& linear_q8s8g_kernels() {
  static const KernelTable<LinearS8GProblem> table{
      {"gemv_q8s8gf32_n16k4_avx512vnni", Isa::kAvx512Vnni, detail::serves_gemv<LinearS8GProblem>, q8_groups_fit,
       QF_KERNEL_AVX512VNNI(run_q8s8g<detail::gemv_q8s8gf32_n16k4_avx512vnni>)},
      {"gemv_q8s8gf32_n16k4_avx2", Isa::kAvx2, detail::serves_gemv<LinearS8GProblem>, q8_groups_fit,
       QF_KERNEL_AVX2(run_q8s8g<detail::gemv_q8s8gf32_n16k4_avx2>)},
      {"reference", Isa::kReference, detail::serves_gemv<LinearS8GProblem>, q8_groups_fit, run_q8s8g_reference},
      {kExactS8GGemvKernel, Isa::kReference, detail::serves_gemv<LinearS8GProblem>, nullptr, run_exact_gemv},
      {"gemm_q8s8gf32_n16k4_avx512vnni", Isa::kAvx512Vnni, detail::serves_gemm<LinearS8GProblem>, q8_groups_fit,
       QF_KERNEL_AVX512VNNI(run_q8s8g<detail::gemm_q8s8gf32_n16k4_avx512vnni>)},
      {kDequantGemmKernel, Isa::kReference, detail::serves_gemm<LinearS8GProblem>, nullptr, run_s8g_dequant_gemm},
  };
  return table;
}

const KernelTable<LinearS8GProblem>& linear_f32s8g_kernels() {
  static const KernelTable<LinearS8GProblem> table{
      {"gemv_f32s8gf32_n16k4_avx512", Isa::kAvx512, detail::serves_gemv<LinearS8GProblem>, quad_groups_fit,
       QF_KERNEL_AVX512(run_f32s8g<detail::gemv_f32s8gf32_n16k4_avx512>)},
      {"gemv_f32s8gf32_n16k4_avx2", Isa::kAvx2, detail::serves_gemv<LinearS8GProblem>, quad_groups_fit,
       QF_KERNEL_AVX2(run_f32s8g<detail::gemv_f32s8gf32_n16k4_avx2>)},
      {"reference", Isa::kReference, detail::serves_gemv<LinearS8GProblem>, nullptr, run_f32s8g_reference},
      {kDequantGemmKernel, Isa::kReference, detail::serves_gemm<LinearS8GProblem>, nullptr, run_s8g_dequant_gemm},
  };
  return table;
}

void linear_q8b32s8gf32(const float* x, int64_t M, const S8GroupView& w, const float* bias, float* y,
                        RunInfo* info) {
  require_view("linear_q8b32s8gf32", x, M, w, y);
  run_kernel_table(linear_q8s8g_kernels(), LinearS8GProblem{x, M, w, bias, y}, M, info);
}

void linear_f32s8gf32(const float* x, int64_t M, const S8GroupView& w, const float* bias, float* y, RunInfo* info) {
  require_view("linear_f32s8gf32", x, M, w, y);
  run_kernel_table(linear_f32s8g_kernels(), LinearS8GProblem{x, M, w, bias, y}, M, info);
}

}  // namespace qforge::kernels
