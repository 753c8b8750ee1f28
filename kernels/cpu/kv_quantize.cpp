// Appending a quantized KV cache's positions in one pass (kv_quantize.h).
#include "kernels/cpu/kv_quantize.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "framework/core/error.h"
#include "framework/core/qparams.h"

namespace qforge::kernels {
namespace {

// One group's code for x (the problem's formula), as an int in [qmin, qmax].
int code_of(float x, float inv, int z, int qmin, int qmax) {
  if (std::isnan(x)) return z;
  const float q = std::nearbyint(x * inv) + static_cast<float>(z);
  return static_cast<int>(std::clamp(q, static_cast<float>(qmin), static_cast<float>(qmax)));
}

}  // namespace

void quantize_kv_rows(const KvQuantizeProblem& p) {
  QF_REQUIRE((p.bits == 8 || (p.bits == 4 && p.D % 2 == 0 && p.group % 2 == 0)) && p.group > 0 && p.D % p.group == 0 &&
                 p.T >= 0 && p.first >= 0 && p.first + p.T <= p.capacity &&
                 (p.batch * p.heads * p.T == 0 || (p.x && p.codes && p.scale)),
             "kernels/cpu: quantize_kv_rows got bits=", p.bits, " D=", p.D, " group=", p.group, " T=", p.T,
             " first=", p.first, " capacity=", p.capacity, " or a null pointer");
  const int qmin = p.bits == 8 ? -128 : -8, qmax = p.bits == 8 ? 127 : 7;
  const int64_t groups = p.D / p.group, row_bytes = p.bits == 8 ? p.D : p.D / 2;
  const bool symmetric = p.zero_point == nullptr;
  for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
    for (int64_t t = 0; t < p.T; ++t) {
      const float* x = p.x + (bh * p.T + t) * p.D;
      const int64_t pos = bh * p.capacity + p.first + t;
      uint8_t* codes = p.codes + pos * row_bytes;
      for (int64_t g = 0; g < groups; ++g) {
        const float* xg = x + g * p.group;
        float s;
        int z = 0;
        if (p.static_scale != nullptr) {
          const int64_t hg = (bh % p.heads) * groups + g;
          s = p.static_scale[hg];
          z = p.static_zero_point != nullptr ? p.static_zero_point[hg] : 0;
        } else {
          float lo = 0, hi = 0;  // min(·, 0) and max(·, 0) of the finite values
          for (int64_t i = 0; i < p.group; ++i) {
            if (!std::isfinite(xg[i])) continue;
            const float v = symmetric ? xg[i] : std::clamp(xg[i], -kKvRangeLimit, kKvRangeLimit);
            lo = std::min(lo, v), hi = std::max(hi, v);
          }
          if (p.clip_ratio != 1.0f) lo *= p.clip_ratio, hi *= p.clip_ratio;
          if (symmetric) {
            s = std::max(std::max(-lo, hi) / (static_cast<float>(qmax - qmin) / 2), kScaleEps);
          } else {
            s = std::max((hi - lo) / static_cast<float>(qmax - qmin), kScaleEps);
            z = std::clamp(qmin - static_cast<int>(std::nearbyint(lo / s)), qmin, qmax);
          }
        }
        if (!symmetric) p.zero_point[pos * groups + g] = static_cast<int8_t>(z);
        p.scale[pos * groups + g] = s;
        const float inv = 1.0f / s;
        for (int64_t i = 0; i < p.group; ++i) {
          const int c = code_of(xg[i], inv, z, qmin, qmax);
          const int64_t d = g * p.group + i;
          if (p.bits == 8) {
            codes[d] = static_cast<uint8_t>(static_cast<int8_t>(c));
          } else if (d % 2 == 0) {
            codes[d / 2] = static_cast<uint8_t>(c & 15);
          } else {
            codes[d / 2] = static_cast<uint8_t>(codes[d / 2] | ((c & 15) << 4));
          }
        }
      }
    }
}

}  // namespace qforge::kernels
