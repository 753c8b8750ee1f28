// Dispatcher of the small-M int8 GEMM kernels (ordered list ending at the reference).
#include "kernels/cpu/gemv_s8.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/gemv_kernels.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel_blocks.h"
#include "kernels/cpu/reference.h"

namespace qforge::kernels {

namespace {

constexpr int32_t kS8ToU8Offset = 128;  // a + 128 maps [-128, 127] onto u8 for VPDPBUSD

struct Problem {
  const int8_t* a_s8 = nullptr;
  const uint8_t* a_u8 = nullptr;
  int32_t a_zero_point = 0;
  int64_t m = 0;
  const S8N16K4View* w = nullptr;
  int32_t* c = nullptr;
  float* y = nullptr;
  const float* a_scale = nullptr;
  const float* w_scale = nullptr;
  const float* bias = nullptr;
};

void check_view(const S8N16K4View& w, int64_t M, const void* A, const void* out) {
  QF_REQUIRE(w.data != nullptr && w.colsum != nullptr, "kernels/cpu: gemv_s8 got an empty packed weight");
  QF_REQUIRE(w.n > 0 && w.k > 0 && w.kp == round_up(w.k, kS8BlockK),
             "kernels/cpu: gemv_s8 packed weight has N=", w.n, " K=", w.k, " Kp=", w.kp,
             " (expected Kp = round_up(K, 4))");
  QF_REQUIRE(M >= 0, "kernels/cpu: gemv_s8 got M=", M);
  QF_REQUIRE(M == 0 || (A != nullptr && out != nullptr), "kernels/cpu: gemv_s8 got a null pointer");
}

[[maybe_unused]] void run_fast(detail::GemvS8Fn fn, const Problem& p, bool wants_u8) {
  const S8N16K4View& w = *p.w;
  const int64_t K = w.k, kp = w.kp;
  // Padded copy of A (kp columns): kernels read whole 4-byte k groups.
  std::vector<uint8_t> padded(static_cast<size_t>(p.m * kp), 0);
  detail::GemvS8Args args;
  for (int64_t m = 0; m < p.m; ++m) {
    uint8_t* dst = padded.data() + m * kp;
    if (p.a_u8 != nullptr) {
      std::copy(p.a_u8 + m * K, p.a_u8 + (m + 1) * K, dst);
    } else if (wants_u8) {
      for (int64_t k = 0; k < K; ++k) dst[k] = static_cast<uint8_t>(p.a_s8[m * K + k] + kS8ToU8Offset);
    } else {
      std::memcpy(dst, p.a_s8 + m * K, static_cast<size_t>(K));
    }
  }
  if (wants_u8) {
    args.a_u8 = padded.data();
    args.a_zero_point = p.a_u8 != nullptr ? p.a_zero_point : kS8ToU8Offset;
  } else {
    args.a_s8 = reinterpret_cast<const int8_t*>(padded.data());
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
  const int64_t nblocks = round_up(w.n, kS8BlockN) / kS8BlockN;
  detail::parallel_over_blocks(nblocks, kS8BlockN * kp * std::max<int64_t>(1, p.m),
                               [&](int64_t b, int64_t e) { fn(args, b, e); });
}

void run_reference(const Problem& p) {
  const S8N16K4View& w = *p.w;
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

// The ordered kernel list. `a_in_127`: A is known to lie in [-127, 127].
void dispatch(const Problem& p, bool a_in_127, RunInfo* info) {
  RunInfo local;
  RunInfo& ri = info != nullptr ? *info : local;
  ri = RunInfo{};
  std::string why;

  constexpr const char* kVnni = "gemv_u8s8s32_n16k4_avx512vnni";
  if (isa_usable(Isa::kAvx512Vnni, &why)) {
#ifdef QFORGE_KERNELS_AVX512VNNI
    ri.kernel = kVnni;
    if (p.m > 0) run_fast(detail::gemv_u8s8s32_n16k4_avx512vnni, p, true);
    return;
#endif
  }
  ri.skip(kVnni, why);

  constexpr const char* kAvx2 = "gemv_s8s8s32_n16k4_avx2";
  if (!isa_usable(Isa::kAvx2, &why)) {
    ri.skip(kAvx2, why);
  } else if (p.a_u8 != nullptr) {
    ri.skip(kAvx2, "u8 activations with a zero point need VPDPBUSD");
  } else if (!a_in_127 && std::find(p.a_s8, p.a_s8 + p.m * p.w->k, int8_t{-128}) !=
                               p.a_s8 + p.m * p.w->k) {
    ri.skip(kAvx2, "A contains -128 (the VPMADDUBSW sign trick needs [-127, 127])");
  } else {
#ifdef QFORGE_KERNELS_AVX2
    ri.kernel = kAvx2;
    if (p.m > 0) run_fast(detail::gemv_s8s8s32_n16k4_avx2, p, false);
    return;
#endif
  }

  ri.kernel = "reference";
  if (p.m > 0) run_reference(p);
}

}  // namespace

void gemv_s8s8s32(const int8_t* A, int64_t M, const S8N16K4View& w, int32_t* C, RunInfo* info) {
  check_view(w, M, A, C);
  Problem p;
  p.a_s8 = A;
  p.m = M;
  p.w = &w;
  p.c = C;
  dispatch(p, false, info);
}

void gemv_u8s8s32(const uint8_t* A, int32_t a_zero_point, int64_t M, const S8N16K4View& w,
                  int32_t* C, RunInfo* info) {
  check_view(w, M, A, C);
  Problem p;
  p.a_u8 = A;
  p.a_zero_point = a_zero_point;
  p.m = M;
  p.w = &w;
  p.c = C;
  dispatch(p, false, info);
}

void gemv_s8s8f32(const int8_t* A, int64_t M, const float* a_scale, const S8N16K4View& w,
                  const float* w_scale, const float* bias, float* y, RunInfo* info) {
  check_view(w, M, A, y);
  QF_REQUIRE(M == 0 || (a_scale != nullptr && w_scale != nullptr),
             "kernels/cpu: gemv_s8s8f32 needs a_scale and w_scale");
  Problem p;
  p.a_s8 = A;
  p.m = M;
  p.w = &w;
  p.y = y;
  p.a_scale = a_scale;
  p.w_scale = w_scale;
  p.bias = bias;
  dispatch(p, false, info);
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
  auto slice = [&](int64_t b, std::vector<int8_t>& packed, std::vector<int32_t>& colsum, RunInfo* ri) {
    packed.resize(static_cast<size_t>(np * kp));
    colsum.resize(static_cast<size_t>(np));
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
  if (batch >= at::get_num_threads() && batch > 1) {
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      std::vector<int8_t> packed;
      std::vector<int32_t> colsum;
      RunInfo local;
      for (int64_t b = begin; b < end; ++b) slice(b, packed, colsum, b == 0 ? info : &local);
    });
  } else {
    std::vector<int8_t> packed;
    std::vector<int32_t> colsum;
    RunInfo local;
    for (int64_t b = 0; b < batch; ++b) slice(b, packed, colsum, b == 0 ? info : &local);
  }
}

}  // namespace qforge::kernels
