// Kernel tables and dispatchers of the weight-only (float activation) linears.
#include "kernels/cpu/linear_weight_only.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/gemv_s4.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel_blocks.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/workspace.h"

namespace qforge::kernels {

namespace {

// The op-specific fields of a GEMV kernel's arguments (int4 scales travel in the view).
[[maybe_unused]] void set_op_fields(detail::GemvF32S8Args* args, const LinearF32S8Problem& p) {
  args->w_scale = p.w_scale;
}
[[maybe_unused]] void set_op_fields(detail::GemvF32S4Args*, const LinearF32S4Problem&) {}

// The GEMV entries: the kernel's arguments from the problem and the padded input, then one ISA
// kernel over 16-column blocks split across the threads.
template <typename Args, typename Problem, void (*kKernel)(const Args&, int64_t, int64_t), int64_t kBlockN>
[[maybe_unused]] void run_gemv(const Problem& p) {
  const auto& w = p.w;
  const detail::ScratchArray<float> padded(detail::Scratch::kPaddedInput, p.m * w.kp);
  detail::pad_rows(padded.data(), p.x, p.m, w.k, w.kp);
  Args args;
  set_op_fields(&args, p);
  args.x = padded.data();
  args.m = p.m;
  args.ldx = w.kp;
  args.w = w;
  args.bias = p.bias;
  args.y = p.y;
  args.ldy = w.n;
  detail::parallel_over_blocks(round_up(w.n, kBlockN) / kBlockN, kBlockN * w.kp * p.m,
                               [&](int64_t b, int64_t e) { kKernel(args, b, e); });
}

#ifdef QFORGE_KERNELS_AVX512
constexpr auto kRunF32S8Avx512 =
    run_gemv<detail::GemvF32S8Args, LinearF32S8Problem, detail::gemv_f32s8f32_n16k4_avx512, kS8BlockN>;
constexpr auto kRunF32S4Avx512 =
    run_gemv<detail::GemvF32S4Args, LinearF32S4Problem, detail::gemv_f32s4f32_n16k8_avx512, kS4BlockN>;
constexpr auto kRunF32S4B32Avx512 =
    run_gemv<detail::GemvF32S4Args, LinearF32S4Problem, detail::gemv_f32s4f32_n16b32_avx512, kS4BlockN>;
#endif

void run_f32s8_reference(const LinearF32S8Problem& p) {
  std::vector<int8_t> W(static_cast<size_t>(p.w.n * p.w.k));
  unpack_s8_n16k4_reference(p.w.data, p.w.n, p.w.k, W.data());
  linear_f32_s8_reference(p.x, W.data(), p.w_scale, p.bias, p.y, p.m, p.w.n, p.w.k);
}

void run_f32s4_reference(const LinearF32S4Problem& p) {
  const S4Unpacked u = unpack_s4(p.w);
  linear_f32_s4_reference(p.x, u.codes.data(), u.scale.data(), u.zero.data(), p.w.group_size, p.bias, p.y, p.m,
                          p.w.n, p.w.k);
}

// W = float(q) * scale[n] (dequantize_int with zero point 0, the same float products).
void run_f32s8_dequant_gemm(const LinearF32S8Problem& p) {
  const S8N16K4View& w = p.w;
  detail::linear_f32_dequant_gemm(p.x, p.m, w.k, w.n, p.bias, p.y, [&](float* out) {
    detail::for_each_weight_row(w.n, w.kp, [&](int64_t n) {
      // Row n's 4 bytes in each 64-byte block of its column block (packed_layout.h).
      const int8_t* q = w.data + (n / kS8BlockN) * w.kp * kS8BlockN + (n % kS8BlockN) * kS8BlockK;
      const float s = p.w_scale[n];
      float* row = out + n * w.k;
      int64_t k = 0;
      for (; k + kS8BlockK <= w.k; k += kS8BlockK, q += kS8BlockBytes) {
        for (int64_t i = 0; i < kS8BlockK; ++i) row[k + i] = static_cast<float>(q[i]) * s;
      }
      for (int64_t i = 0; k + i < w.k; ++i) row[k + i] = static_cast<float>(q[i]) * s;
    });
  });
}

// Byte offset of oct o within a column block of w's layout.
int64_t oct_offset(const S4N16K8View& w, int64_t o) {
  return w.layout == S4Layout::kN16B32 ? s4_oct_offset<S4Layout::kN16B32>(o) : s4_oct_offset<S4Layout::kN16K8>(o);
}

// Column n's fp16 scale (exact as float) and zero-point code z' of group g.
std::pair<float, float> group_meta(const S4N16K8View& w, int64_t n, int64_t g) {
  const int64_t nb = n / kS4BlockN, j = n % kS4BlockN;
  if (w.layout == S4Layout::kN16B32) {
    Fp16Bits bits;
    std::memcpy(&bits, w.data + s4_column_block_offset(w, nb) + s4_b32_scale_offset(g) + j * kS4ScaleBytes,
                sizeof(bits));
    return {fp16_bits_to_float(bits), static_cast<float>(kS4B32ZeroCode)};
  }
  const int64_t meta = (nb * w.groups + g) * kS4BlockN + j;
  return {fp16_bits_to_float(w.scales[meta]), static_cast<float>(w.zeros[meta])};
}

// W = (float(u) - float(z')) * scale[n, g]: (q - z) * s of dequantize_int, since u - z' = q - z
// and both differences are exact in float.
void run_f32s4_dequant_gemm(const LinearF32S4Problem& p) {
  const S4N16K8View& w = p.w;
  constexpr int64_t kHalf = kS4BlockK / 2;  // k values per nibble plane of a block
  detail::linear_f32_dequant_gemm(p.x, p.m, w.k, w.n, p.bias, p.y, [&](float* out) {
    detail::for_each_weight_row(w.n, w.kp, [&](int64_t n) {
      const int64_t nb = n / kS4BlockN, j = n % kS4BlockN;
      const uint8_t* col = w.data + s4_column_block_offset(w, nb) + j * kHalf;
      float* row = out + n * w.k;
      // float(u) first (branch-free over whole blocks), then each group's (u - z') * s in place.
      int64_t k = 0;
      for (; k + kS4BlockK <= w.k; k += kS4BlockK) {
        const uint8_t* q = col + oct_offset(w, k / kS4BlockK);
        for (int64_t i = 0; i < kHalf; ++i) {
          row[k + i] = static_cast<float>(q[i] & kS4NibbleMask);
          row[k + kHalf + i] = static_cast<float>(q[i] >> kS4NibbleBits);
        }
      }
      const uint8_t* q = col + oct_offset(w, k / kS4BlockK);
      for (int64_t i = 0; k + i < w.k; ++i) {
        row[k + i] = static_cast<float>(i < kHalf ? (q[i] & kS4NibbleMask) : (q[i - kHalf] >> kS4NibbleBits));
      }
      for (int64_t g = 0; g < w.groups; ++g) {
        const auto [s, z] = group_meta(w, n, g);
        for (k = g * w.group_size; k < std::min(w.k, (g + 1) * w.group_size); ++k) row[k] = (row[k] - z) * s;
      }
    });
  });
}

bool f32s4_groups_fit(const LinearF32S4Problem& p, std::string* why) {
  if (!detail::reads_layout(p, S4Layout::kN16K8, why)) return false;
  if (p.w.group_size % kS4BlockK == 0) return true;
  *why = "group_size=" + std::to_string(p.w.group_size) + " not a multiple of 8";
  return false;
}

}  // namespace

namespace detail {

void linear_f32_dequant_gemm(const float* x, int64_t M, int64_t K, int64_t N, const float* bias, float* y,
                             const std::function<void(float* w)>& fill_weight) {
  // Allocated per call: this path serves large M, where the GEMM dwarfs one allocation, and a
  // float copy of the weight is too large to keep per thread.
  at::Tensor w = at::empty({N, K}, at::kFloat);
  fill_weight(w.data_ptr<float>());
  const at::Tensor xt = at::from_blob(const_cast<float*>(x), {M, K}, at::kFloat);
  const at::Tensor b = bias != nullptr ? at::from_blob(const_cast<float*>(bias), {N}, at::kFloat) : at::Tensor();
  const at::Tensor out = at::linear(xt, w, b).contiguous();
  std::memcpy(y, out.data_ptr<float>(), static_cast<size_t>(M * N) * sizeof(float));
}

}  // namespace detail

const KernelTable<LinearF32S8Problem>& linear_f32s8_kernels() {
  static const KernelTable<LinearF32S8Problem> table{
      {"gemv_f32s8f32_n16k4_avx512", Isa::kAvx512, detail::serves_gemv<LinearF32S8Problem>, nullptr,
       QF_KERNEL_AVX512(kRunF32S8Avx512)},
      {"reference", Isa::kReference, detail::serves_gemv<LinearF32S8Problem>, nullptr, run_f32s8_reference},
      {kDequantGemmKernel, Isa::kReference, detail::serves_gemm<LinearF32S8Problem>, nullptr, run_f32s8_dequant_gemm},
  };
  return table;
}

const KernelTable<LinearF32S4Problem>& linear_f32s4_kernels() {
  static const KernelTable<LinearF32S4Problem> table{
      {"gemv_f32s4f32_n16b32_avx512", Isa::kAvx512, detail::serves_gemv_n16b32<LinearF32S4Problem>,
       detail::reads_n16b32<LinearF32S4Problem>,
       QF_KERNEL_AVX512(kRunF32S4B32Avx512)},
      {"gemv_f32s4f32_n16k8_avx512", Isa::kAvx512, detail::serves_gemv_n16k8<LinearF32S4Problem>, f32s4_groups_fit,
       QF_KERNEL_AVX512(kRunF32S4Avx512)},
      {"reference", Isa::kReference, detail::serves_gemv<LinearF32S4Problem>, nullptr, run_f32s4_reference},
      {kDequantGemmKernel, Isa::kReference, detail::serves_gemm<LinearF32S4Problem>, nullptr, run_f32s4_dequant_gemm},
  };
  return table;
}

void linear_f32s8f32(const float* x, int64_t M, const S8N16K4View& w, const float* w_scale,
                     const float* bias, float* y, RunInfo* info) {
  QF_REQUIRE(w.data != nullptr && w.n > 0 && w.k > 0 && w.kp == round_up(w.k, kS8BlockK),
             "kernels/cpu: linear_f32s8f32 got an empty or inconsistent packed weight (N=", w.n,
             " K=", w.k, " Kp=", w.kp, ")");
  QF_REQUIRE(M >= 0 && (M == 0 || (x != nullptr && y != nullptr && w_scale != nullptr)),
             "kernels/cpu: linear_f32s8f32 got M=", M, " or a null pointer");
  run_kernel_table(linear_f32s8_kernels(), LinearF32S8Problem{x, M, w, w_scale, bias, y}, M, info);
}

void linear_f32s4f32(const float* x, int64_t M, const S4N16K8View& w, const float* bias, float* y,
                     RunInfo* info) {
  QF_REQUIRE(w.data != nullptr && w.n > 0 && w.k > 0 && w.kp == round_up(w.k, kS4BlockK) &&
                 w.group_size > 0 && w.groups == num_groups(w.k, w.group_size),
             "kernels/cpu: linear_f32s4f32 got an empty or inconsistent packed weight (N=", w.n,
             " K=", w.k, " group_size=", w.group_size, ")");
  QF_REQUIRE(M >= 0 && (M == 0 || (x != nullptr && y != nullptr)),
             "kernels/cpu: linear_f32s4f32 got M=", M, " or a null pointer");
  run_kernel_table(linear_f32s4_kernels(), LinearF32S4Problem{x, M, w, bias, y}, M, info);
}

}  // namespace qforge::kernels
