// Kernel table and dispatcher of the small-M int8 GEMM kernels (ordered, ending at the reference).
#include "kernels/cpu/gemv_s8.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/dequantize_s32_f32.h"
#include "kernels/cpu/gemm_s8s8s32_onednn.h"
#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel_blocks.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/workspace.h"

namespace qforge::kernels {

namespace {

constexpr int32_t kS8ToU8Offset = 128;  // a + 128 maps [-128, 127] onto u8 for VPDPBUSD

void check_view(const S8N16K4View& w, int64_t M, const void* A, const void* out) {
  QF_REQUIRE(w.data != nullptr && w.colsum != nullptr, "kernels/cpu: gemv_s8 got an empty packed weight");
  QF_REQUIRE(w.n > 0 && w.k > 0 && w.kp == round_up(w.k, kS8BlockK),
             "kernels/cpu: gemv_s8 packed weight has N=", w.n, " K=", w.k, " Kp=", w.kp,
             " (expected Kp = round_up(K, 4))");
  QF_REQUIRE(M >= 0, "kernels/cpu: gemv_s8 got M=", M);
  QF_REQUIRE(M == 0 || (A != nullptr && out != nullptr), "kernels/cpu: gemv_s8 got a null pointer");
}

// Copies A into `padded` (p.m rows of w.kp) with rows padded with 0 (kernels read whole 4-byte k
// groups), as u8 (+128, or as given) for VPDPBUSD or as s8.
detail::GemvS8Args s8s8_padded_args(const GemvS8Problem& p, bool wants_u8, uint8_t* padded) {
  const S8N16K4View& w = p.w;
  const int64_t K = w.k, kp = w.kp;
  // Sources and K as locals: read through the captured problem, every byte store could alias
  // them and the +128 loop would not vectorise (measured 2.5x slower at M = 128).
  const uint8_t* const a_u8 = p.a_u8;
  const int8_t* const a_s8 = p.a_s8;
  detail::pad_rows(padded, p.m, K, kp, [a_u8, a_s8, K, wants_u8](int64_t m, uint8_t* __restrict dst) {
    if (a_u8 != nullptr) {
      std::memcpy(dst, a_u8 + m * K, static_cast<size_t>(K));
    } else if (wants_u8) {
      const int8_t* __restrict src = a_s8 + m * K;
      for (int64_t k = 0; k < K; ++k) dst[k] = static_cast<uint8_t>(src[k] + kS8ToU8Offset);
    } else {
      std::memcpy(dst, a_s8 + m * K, static_cast<size_t>(K));
    }
  });
  detail::GemvS8Args args;
  if (wants_u8) {
    args.a_u8 = padded;
    args.a_zero_point = p.a_u8 != nullptr ? p.a_zero_point : kS8ToU8Offset;
  } else {
    args.a_s8 = reinterpret_cast<const int8_t*>(padded);
  }
  args.m = p.m;
  args.lda = kp;
  args.w = w;
  args.c = p.c;
  args.ldc = w.n;
  args.y = p.y;
  args.ldy = w.n;
  args.a_scale = p.a_scale;
  args.w_scale = p.w_scale;
  args.bias = p.bias;
  return args;
}

template <detail::GemvS8Fn kKernel, bool kWantsU8>
[[maybe_unused]] void run_s8s8_fast(const GemvS8Problem& p) {
  const detail::ScratchArray<uint8_t> padded(detail::Scratch::kPaddedInput, p.m * p.w.kp);
  const detail::GemvS8Args args = s8s8_padded_args(p, kWantsU8, padded.data());
  const int64_t nblocks = round_up(p.w.n, kS8BlockN) / kS8BlockN;
  detail::parallel_over_blocks(nblocks, kS8BlockN * p.w.kp * std::max<int64_t>(1, p.m),
                               [&](int64_t b, int64_t e) { kKernel(args, b, e); });
}

void run_s8s8_reference(const GemvS8Problem& p) {
  const S8N16K4View& w = p.w;
  std::vector<int8_t> W(static_cast<size_t>(w.n * w.k));
  unpack_s8_n16k4_reference(w.data, w.n, w.k, W.data());
  std::vector<int32_t> acc;
  int32_t* c = p.c;
  if (c == nullptr) {
    acc.resize(static_cast<size_t>(p.m * w.n));
    c = acc.data();
  }
  if (p.a_u8 != nullptr) {
    gemm_u8s8s32_reference(p.a_u8, p.a_zero_point, W.data(), c, p.m, w.n, w.k);
  } else {
    gemm_s8s8s32_reference(p.a_s8, W.data(), c, p.m, w.n, w.k);
  }
  if (p.y != nullptr) dequantize_s32_f32_reference(c, p.a_scale, p.w_scale, p.bias, p.y, p.m, w.n);
}

// VPMADDUBSW multiplies u8 x s8 with a sign trick that needs A in [-127, 127] and no zero point.
bool s8s8_avx2_applies(const GemvS8Problem& p, std::string* why) {
  if (p.a_u8 != nullptr) {
    *why = "u8 activations with a zero point need VPDPBUSD";
    return false;
  }
  if (p.a_s8 != nullptr && std::find(p.a_s8, p.a_s8 + p.m * p.w.k, int8_t{-128}) != p.a_s8 + p.m * p.w.k) {
    *why = "A contains -128 (the VPMADDUBSW sign trick needs [-127, 127])";
    return false;
  }
  return true;
}

bool onednn_serves(const GemvS8Problem& p) { return p.onednn_min_m > 0 && p.m >= p.onednn_min_m; }

// The copy first, so a layer packed without one says so whatever the ISA. oneDNN's pre-VNNI int8
// path uses VPMADDUBSW and may saturate: not exact, so not used. (Plans set no copy, so the machine
// check here never answers for a planned level.)
bool onednn_applies(const GemvS8Problem& p, std::string* why) {
  if (p.onednn == nullptr) {
    *why = p.onednn_status != nullptr ? *p.onednn_status : "no oneDNN copy of the weight";
    return false;
  }
  return isa_usable(Isa::kAvx512Vnni, why);
}

void run_onednn(const GemvS8Problem& p) {
  const detail::ScratchArray<int32_t> acc(detail::Scratch::kAccumulators, p.c == nullptr ? p.m * p.w.n : 0);
  int32_t* c = p.c != nullptr ? p.c : acc.data();
  detail::onednn_gemm_s8s8s32(*p.onednn, p.a_s8, p.m, c);
  if (p.y != nullptr) dequantize_s32_f32(c, p.a_scale, p.w_scale, p.bias, p.y, p.m, p.w.n);
}

#ifdef QFORGE_KERNELS_AVX512VNNI
constexpr auto kRunS8S8Vnni = run_s8s8_fast<detail::gemv_u8s8s32_n16k4_avx512vnni, true>;
#endif
#ifdef QFORGE_KERNELS_AVX2
constexpr auto kRunS8S8Avx2 = run_s8s8_fast<detail::gemv_s8s8s32_n16k4_avx2, false>;
#endif

}  // namespace

const KernelTable<GemvS8Problem>& gemv_s8_kernels() {
  static const KernelTable<GemvS8Problem> table{
      // ISA checked in onednn_applies, after the copy (see there).
      {"gemm_s8s8s32_onednn", Isa::kReference, onednn_serves, onednn_applies, run_onednn},
      {"gemv_u8s8s32_n16k4_avx512vnni", Isa::kAvx512Vnni, nullptr, nullptr, QF_KERNEL_AVX512VNNI(kRunS8S8Vnni)},
      {"gemv_s8s8s32_n16k4_avx2", Isa::kAvx2, nullptr, s8s8_avx2_applies, QF_KERNEL_AVX2(kRunS8S8Avx2)},
      {"reference", Isa::kReference, nullptr, nullptr, run_s8s8_reference},
  };
  return table;
}

GemvS8Problem s8s8f32_problem(const int8_t* A, int64_t M, const float* a_scale, const S8N16K4View& w,
                              const float* w_scale, const float* bias, float* y) {
  GemvS8Problem p;
  p.a_s8 = A;
  p.m = M;
  p.w = w;
  p.y = y;
  p.a_scale = a_scale;
  p.w_scale = w_scale;
  p.bias = bias;
  return p;
}

void gemv_s8s8s32(const int8_t* A, int64_t M, const S8N16K4View& w, int32_t* C, RunInfo* info) {
  check_view(w, M, A, C);
  GemvS8Problem p;
  p.a_s8 = A;
  p.m = M;
  p.w = w;
  p.c = C;
  run_kernel_table(gemv_s8_kernels(), p, M, info);
}

void gemv_u8s8s32(const uint8_t* A, int32_t a_zero_point, int64_t M, const S8N16K4View& w,
                  int32_t* C, RunInfo* info) {
  check_view(w, M, A, C);
  GemvS8Problem p;
  p.a_u8 = A;
  p.a_zero_point = a_zero_point;
  p.m = M;
  p.w = w;
  p.c = C;
  run_kernel_table(gemv_s8_kernels(), p, M, info);
}

void gemv_s8s8f32(const int8_t* A, int64_t M, const float* a_scale, const S8N16K4View& w,
                  const float* w_scale, const float* bias, float* y, RunInfo* info) {
  check_view(w, M, A, y);
  QF_REQUIRE(M == 0 || (a_scale != nullptr && w_scale != nullptr),
             "kernels/cpu: gemv_s8s8f32 needs a_scale and w_scale");
  run_kernel_table(gemv_s8_kernels(), s8s8f32_problem(A, M, a_scale, w, w_scale, bias, y), M, info);
}

void bmm_s8s8f32(const int8_t* A, const int8_t* Bt, int64_t batch, int64_t M, int64_t N, int64_t K,
                 const float* a_scale, int64_t a_scale_stride, const float* b_scale, int64_t b_scale_stride,
                 float* y, RunInfo* info) {
  QF_REQUIRE(batch >= 0 && M >= 0 && N >= 0 && K >= 0, "kernels/cpu: bmm_s8s8f32 got batch=", batch, " M=", M,
             " N=", N, " K=", K);
  QF_REQUIRE(K <= (int64_t{1} << 31) / (128 * 128), "kernels/cpu: bmm_s8s8f32: K=", K,
             " could overflow the int32 accumulator");
  QF_REQUIRE(a_scale_stride >= 0 && b_scale_stride >= 0, "kernels/cpu: bmm_s8s8f32 got a negative scale stride");
  if (batch == 0 || M == 0 || N == 0) {
    if (info != nullptr) *info = RunInfo{};
    return;
  }
  if (K == 0) {
    // Empty sums: fmaf(0 * b_scale, a_scale, 0) is 0 for the finite scales the quantizers give.
    std::fill(y, y + batch * M * N, 0.0f);
    if (info != nullptr) *info = RunInfo{"none (K = 0)", ""};
    return;
  }
  QF_REQUIRE(A != nullptr && Bt != nullptr && y != nullptr && a_scale != nullptr && b_scale != nullptr,
             "kernels/cpu: bmm_s8s8f32 got a null pointer");
  const int64_t np = round_up(N, kS8BlockN), kp = round_up(K, kS8BlockK);
  // Bt is packed slice by slice into the running thread's scratch (each thread packs its own).
  auto slice = [&](int64_t b, RunInfo* ri) {
    const detail::ScratchArray<int8_t> packed(detail::Scratch::kPackedOperand, np * kp);
    const detail::ScratchArray<int32_t> colsum(detail::Scratch::kPackedColumnSums, np);
    pack_s8_n16k4_reference(Bt + b * N * K, N, K, packed.data(), colsum.data());
    S8N16K4View w;
    w.data = packed.data();
    w.colsum = colsum.data();
    w.n = N;
    w.k = K;
    w.kp = kp;
    gemv_s8s8f32(A + b * M * K, M, a_scale + b * a_scale_stride, w, b_scale + b * b_scale_stride, nullptr,
                 y + b * M * N, ri);
  };
  auto slices = [&](int64_t begin, int64_t end) {
    RunInfo local;
    for (int64_t b = begin; b < end; ++b) slice(b, b == 0 ? info : &local);
  };
  if (batch >= parallel_threads() && batch > 1) {
    detail::parallel_over(batch, 1, slices);
  } else {
    slices(0, batch);  // each slice splits its columns over the threads instead
  }
}

}  // namespace qforge::kernels
