// Kernel tables and dispatchers of the decode linears (block-32 int8 activations).
#include "kernels/cpu/linear_decode.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/gemm_q8_kernels.h"
#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/gemv_s4.h"
#include "kernels/cpu/linear_weight_only.h"
#include "kernels/cpu/parallel_blocks.h"
#include "kernels/cpu/quantize_rows_s8.h"
#include "kernels/cpu/reference.h"

namespace qforge::kernels {

namespace {

thread_local int64_t t_q8_reuses = 0;

// Floats per task when a prompt-sized call's rows are quantized across threads.
constexpr int64_t kQuantizeFloatsPerTask = int64_t{1} << 16;

// Rows of prompt-sized calls split across threads (each row's codes depend on that row alone); a
// non-finite row makes a chunk throw, and the whole call then runs here again so the error names
// the row within the call.
void quantize_q8_rows(const float* x, int64_t m, int64_t k, int64_t kb, int8_t* q, float* d, int32_t* s) {
  const int64_t ldq = kb * kQ8Block;
  if (m <= kWeightOnlyMaxM) return quantize_rows_q8b32(x, m, k, q, ldq, d, s);
  std::atomic<bool> failed{false};
  detail::parallel_over(m, std::max<int64_t>(1, kQuantizeFloatsPerTask / k), [&](int64_t b, int64_t e) {
    try {
      quantize_rows_q8b32(x + b * k, e - b, k, q + b * ldq, ldq, d + b * kb, s + b * kb);
    } catch (const Error&) {
      failed = true;
    }
  });
  if (failed) quantize_rows_q8b32(x, m, k, q, ldq, d, s);
}

}  // namespace

namespace detail {

const Q8Rows& q8_rows(const float* x, int64_t m, int64_t k) {
  thread_local Q8Rows last;
  const size_t n = static_cast<size_t>(m * k);
  if (last.m == m && last.k == k && std::memcmp(last.x.data(), x, n * sizeof(float)) == 0) {
    ++t_q8_reuses;
    return last;
  }
  last.m = -1;  // no match until the quantization below succeeds (it throws on non-finite rows)
  last.kb = q8_block_count(k);
  last.q.resize(static_cast<size_t>(m * last.kb * kQ8Block));
  last.d.resize(static_cast<size_t>(m * last.kb));
  last.s.resize(static_cast<size_t>(m * last.kb));
  quantize_q8_rows(x, m, k, last.kb, last.q.data(), last.d.data(), last.s.data());
  last.x.assign(x, x + n);
  last.m = m, last.k = k;
  return last;
}

}  // namespace detail

namespace {

using detail::q8_rows;
using detail::Q8Rows;

using detail::q8_args;

// The GEMV entries: quantize x once, then one ISA kernel over 16-column blocks split across threads.
template <void (*kKernel)(const detail::GemvQ8S8Args&, int64_t, int64_t)>
[[maybe_unused]] void run_q8s8(const LinearQ8S8Problem& p) {
  const Q8Rows& rows = q8_rows(p.x, p.m, p.w.k);
  auto args = q8_args<detail::GemvQ8S8Args>(rows, p.m, p.y, p.w.n, p.bias);
  args.w = p.w, args.w_scale = p.w_scale;
  detail::parallel_over_blocks(round_up(p.w.n, kS8BlockN) / kS8BlockN, kS8BlockN * p.w.kp * p.m,
                               [&](int64_t b, int64_t e) { kKernel(args, b, e); });
}
template <void (*kKernel)(const detail::GemvQ8S4Args&, int64_t, int64_t)>
[[maybe_unused]] void run_q8s4(const LinearQ8S4Problem& p) {
  const Q8Rows& rows = q8_rows(p.x, p.m, p.w.k);
  auto args = q8_args<detail::GemvQ8S4Args>(rows, p.m, p.y, p.w.n, p.bias);
  args.w = p.w;
  detail::parallel_over_blocks(round_up(p.w.n, kS4BlockN) / kS4BlockN, kS4BlockN * p.w.kp * p.m,
                               [&](int64_t b, int64_t e) { kKernel(args, b, e); });
}

void run_q8s8_reference(const LinearQ8S8Problem& p) {
  const Q8Rows& rows = q8_rows(p.x, p.m, p.w.k);
  std::vector<int8_t> W(static_cast<size_t>(p.w.n * p.w.k));
  unpack_s8_n16k4_reference(p.w.data, p.w.n, p.w.k, W.data());
  linear_q8b32_s8_reference(rows.q.data(), rows.d.data(), rows.kb * kQ8Block, W.data(), p.w_scale, p.bias, p.y, p.m,
                            p.w.n, p.w.k);
}

void run_q8s4_reference(const LinearQ8S4Problem& p) {
  const Q8Rows& rows = q8_rows(p.x, p.m, p.w.k);
  const S4Unpacked u = unpack_s4(p.w);
  linear_q8b32_s4_reference(rows.q.data(), rows.d.data(), rows.kb * kQ8Block, u.codes.data(), u.scale.data(),
                            u.zero.data(), p.w.group_size, p.bias, p.y, p.m, p.w.n, p.w.k);
}

// The exact weight-only linears: above kWeightOnlyMaxM rows, and int4 groups the blocks cannot split.
void run_exact_s8(const LinearQ8S8Problem& p) { linear_f32s8f32(p.x, p.m, p.w, p.w_scale, p.bias, p.y); }
void run_exact_s4(const LinearQ8S4Problem& p) { linear_f32s4f32(p.x, p.m, p.w, p.bias, p.y); }

bool q8s4_groups_fit(const LinearQ8S4Problem& p, std::string* why) {
  if (p.w.groups == 1 || p.w.group_size % kQ8Block == 0) return true;
  *why = "group_size=" + std::to_string(p.w.group_size) + " not a multiple of 32";
  return false;
}
bool q8s4_n16k8_groups_fit(const LinearQ8S4Problem& p, std::string* why) {
  return detail::reads_layout(p, S4Layout::kN16K8, why) && q8s4_groups_fit(p, why);
}

}  // namespace

int64_t q8_activation_reuses() { return t_q8_reuses; }

const KernelTable<LinearQ8S8Problem>& linear_q8s8_kernels() {
  static const KernelTable<LinearQ8S8Problem> table{
      {"gemv_q8s8f32_n16k4_avx512vnni", Isa::kAvx512Vnni, detail::serves_gemv<LinearQ8S8Problem>, nullptr,
       QF_KERNEL_AVX512VNNI(run_q8s8<detail::gemv_q8s8f32_n16k4_avx512vnni>)},
      {"gemv_q8s8f32_n16k4_avx2", Isa::kAvx2, detail::serves_gemv<LinearQ8S8Problem>, nullptr,
       QF_KERNEL_AVX2(run_q8s8<detail::gemv_q8s8f32_n16k4_avx2>)},
      {"reference", Isa::kReference, detail::serves_gemv<LinearQ8S8Problem>, nullptr, run_q8s8_reference},
      {"gemm_q8s8f32_n16k4_avx512vnni", Isa::kAvx512Vnni, detail::serves_gemm<LinearQ8S8Problem>, nullptr,
       QF_KERNEL_AVX512VNNI(run_q8s8<detail::gemm_q8s8f32_n16k4_avx512vnni>)},
      {kDequantGemmKernel, Isa::kReference, detail::serves_gemm<LinearQ8S8Problem>, nullptr, run_exact_s8},
  };
  return table;
}

const KernelTable<LinearQ8S4Problem>& linear_q8s4_kernels() {
  static const KernelTable<LinearQ8S4Problem> table{
      {"gemv_q8s4f32_n16b32_avx512vnni", Isa::kAvx512Vnni, detail::serves_gemv_n16b32<LinearQ8S4Problem>,
       detail::reads_n16b32<LinearQ8S4Problem>,
       QF_KERNEL_AVX512VNNI(run_q8s4<detail::gemv_q8s4f32_n16b32_avx512vnni>)},
      {"gemv_q8s4f32_n16k8_avx512vnni", Isa::kAvx512Vnni, detail::serves_gemv_n16k8<LinearQ8S4Problem>,
       q8s4_n16k8_groups_fit,
       QF_KERNEL_AVX512VNNI(run_q8s4<detail::gemv_q8s4f32_n16k8_avx512vnni>)},
      {"gemv_q8s4f32_n16b32_avx2", Isa::kAvx2, detail::serves_gemv_n16b32<LinearQ8S4Problem>,
       detail::reads_n16b32<LinearQ8S4Problem>,
       QF_KERNEL_AVX2(run_q8s4<detail::gemv_q8s4f32_n16b32_avx2>)},
      {"gemv_q8s4f32_n16k8_avx2", Isa::kAvx2, detail::serves_gemv_n16k8<LinearQ8S4Problem>,
       q8s4_n16k8_groups_fit,
       QF_KERNEL_AVX2(run_q8s4<detail::gemv_q8s4f32_n16k8_avx2>)},
      {"reference", Isa::kReference, detail::serves_gemv<LinearQ8S4Problem>, q8s4_groups_fit, run_q8s4_reference},
      {kExactS4GemvKernel, Isa::kReference, detail::serves_gemv<LinearQ8S4Problem>, nullptr, run_exact_s4},
      {"gemm_q8s4f32_n16b32_avx512vnni", Isa::kAvx512Vnni, detail::serves_gemm_n16b32<LinearQ8S4Problem>,
       detail::reads_n16b32<LinearQ8S4Problem>,
       QF_KERNEL_AVX512VNNI(run_q8s4<detail::gemm_q8s4f32_n16b32_avx512vnni>)},
      {"gemm_q8s4f32_n16k8_avx512vnni", Isa::kAvx512Vnni, detail::serves_gemm_n16k8<LinearQ8S4Problem>,
       q8s4_n16k8_groups_fit,
       QF_KERNEL_AVX512VNNI(run_q8s4<detail::gemm_q8s4f32_n16k8_avx512vnni>)},
      {kDequantGemmKernel, Isa::kReference, detail::serves_gemm<LinearQ8S4Problem>, nullptr, run_exact_s4},
  };
  return table;
}

void linear_q8b32s8f32(const float* x, int64_t M, const S8N16K4View& w, const float* w_scale, const float* bias,
                       float* y, RunInfo* info) {
  QF_REQUIRE(w.data != nullptr && w.n > 0 && w.k > 0 && w.kp == round_up(w.k, kS8BlockK),
             "kernels/cpu: linear_q8b32s8f32 got an empty or inconsistent packed weight (N=", w.n, " K=", w.k,
             " Kp=", w.kp, ")");
  QF_REQUIRE(M >= 0 && (M == 0 || (x != nullptr && y != nullptr && w_scale != nullptr)),
             "kernels/cpu: linear_q8b32s8f32 got M=", M, " or a null pointer");
  run_kernel_table(linear_q8s8_kernels(), LinearQ8S8Problem{x, M, w, w_scale, bias, y}, M, info);
}

void linear_q8b32s4f32(const float* x, int64_t M, const S4N16K8View& w, const float* bias, float* y, RunInfo* info) {
  QF_REQUIRE(w.data != nullptr && w.n > 0 && w.k > 0 && w.kp == round_up(w.k, kS4BlockK) && w.group_size > 0 &&
                 w.groups == num_groups(w.k, w.group_size),
             "kernels/cpu: linear_q8b32s4f32 got an empty or inconsistent packed weight (N=", w.n, " K=", w.k,
             " group_size=", w.group_size, ")");
  QF_REQUIRE(M >= 0 && (M == 0 || (x != nullptr && y != nullptr)), "kernels/cpu: linear_q8b32s4f32 got M=", M,
             " or a null pointer");
  run_kernel_table(linear_q8s4_kernels(), LinearQ8S4Problem{x, M, w, bias, y}, M, info);
}

}  // namespace qforge::kernels
