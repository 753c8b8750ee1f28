// Dispatcher of the small-M int8 x int4 kernels (ordered list ending at the reference).
#include "kernels/cpu/gemv_s4.h"

#include <ATen/ATen.h>

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

namespace qforge::kernels {

namespace {

constexpr int kU4Max = 15;
// From this M on, unpacking each weight panel once (gemm_*) beats unpacking per row tile.
constexpr int64_t kS4PanelMinM = 4;

// float -> fp16 bits when x converts exactly (finite, float(half(x)) == x), else false.
bool fp16_bits_exact(float x, Fp16Bits* bits) {
  const c10::Half h(x);
  *bits = h.x;
  return std::isfinite(x) && static_cast<float>(h) == x;
}

float fp16_bits_to_float(Fp16Bits bits) {
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

std::string exact_str(float x) {
  std::ostringstream os;
  os << std::setprecision(std::numeric_limits<float>::max_digits10) << x;
  return os.str();
}

void run_panel(detail::GemmS4Fn fn, const detail::GemvS4Args& args) {
  const int64_t nblocks = round_up(args.w.n, kS4BlockN) / kS4BlockN;
  const int64_t panel_bytes = detail::kS4PanelBlocks * args.w.kp * kS4BlockN;
  detail::parallel_over_blocks(nblocks, kS4BlockN * args.w.kp * args.m, [&](int64_t b, int64_t e) {
    // c10's CPU allocator aligns to 64 bytes, as the kernel's aligned loads need.
    at::Tensor panel = at::empty({panel_bytes}, at::kByte);
    fn(args, b, e, panel.data_ptr<uint8_t>());
  });
}

// Exactly one of fn / panel_fn is set.
[[maybe_unused]] void run_fast(detail::GemvS4Fn fn, detail::GemmS4Fn panel_fn, const int8_t* A,
                               int64_t M, const float* a_scale, const S4N16K8View& w,
                               const float* bias, float* y) {
  const int64_t K = w.k, kp = w.kp, G = w.groups;
  std::vector<int8_t> padded(static_cast<size_t>(M * kp), 0);
  std::vector<int32_t> group_sum(static_cast<size_t>(M * G), 0);
  for (int64_t m = 0; m < M; ++m) {
    std::memcpy(padded.data() + m * kp, A + m * K, static_cast<size_t>(K));
    for (int64_t g = 0; g < G; ++g) {
      int32_t sum = 0;
      const int64_t k_end = std::min(K, (g + 1) * w.group_size);
      for (int64_t k = g * w.group_size; k < k_end; ++k) sum += A[m * K + k];
      group_sum[m * G + g] = sum;
    }
  }
  detail::GemvS4Args args;
  args.a = padded.data();
  args.m = M;
  args.lda = kp;
  args.a_group_sum = group_sum.data();
  args.a_scale = a_scale;
  args.w = w;
  args.bias = bias;
  args.y = y;
  args.ldy = w.n;
  if (panel_fn != nullptr) {
    run_panel(panel_fn, args);
    return;
  }
  const int64_t nblocks = round_up(w.n, kS4BlockN) / kS4BlockN;
  detail::parallel_over_blocks(nblocks, kS4BlockN * kp * M,
                               [&](int64_t b, int64_t e) { fn(args, b, e); });
}

void run_reference(const int8_t* A, int64_t M, const float* a_scale, const S4N16K8View& w,
                   const float* bias, float* y) {
  const int64_t N = w.n, G = w.groups;
  std::vector<int8_t> codes(static_cast<size_t>(N * w.k));
  unpack_s4_n16k8_reference(w.data, N, w.k, 0, codes.data());
  std::vector<float> scale(static_cast<size_t>(N * G));
  std::vector<int32_t> zero(static_cast<size_t>(N * G));
  unpack_s4_group_meta(w.scales, w.zeros, N, G, scale.data(), zero.data());
  gemm_s8s4f32_reference(A, a_scale, codes.data(), scale.data(), zero.data(), w.group_size, bias,
                         y, M, N, w.k);
}

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
  RunInfo local;
  RunInfo& ri = info != nullptr ? *info : local;
  ri = RunInfo{};
  const bool groups_fit = w.group_size % kS4BlockK == 0;
  const std::string group_reason =
      "group_size=" + std::to_string(w.group_size) + " not a multiple of 8";
  std::string why;

  constexpr const char* kVnniPanel = "gemm_s8s4f32_n16k8_avx512vnni";
  constexpr const char* kVnni = "gemv_s8s4f32_n16k8_avx512vnni";
  if (!isa_usable(Isa::kAvx512Vnni, &why)) {
    ri.skip(M >= kS4PanelMinM ? kVnniPanel : kVnni, why);
  } else if (!groups_fit) {
    ri.skip(M >= kS4PanelMinM ? kVnniPanel : kVnni, group_reason);
  } else {
#ifdef QFORGE_KERNELS_AVX512VNNI
    if (M >= kS4PanelMinM) {
      ri.kernel = kVnniPanel;
      run_fast(nullptr, detail::gemm_s8s4f32_n16k8_avx512vnni, A, M, a_scale, w, bias, y);
    } else {
      ri.kernel = kVnni;
      if (M > 0) run_fast(detail::gemv_s8s4f32_n16k8_avx512vnni, nullptr, A, M, a_scale, w, bias, y);
    }
    return;
#endif
  }

  constexpr const char* kAvx2 = "gemv_s8s4f32_n16k8_avx2";
  if (!isa_usable(Isa::kAvx2, &why)) {
    ri.skip(kAvx2, why);
  } else if (!groups_fit) {
    ri.skip(kAvx2, group_reason);
  } else {
#ifdef QFORGE_KERNELS_AVX2
    ri.kernel = kAvx2;
    if (M > 0) run_fast(detail::gemv_s8s4f32_n16k8_avx2, nullptr, A, M, a_scale, w, bias, y);
    return;
#endif
  }

  ri.kernel = "reference";
  if (M > 0) run_reference(A, M, a_scale, w, bias, y);
}

}  // namespace qforge::kernels
