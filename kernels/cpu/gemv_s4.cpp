// Kernel table and dispatcher of the small-M int8 x int4 kernels (ordered, ending at the reference).
#include "kernels/cpu/gemv_s4.h"

#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel_blocks.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/workspace.h"

namespace qforge::kernels {

namespace {

constexpr int kU4Max = 15;

std::string exact_str(float x) {
  std::ostringstream os;
  os << std::setprecision(std::numeric_limits<float>::max_digits10) << x;
  return os.str();
}

// `padded` (p.m rows of w.kp) with A's rows padded with 0, and `group_sum` their per-group sums.
detail::GemvS4Args s8s4_padded_args(const GemvS4Problem& p, int8_t* padded, int32_t* group_sum) {
  const S4N16K8View& w = p.w;
  const int64_t K = w.k, kp = w.kp, G = w.groups;
  detail::pad_rows(padded, p.a, p.m, K, kp);
  for (int64_t m = 0; m < p.m; ++m) {
    for (int64_t g = 0; g < G; ++g) {
      int32_t sum = 0;
      const int64_t k_end = std::min(K, (g + 1) * w.group_size);
      for (int64_t k = g * w.group_size; k < k_end; ++k) sum += p.a[m * K + k];
      group_sum[m * G + g] = sum;
    }
  }
  detail::GemvS4Args args;
  args.a = padded;
  args.m = p.m;
  args.lda = kp;
  args.a_group_sum = group_sum;
  args.a_scale = p.a_scale;
  args.w = w;
  args.bias = p.bias;
  args.y = p.y;
  args.ldy = w.n;
  return args;
}

// Pads A and sums its groups in per-thread scratch, then runs run_blocks(args, begin, end) over
// the 16-column blocks, split across the threads.
template <class RunBlocks>
void run_s8s4_blocks(const GemvS4Problem& p, const RunBlocks& run_blocks) {
  const detail::ScratchArray<int8_t> padded(detail::Scratch::kPaddedInput, p.m * p.w.kp);
  const detail::ScratchArray<int32_t> group_sum(detail::Scratch::kGroupSums, p.m * p.w.groups);
  const detail::GemvS4Args args = s8s4_padded_args(p, padded.data(), group_sum.data());
  const int64_t nblocks = round_up(p.w.n, kS4BlockN) / kS4BlockN;
  detail::parallel_over_blocks(nblocks, kS4BlockN * p.w.kp * p.m,
                               [&](int64_t b, int64_t e) { run_blocks(args, b, e); });
}

template <detail::GemvS4Fn kKernel>
[[maybe_unused]] void run_s8s4_fast(const GemvS4Problem& p) {
  run_s8s4_blocks(p, kKernel);
}

template <detail::GemmS4Fn kKernel>
[[maybe_unused]] void run_s8s4_panel(const GemvS4Problem& p) {
  const int64_t panel_bytes = detail::kS4PanelBlocks * p.w.kp * kS4BlockN;
  run_s8s4_blocks(p, [panel_bytes](const detail::GemvS4Args& args, int64_t b, int64_t e) {
    // 64-byte aligned, as the kernel's aligned loads need; one per worker thread.
    const detail::ScratchArray<uint8_t> panel(detail::Scratch::kPanel, panel_bytes);
    kKernel(args, b, e, panel.data());
  });
}

void run_s8s4_reference(const GemvS4Problem& p) {
  const S4Unpacked u = unpack_s4(p.w);
  gemm_s8s4f32_reference(p.a, p.a_scale, u.codes.data(), u.scale.data(), u.zero.data(), p.w.group_size, p.bias,
                         p.y, p.m, p.w.n, p.w.k);
}

bool s8s4_panel_serves(const GemvS4Problem& p) { return p.m >= kS4PanelMinM; }
bool s8s4_rows_serve(const GemvS4Problem& p) { return p.m < kS4PanelMinM; }

// The fast kernels read one group's scale per 8-value block.
bool s8s4_groups_fit(const GemvS4Problem& p, std::string* why) {
  if (p.w.layout == S4Layout::kN16B32) {
    *why = "n16b32 layout (its kernels take float or block-32 activations)";
    return false;
  }
  if (p.w.group_size % kS4BlockK == 0) return true;
  *why = "group_size=" + std::to_string(p.w.group_size) + " not a multiple of 8";
  return false;
}

#ifdef QFORGE_KERNELS_AVX512VNNI
constexpr auto kRunS8S4VnniPanel = run_s8s4_panel<detail::gemm_s8s4f32_n16k8_avx512vnni>;
constexpr auto kRunS8S4Vnni = run_s8s4_fast<detail::gemv_s8s4f32_n16k8_avx512vnni>;
#endif
#ifdef QFORGE_KERNELS_AVX2
constexpr auto kRunS8S4Avx2 = run_s8s4_fast<detail::gemv_s8s4f32_n16k8_avx2>;
#endif

}  // namespace

void pack_s4_group_meta(const float* w_scale, const int32_t* w_zero, int64_t N, int64_t G,
                        int qmin, Fp16Bits* scales, int8_t* zeros) {
  const int64_t np = round_up(N, kS4BlockN);
  for (int64_t n = 0; n < np; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t meta = ((n / kS4BlockN) * G + g) * kS4BlockN + n % kS4BlockN;
      if (n >= N) {
        scales[meta] = 0;
        zeros[meta] = 0;
        continue;
      }
      const int32_t code = (w_zero != nullptr ? w_zero[n * G + g] : 0) - qmin;
      QF_REQUIRE(code >= 0 && code <= kU4Max, "kernels/cpu: int4 zero point [", n, ", ", g, "] = ",
                 code + qmin, " outside the weight grid [", qmin, ", ", qmin + kU4Max, "]");
      const float s = w_scale[n * G + g];
      // Stored as fp16 (4.1875 instead of 4.25 bits per weight at group 128); only exact values,
      // so every kernel's result stays the one of the float scale the caller passed.
      QF_REQUIRE(fp16_bits_exact(s, &scales[meta]), "kernels/cpu: int4 group scale w_scale[", n,
                 ", ", g, "] = ", exact_str(s), " is not exactly representable as IEEE float16 "
                 "(nearest: ", exact_str(fp16_bits_to_float(scales[meta])), "); PackedLinearS4 "
                 "stores group scales as fp16, round them to float16 before quantizing");
      zeros[meta] = static_cast<int8_t>(code);
    }
  }
}

S4Unpacked unpack_s4(const S4N16K8View& w) {
  S4Unpacked u;
  u.codes.resize(static_cast<size_t>(w.n * w.k));
  u.scale.resize(static_cast<size_t>(w.n * w.groups));
  u.zero.resize(static_cast<size_t>(w.n * w.groups));
  if (w.layout == S4Layout::kN16B32) {
    const int64_t np = round_up(w.n, kS4BlockN);
    std::vector<uint8_t> codes(static_cast<size_t>(np * w.kp / 2));
    std::vector<Fp16Bits> scales(static_cast<size_t>(np * w.groups));
    const std::vector<int8_t> zeros(scales.size(), kS4B32ZeroCode);
    unpack_s4_n16b32_reference(w.data, w.n, w.k, codes.data(), scales.data());
    unpack_s4_n16k8_reference(codes.data(), w.n, w.k, 0, u.codes.data());
    unpack_s4_group_meta(scales.data(), zeros.data(), w.n, w.groups, u.scale.data(), u.zero.data());
    return u;
  }
  unpack_s4_n16k8_reference(w.data, w.n, w.k, 0, u.codes.data());
  unpack_s4_group_meta(w.scales, w.zeros, w.n, w.groups, u.scale.data(), u.zero.data());
  return u;
}

bool fp16_bits_exact(float x, Fp16Bits* bits) {
  const c10::Half h(x);
  *bits = h.x;
  return std::isfinite(x) && static_cast<float>(h) == x;
}

float fp16_bits_to_float(Fp16Bits bits) {
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

void unpack_s4_group_meta(const Fp16Bits* scales, const int8_t* zeros, int64_t N, int64_t G,
                          float* w_scale, int32_t* zero_codes) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t meta = ((n / kS4BlockN) * G + g) * kS4BlockN + n % kS4BlockN;
      w_scale[n * G + g] = fp16_bits_to_float(scales[meta]);
      zero_codes[n * G + g] = zeros[meta];
    }
  }
}

const KernelTable<GemvS4Problem>& gemv_s4_kernels() {
  static const KernelTable<GemvS4Problem> table{
      {"gemm_s8s4f32_n16k8_avx512vnni", Isa::kAvx512Vnni, s8s4_panel_serves, s8s4_groups_fit,
       QF_KERNEL_AVX512VNNI(kRunS8S4VnniPanel)},
      {"gemv_s8s4f32_n16k8_avx512vnni", Isa::kAvx512Vnni, s8s4_rows_serve, s8s4_groups_fit, QF_KERNEL_AVX512VNNI(kRunS8S4Vnni)},
      {"gemv_s8s4f32_n16k8_avx2", Isa::kAvx2, nullptr, s8s4_groups_fit, QF_KERNEL_AVX2(kRunS8S4Avx2)},
      {"reference", Isa::kReference, nullptr, nullptr, run_s8s4_reference},
  };
  return table;
}

void gemv_s8s4f32(const int8_t* A, int64_t M, const float* a_scale, const S4N16K8View& w,
                  const float* bias, float* y, RunInfo* info) {
  QF_REQUIRE(w.data != nullptr && w.scales != nullptr && w.zeros != nullptr,
             "kernels/cpu: gemv_s8s4f32 got an empty packed weight");
  QF_REQUIRE(w.n > 0 && w.k > 0 && w.kp == round_up(w.k, kS4BlockK) && w.group_size > 0 &&
                 w.groups == num_groups(w.k, w.group_size),
             "kernels/cpu: gemv_s8s4f32 packed weight has N=", w.n, " K=", w.k, " Kp=", w.kp,
             " group_size=", w.group_size, " groups=", w.groups);
  QF_REQUIRE(M >= 0, "kernels/cpu: gemv_s8s4f32 got M=", M);
  QF_REQUIRE(M == 0 || (A != nullptr && a_scale != nullptr && y != nullptr),
             "kernels/cpu: gemv_s8s4f32 got a null pointer");
  GemvS4Problem p;
  p.a = A;
  p.m = M;
  p.a_scale = a_scale;
  p.w = w;
  p.bias = bias;
  p.y = y;
  run_kernel_table(gemv_s4_kernels(), p, M, info);
}

}  // namespace qforge::kernels
