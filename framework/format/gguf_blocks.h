// ggml's tensor encodings as GGUF stores them, written from ggml's block definitions
// (ggml-common.h) and reference quantizers (ggml-quants.c):
//   F32, F16 (IEEE half, round to nearest even);
//   Q8_0: blocks of 32 along a row, {fp16 d; int8 qs[32]},  x = qs[j] * d;
//   Q4_0: blocks of 32 along a row, {fp16 d; uint8 qs[16]}, x = (nibble - 8) * d, element j in
//         the low nibble of qs[j], element j + 16 in its high nibble.
//   Q6_K: super-blocks of 256 along a row, {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; fp16 d},
//         x = d * scales[j / 16] * (q - 32) with q six bits: in each half h of 128 values, element
//         l + 32k (l < 32, k < 4) has its low 4 bits in ql[64h + l + 32(k & 1)] (low nibble for
//         k < 2, high for k >= 2) and its high 2 bits at bit 2k of qh[32h + l] (dequantize_row_q6_K).
//   Q4_K: super-blocks of 256 along a row, {fp16 d; fp16 dmin; uint8 scales[12]; uint8 qs[128]},
//         x = d * sc[j] * q - dmin * m[j] for sub-block j = e / 32 (8 of them), q four bits: element
//         64c + l (l < 32) in the low nibble of qs[32c + l], element 64c + 32 + l in its high nibble;
//         sc / m six bits each (get_scale_min_k4): j < 4: sc = scales[j] & 63, m = scales[j + 4] & 63;
//         j >= 4: sc = (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4,
//                 m = (scales[j + 4] >> 4) | (scales[j] >> 6) << 4  (dequantize_row_q4_K).
// Rows are the last dimension of a torch tensor (ggml's ne[0]).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "framework/format/gguf.h"

namespace qforge::io {

inline constexpr int64_t kGgmlBlock = 32;  // QK8_0 = QK4_0
struct GgmlBlockQ8_0 {
  uint16_t d;  // fp16 bits
  int8_t qs[kGgmlBlock];
};
struct GgmlBlockQ4_0 {
  uint16_t d;  // fp16 bits
  uint8_t qs[kGgmlBlock / 2];
};
inline constexpr int64_t kGgmlSuperBlock = 256;  // QK_K
struct GgmlBlockQ6_K {
  uint8_t ql[kGgmlSuperBlock / 2];  // low 4 bits
  uint8_t qh[kGgmlSuperBlock / 4];  // high 2 bits
  int8_t scales[kGgmlSuperBlock / 16];
  uint16_t d;  // fp16 bits
};
static_assert(sizeof(GgmlBlockQ6_K) == 210, "block_q6_K is 210 bytes");
struct GgmlBlockQ4_K {
  uint16_t d;     // fp16 bits: scale of the sub-block scales
  uint16_t dmin;  // fp16 bits: scale of the sub-block mins
  uint8_t scales[12];
  uint8_t qs[kGgmlSuperBlock / 2];
};
static_assert(sizeof(GgmlBlockQ4_K) == 144, "block_q4_K is 144 bytes");
static_assert(sizeof(GgmlBlockQ8_0) == 2 + kGgmlBlock, "block_q8_0 is 34 bytes");
static_assert(sizeof(GgmlBlockQ4_0) == 2 + kGgmlBlock / 2, "block_q4_0 is 18 bytes");

// A float tensor (any float dtype, any device; 1-4 dims) as a GGUF tensor of `type`. Q8_0 and
// Q4_0 run ggml's reference quantizers (quantize_row_q8_0_ref: d = amax / 127, q = round(x / d);
// quantize_row_q4_0_ref: d = (the value of largest magnitude) / -8, q = min(15, trunc(x / d + 8.5))).
// Q6_K runs qforge's own quantizer of the format (not ggml's iterative quantize_row_q6_K_ref): per
// sub-block of 16, s = max|x| / 31; d = fp16(max s / 127), scales = round(s / d), then
// q = clamp(round(x / (d * scale)), -32, 31) against the stored scales. Q4_K runs qforge's own
// quantizer of the format (not ggml's iterative make_qkx2_quants): per sub-block of 32, lo = min(0,
// min x), s = (max x - lo) / 15, mn = -lo; d = fp16(max s / 63), dmin = fp16(max mn / 63), sc =
// min(63, round(s / d)), m = min(63, round(mn / dmin)), then q = clamp(round((x + dmin * m) / (d * sc)),
// 0, 15) against the stored values.
GgufTensor encode_gguf_tensor(const std::string& name, const at::Tensor& t, GgmlType type);

// Integer codes already on a symmetric grid, [rows, K] (K a multiple of 32), with one scale per
// 32-block, `scales` [rows, K / 32]: Q8_0 takes codes in [-128, 127], Q4_0 codes in [-8, 7]. The
// codes are kept; each scale is rounded to fp16, the only change (relative |Δ| <= 2^-11 per block).
GgufTensor encode_gguf_codes(const std::string& name, const at::Tensor& codes, const at::Tensor& scales,
                             GgmlType type);

// The float32 values a GGUF tensor stands for, with torch's shape (ne reversed).
at::Tensor decode_gguf_tensor(const GgufTensor& t);

// The inverse of encode_gguf_codes for a 2-D Q8_0 / Q4_0 tensor: `codes` int8 [rows, K] (Q4_0:
// nibble - 8, in [-8, 7]) and `scales` float32 [rows, K / 32] (the blocks' fp16 d, any sign), so
// decode_gguf_tensor(t) = codes * scales per block. Throws for other types or shapes.
void decode_gguf_codes(const GgufTensor& t, at::Tensor* codes, at::Tensor* scales);

}  // namespace qforge::io
