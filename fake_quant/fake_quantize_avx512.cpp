// AVX-512 (F/BW/VL/DQ) instantiation of the fake-quant kernels. Built only when the compiler
// supports the flags; used only after a run-time CPU check (fake_quantize_dispatch.cpp).
#include <immintrin.h>

#include "fake_quant/fake_quantize_simd.h"

namespace qforge::fq {
namespace {

struct Avx512 {
  using F = __m512;
  using M = __mmask16;
  static constexpr int kLanes = 16;
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void stream(float* p, F v) { _mm512_stream_ps(p, v); }
  static void fence() { _mm_sfence(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F round(F v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static M ge(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  static M le(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ); }
  static M lt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static M gt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static M and_(M a, M b) { return static_cast<M>(a & b); }
  static M or_(M a, M b) { return static_cast<M>(a | b); }
  static F select(M m, F if_true, F if_false) { return _mm512_mask_blend_ps(m, if_false, if_true); }
  static void store_mask(bool* p, M m) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_maskz_mov_epi8(m, _mm_set1_epi8(1)));
  }
  static M load_mask(const bool* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm_test_epi8_mask(b, b);
  }
  static double sum_double(F v) {
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
  }
};

const FakeQuantKernels kAvx512{"avx512", simd::affine_run<Avx512, false>,
                               simd::affine_run<Avx512, true>, simd::affine_rows<Avx512>,
                               simd::mask_grad<Avx512, false>,
                               simd::mask_grad<Avx512, true>, simd::lsq_run<Avx512>};

}  // namespace

const FakeQuantKernels* avx512_kernels() { return &kAvx512; }

}  // namespace qforge::fq
