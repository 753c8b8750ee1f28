// Reference sub-byte packing (dense int4 / int2) and the blocked n16k4 / n16k8 weight layouts.
#include <algorithm>
#include <cstring>

#include "framework/core/error.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/reference.h"

namespace qforge::kernels {

namespace {

// Packs `n` values of `bits` bits, low bits first, after checking each lies in [lo, hi].
void pack_bits(const int8_t* values, int64_t n, uint8_t* packed, int bits, int lo, int hi,
               const char* what) {
  const int per_byte = 8 / bits;
  const int mask = (1 << bits) - 1;
  std::memset(packed, 0, static_cast<size_t>((n + per_byte - 1) / per_byte));
  for (int64_t i = 0; i < n; ++i) {
    QF_REQUIRE(values[i] >= lo && values[i] <= hi, "kernels/cpu: ", what, " value ", int{values[i]},
               " at index ", i, " outside [", lo, ", ", hi, "]");
    packed[i / per_byte] |= static_cast<uint8_t>((values[i] & mask) << ((i % per_byte) * bits));
  }
}

void unpack_bits(const uint8_t* packed, int64_t n, int8_t* values, int bits, bool sign_extend) {
  const int per_byte = 8 / bits;
  const int mask = (1 << bits) - 1;
  const int sign = 1 << (bits - 1);
  for (int64_t i = 0; i < n; ++i) {
    const int field = (packed[i / per_byte] >> ((i % per_byte) * bits)) & mask;
    // (field ^ sign) - sign maps the two's complement field to its signed value.
    values[i] = static_cast<int8_t>(sign_extend ? (field ^ sign) - sign : field);
  }
}

constexpr int kS4Min = -8, kS4Max = 7, kU4Max = 15, kS2Min = -2, kS2Max = 1, kU2Max = 3;

}  // namespace

void pack_s4_reference(const int8_t* values, int64_t n, uint8_t* packed) {
  pack_bits(values, n, packed, 4, kS4Min, kS4Max, "pack_s4");
}
void unpack_s4_reference(const uint8_t* packed, int64_t n, int8_t* values) {
  unpack_bits(packed, n, values, 4, true);
}
void pack_u4_reference(const int8_t* values, int64_t n, uint8_t* packed) {
  pack_bits(values, n, packed, 4, 0, kU4Max, "pack_u4");
}
void unpack_u4_reference(const uint8_t* packed, int64_t n, int8_t* values) {
  unpack_bits(packed, n, values, 4, false);
}
void pack_s2_reference(const int8_t* values, int64_t n, uint8_t* packed) {
  pack_bits(values, n, packed, 2, kS2Min, kS2Max, "pack_s2");
}
void unpack_s2_reference(const uint8_t* packed, int64_t n, int8_t* values) {
  unpack_bits(packed, n, values, 2, true);
}
void pack_u2_reference(const int8_t* values, int64_t n, uint8_t* packed) {
  pack_bits(values, n, packed, 2, 0, kU2Max, "pack_u2");
}
void unpack_u2_reference(const uint8_t* packed, int64_t n, int8_t* values) {
  unpack_bits(packed, n, values, 2, false);
}

void pack_s8_n16k4_reference(const int8_t* W, int64_t N, int64_t K, int8_t* packed,
                             int32_t* colsum) {
  const int64_t np = round_up(N, kS8BlockN), kp = round_up(K, kS8BlockK);
  for (int64_t nb = 0; nb < np / kS8BlockN; ++nb) {
    for (int64_t kb = 0; kb < kp / kS8BlockK; ++kb) {
      int8_t* block = packed + (nb * kp / kS8BlockK + kb) * kS8BlockBytes;
      for (int64_t j = 0; j < kS8BlockN; ++j) {
        for (int64_t i = 0; i < kS8BlockK; ++i) {
          const int64_t n = nb * kS8BlockN + j, k = kb * kS8BlockK + i;
          block[j * kS8BlockK + i] = (n < N && k < K) ? W[n * K + k] : 0;
        }
      }
    }
  }
  for (int64_t n = 0; n < np; ++n) {
    int32_t sum = 0;
    for (int64_t k = 0; n < N && k < K; ++k) sum += W[n * K + k];
    colsum[n] = sum;
  }
}

void unpack_s8_n16k4_reference(const int8_t* packed, int64_t N, int64_t K, int8_t* W) {
  const int64_t kp = round_up(K, kS8BlockK);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t nb = n / kS8BlockN, j = n % kS8BlockN, kb = k / kS8BlockK, i = k % kS8BlockK;
      W[n * K + k] = packed[(nb * kp / kS8BlockK + kb) * kS8BlockBytes + j * kS8BlockK + i];
    }
  }
}

void pack_s4_n16k8_reference(const int8_t* W, int64_t N, int64_t K, int qmin, uint8_t* packed) {
  const int64_t np = round_up(N, kS4BlockN), kp = round_up(K, kS4BlockK);
  constexpr int kLowNibbleK = kS4BlockK / 2;  // k offsets [0, 4) low nibble, [4, 8) high nibble
  for (int64_t nb = 0; nb < np / kS4BlockN; ++nb) {
    for (int64_t kb = 0; kb < kp / kS4BlockK; ++kb) {
      uint8_t* block = packed + (nb * kp / kS4BlockK + kb) * kS4BlockBytes;
      for (int64_t j = 0; j < kS4BlockN; ++j) {
        for (int64_t i = 0; i < kLowNibbleK; ++i) {
          const int64_t n = nb * kS4BlockN + j;
          auto code = [&](int64_t k) -> int {
            if (n >= N || k >= K) return 0;
            const int u = W[n * K + k] - qmin;
            QF_REQUIRE(u >= 0 && u <= kU4Max, "kernels/cpu: int4 weight [", n, ", ", k, "] = ",
                       int{W[n * K + k]}, " outside [", qmin, ", ", qmin + kU4Max, "]");
            return u;
          };
          const int64_t k0 = kb * kS4BlockK + i;
          block[j * kLowNibbleK + i] =
              static_cast<uint8_t>(code(k0) | (code(k0 + kLowNibbleK) << kS4NibbleBits));
        }
      }
    }
  }
}

void unpack_s4_n16k8_reference(const uint8_t* packed, int64_t N, int64_t K, int qmin, int8_t* W) {
  const int64_t kp = round_up(K, kS4BlockK);
  constexpr int kLowNibbleK = kS4BlockK / 2;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t nb = n / kS4BlockN, j = n % kS4BlockN, kb = k / kS4BlockK, i = k % kS4BlockK;
      const uint8_t byte =
          packed[(nb * kp / kS4BlockK + kb) * kS4BlockBytes + j * kLowNibbleK + i % kLowNibbleK];
      const int u = i < kLowNibbleK ? (byte & kS4NibbleMask) : (byte >> kS4NibbleBits);
      W[n * K + k] = static_cast<int8_t>(u + qmin);
    }
  }
}

namespace {

// Block (nb, b) of n16b32: f(scales at, codes at, n16k8 codes from, code bytes, meta entry), its 16
// scales and n16k8 octs 4b .. 4b + 3 of column block nb (the last block's missing octs stay 0).
template <typename F>
void for_each_n16b32_block(int64_t N, int64_t K, const F& f) {
  const int64_t octs = round_up(K, kS4BlockK) / kS4BlockK, kb = (K + kS4B32K - 1) / kS4B32K;
  for (int64_t nb = 0; nb < round_up(N, kS4BlockN) / kS4BlockN; ++nb) {
    const int64_t col = nb * s4_b32_column_bytes(kb);
    for (int64_t b = 0; b < kb; ++b) {
      const int64_t o0 = b * kS4B32Octs, o1 = std::min(octs, o0 + kS4B32Octs);
      f(col + s4_b32_scale_offset(b), col + s4_b32_code_offset(b), (nb * octs + o0) * kS4BlockBytes,
        (o1 - o0) * kS4BlockBytes, (nb * kb + b) * kS4BlockN);
    }
  }
}

}  // namespace

void pack_s4_n16b32_reference(const uint8_t* n16k8, const Fp16Bits* scales, int64_t N, int64_t K, uint8_t* packed) {
  std::memset(packed, 0, round_up(N, kS4BlockN) / kS4BlockN * s4_b32_column_bytes((K + kS4B32K - 1) / kS4B32K));
  for_each_n16b32_block(N, K, [&](int64_t scale_at, int64_t code_at, int64_t codes, int64_t code_bytes, int64_t meta) {
    std::memcpy(packed + scale_at, scales + meta, kS4B32ScaleBytes);
    std::memcpy(packed + code_at, n16k8 + codes, code_bytes);
  });
}

void unpack_s4_n16b32_reference(const uint8_t* packed, int64_t N, int64_t K, uint8_t* n16k8, Fp16Bits* scales) {
  for_each_n16b32_block(N, K, [&](int64_t scale_at, int64_t code_at, int64_t codes, int64_t code_bytes, int64_t meta) {
    std::memcpy(scales + meta, packed + scale_at, kS4B32ScaleBytes);
    std::memcpy(n16k8 + codes, packed + code_at, code_bytes);
  });
}

}  // namespace qforge::kernels
