// AVX2 instantiation of the fake-quant kernels (8 lanes). Built only when the compiler supports
// -mavx2; used only after a run-time CPU check (fake_quantize_dispatch.cpp).
#include <immintrin.h>

#include <array>
#include <cstring>

#include "fake_quant/fake_quantize_simd.h"

namespace qforge::fq {
namespace {

// Byte expansion of an 8-bit movemask into eight 0/1 bools.
constexpr std::array<uint64_t, 256> make_expand_table() {
  std::array<uint64_t, 256> t{};
  for (int m = 0; m < 256; ++m)
    for (int b = 0; b < 8; ++b)
      if (m & (1 << b)) t[m] |= uint64_t{1} << (8 * b);
  return t;
}
constexpr std::array<uint64_t, 256> kExpandMask = make_expand_table();

struct Avx2 {
  using F = __m256;
  using M = __m256;  // all-ones lanes where true
  static constexpr int kLanes = 8;
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void stream(float* p, F v) { _mm256_stream_ps(p, v); }
  static void fence() { _mm_sfence(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F round(F v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static M ge(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
  static M le(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LE_OQ); }
  static M lt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static M gt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static M and_(M a, M b) { return _mm256_and_ps(a, b); }
  static M or_(M a, M b) { return _mm256_or_ps(a, b); }
  static F select(M m, F if_true, F if_false) { return _mm256_blendv_ps(if_false, if_true, m); }
  static void store_mask(bool* p, M m) {
    const uint64_t bytes = kExpandMask[static_cast<unsigned>(_mm256_movemask_ps(m))];
    std::memcpy(p, &bytes, sizeof bytes);
  }
  static M load_mask(const bool* p) {
    const __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(w, _mm256_setzero_si256()));
  }
  static double sum_double(F v) {
    const __m256d s = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)),
                                    _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
  }
};

const FakeQuantKernels kAvx2{"avx2", simd::affine_run<Avx2, false>,
                               simd::affine_run<Avx2, true>, simd::affine_rows<Avx2>,
                             simd::mask_grad<Avx2, false>,
                               simd::mask_grad<Avx2, true>, simd::lsq_run<Avx2>};

}  // namespace

const FakeQuantKernels* avx2_kernels() { return &kAvx2; }

}  // namespace qforge::fq
