// Dispatchers of the activation quantizers (dynamic and static): quantize_rows_s8_avx512 -> reference.
#include "kernels/cpu/quantize_rows_s8.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "framework/core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/parallel_blocks.h"
#include "kernels/cpu/workspace.h"

namespace qforge::kernels {

namespace {
[[maybe_unused]] constexpr const char* kNonFiniteWhy = "non-finite input (the reference reports where)";
}  // namespace

void quantize_rows_s8(const float* x, int64_t M, int64_t K, ActScale mode, int8_t* q, int64_t ldq,
                      float* a_scale, RunInfo* info, int qmax, float clip) {
  QF_REQUIRE(M >= 0 && K >= 0 && ldq >= K, "kernels/cpu: quantize_rows_s8 got M=", M, " K=", K,
             " ldq=", ldq);
  QF_REQUIRE(qmax >= 1 && qmax <= kActQMax, "kernels/cpu: quantize_rows_s8 got qmax=", qmax, " (1 to 127)");
  QF_REQUIRE(clip > 0.0f && clip <= 1.0f, "kernels/cpu: quantize_rows_s8 got clip=", clip, " (in (0, 1])");
  QF_REQUIRE(M == 0 || (x != nullptr && q != nullptr && a_scale != nullptr),
             "kernels/cpu: quantize_rows_s8 got a null pointer");
  run_isa_or_reference(
      Isa::kAvx512, "quantize_rows_s8_avx512", info,
      [&](std::string* why) {
#ifdef QFORGE_KERNELS_AVX512
        // Row maxima go to thread scratch, so a non-finite row leaves a_scale and q untouched.
        const detail::ScratchArray<float> row_amax(detail::Scratch::kRowMaxima, M);
        float* amax_of = row_amax.data();
        for (int64_t m = 0; m < M; ++m) {
          if (!detail::row_amax_avx512(x + m * K, K, &amax_of[m])) {
            *why = kNonFiniteWhy;
            return false;
          }
        }
        if (mode == ActScale::kPerTensor && M > 0) {
          std::fill(amax_of, amax_of + M, *std::max_element(amax_of, amax_of + M));
        }
        for (int64_t m = 0; m < M; ++m) {
          // Same scalar expressions as the reference, so scale and inv match bit for bit.
          const float amax = amax_of[m];
          const float range = clip == 1.0f ? amax : amax * clip;
          const float scale = range > 0.0f ? range / static_cast<float>(qmax) : 1.0f;
          a_scale[m] = scale;
          if (clip == 1.0f) {
            detail::quantize_row_avx512(x + m * K, K, 1.0f / scale, q + m * ldq, ldq, qmax);
          } else {
            // Clipped rows reach beyond ±qmax before the clamp (by 1 / clip): clamped before the
            // conversion, which returns INT_MIN past 2^31. The row is finite (checked above).
            int8_t* row = q + m * ldq;
            detail::quantize_clamp_avx512(x + m * K, K, 1.0f / scale, -qmax, qmax, row);
            if (ldq > K) std::memset(row + K, 0, static_cast<size_t>(ldq - K));
          }
        }
        return true;
#else
        return false;
#endif
      },
      [&] { quantize_rows_s8_reference(x, M, K, mode, q, ldq, a_scale, qmax, clip); });
}

void quantize_static_s8(const float* x, int64_t count, float inv, int qmin, int qmax, int8_t* q, RunInfo* info) {
  QF_REQUIRE(count >= 0 && -128 <= qmin && qmin <= qmax && qmax <= 127, "kernels/cpu: quantize_static_s8 got count=",
             count, " grid [", qmin, ", ", qmax, "]");
  QF_REQUIRE(count == 0 || (x != nullptr && q != nullptr), "kernels/cpu: quantize_static_s8 got a null pointer");
  run_isa_or_reference(
      Isa::kAvx512, "quantize_static_s8_avx512", info,
      [&](std::string* why) {
#ifdef QFORGE_KERNELS_AVX512
        std::atomic<bool> finite{true};
        // 64 KiB of floats per task: enough work to be worth a thread.
        detail::parallel_over(count, int64_t{1} << 14, [&](int64_t i0, int64_t i1) {
          if (!detail::quantize_clamp_avx512(x + i0, i1 - i0, inv, qmin, qmax, q + i0)) finite = false;
        });
        if (!finite) *why = kNonFiniteWhy;
        return finite.load();
#else
        return false;
#endif
      },
      [&] { quantize_static_s8_reference(x, count, inv, qmin, qmax, q); });
}

namespace {

using RowQ8 = bool (*)(const float*, int64_t, int8_t*, float*, int32_t*);

// The fastest usable block-32 row quantizer (named in ri.kernel), or nullptr for the reference.
RowQ8 pick_row_q8b32(RunInfo& ri) {
  struct Twin {
    Isa isa;
    const char* name;
    RowQ8 fn;  // null where the compiler lacked the flags
  };
  static const Twin kTwins[] = {
      {Isa::kAvx512, "quantize_rows_q8b32_avx512", QF_KERNEL_AVX512(detail::quantize_row_q8b32_avx512)},
      {Isa::kAvx2, "quantize_rows_q8b32_avx2", QF_KERNEL_AVX2(detail::quantize_row_q8b32_avx2)},
  };
  for (const Twin& t : kTwins) {
    std::string why;
    if (isa_usable(t.isa, &why) && t.fn != nullptr) {
      ri.kernel = t.name;
      return t.fn;
    }
    ri.skip(t.name, why);
  }
  return nullptr;
}

}  // namespace

void quantize_rows_q8b32(const float* x, int64_t M, int64_t K, int8_t* q, int64_t ldq, float* d, int32_t* s,
                         RunInfo* info) {
  const int64_t kb = q8_block_count(K);
  QF_REQUIRE(M >= 0 && K > 0 && ldq >= kb * kQ8Block, "kernels/cpu: quantize_rows_q8b32 got M=", M, " K=", K,
             " ldq=", ldq);
  QF_REQUIRE(M == 0 || (x != nullptr && q != nullptr && d != nullptr && s != nullptr),
             "kernels/cpu: quantize_rows_q8b32 got a null pointer");
  RunInfo local;
  RunInfo& ri = info != nullptr ? *info : local;
  ri = RunInfo{};
  const RowQ8 row = pick_row_q8b32(ri);
  bool finite = row != nullptr;
  for (int64_t m = 0; m < M && finite; ++m) {
    finite = row(x + m * K, K, q + m * ldq, d + m * kb, s + m * kb);
    std::fill(q + m * ldq + kb * kQ8Block, q + (m + 1) * ldq, int8_t{0});
  }
  if (finite) return;
  if (row != nullptr) ri.skip(std::string(ri.kernel), kNonFiniteWhy);
  ri.kernel = "reference";
  quantize_rows_q8b32_reference(x, M, K, q, ldq, d, s);
}

}  // namespace qforge::kernels
