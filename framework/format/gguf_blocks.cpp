#include "framework/format/gguf_blocks.h"

#include <ATen/ATen.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "framework/core/error.h"

namespace qforge::io {
namespace {

uint16_t to_fp16(float x) { return c10::Half(x).x; }  // round to nearest even, as GGML_FP32_TO_FP16
float from_fp16(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }

std::vector<uint64_t> ggml_shape(const at::Tensor& t, const std::string& name) {
  QF_REQUIRE(t.dim() >= 1 && t.dim() <= 4, "gguf: tensor '", name, "' has ", t.dim(), " dimensions (1 to 4 allowed)");
  std::vector<uint64_t> ne;
  for (int64_t d = t.dim() - 1; d >= 0; --d) ne.push_back(static_cast<uint64_t>(t.size(d)));
  return ne;
}

template <typename Block>
std::vector<uint8_t> to_bytes(const std::vector<Block>& blocks) {
  std::vector<uint8_t> out(blocks.size() * sizeof(Block));
  std::memcpy(out.data(), blocks.data(), out.size());
  return out;
}

std::vector<GgmlBlockQ8_0> quantize_q8_0(const float* x, int64_t n) {
  std::vector<GgmlBlockQ8_0> y(n / kGgmlBlock);
  for (size_t i = 0; i < y.size(); ++i, x += kGgmlBlock) {
    float amax = 0.0f;
    for (int64_t j = 0; j < kGgmlBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = to_fp16(d);
    for (int64_t j = 0; j < kGgmlBlock; ++j) y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
  return y;
}

std::vector<GgmlBlockQ4_0> quantize_q4_0(const float* x, int64_t n) {
  std::vector<GgmlBlockQ4_0> y(n / kGgmlBlock);
  constexpr int64_t half = kGgmlBlock / 2;
  for (size_t i = 0; i < y.size(); ++i, x += kGgmlBlock) {
    float amax = 0.0f, max = 0.0f;
    for (int64_t j = 0; j < kGgmlBlock; ++j) {
      if (amax < std::fabs(x[j])) amax = std::fabs(x[j]), max = x[j];
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = to_fp16(d);
    for (int64_t j = 0; j < half; ++j) {
      // ggml truncates through int8_t after adding 8.5: round half up on the shifted grid.
      const auto q0 = static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f))));
      const auto q1 =
          static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>(x[half + j] * id + 8.5f))));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
  return y;
}

void require_blocks(const at::Tensor& t, const std::string& name, GgmlType type) {
  const auto block = static_cast<int64_t>(ggml_block_elements(type));
  QF_REQUIRE(t.size(-1) % block == 0, "gguf: tensor '", name, "' cannot be ", ggml_type_name(type), ": its rows (",
             t.size(-1), ") are not a multiple of ", block);
}

// Where value e (0..255) of a Q6_K super-block keeps its bits (gguf_blocks.h): its ql byte, whether
// the high nibble, its qh byte and the shift of its two high bits there.
struct Q6Place {
  int64_t ql, qh;
  bool high;
  int shift;
};
Q6Place q6_place(int64_t e) {
  const int64_t h = e / 128, l = e % 32, k = (e % 128) / 32;
  return {64 * h + l + 32 * (k & 1), 32 * h + l, k >= 2, static_cast<int>(2 * k)};
}

std::vector<GgmlBlockQ6_K> quantize_q6_k(const float* x, int64_t n) {
  std::vector<GgmlBlockQ6_K> y(n / kGgmlSuperBlock);
  constexpr int64_t kSub = 16;
  for (size_t i = 0; i < y.size(); ++i, x += kGgmlSuperBlock) {
    GgmlBlockQ6_K& b = y[i];
    std::memset(&b, 0, sizeof(b));
    float s[kGgmlSuperBlock / kSub], smax = 0.0f;
    for (int64_t j = 0; j < kGgmlSuperBlock / kSub; ++j) {
      float amax = 0.0f;
      for (int64_t e = 0; e < kSub; ++e) amax = std::max(amax, std::fabs(x[j * kSub + e]));
      s[j] = amax / 31.0f, smax = std::max(smax, s[j]);
    }
    b.d = to_fp16(smax / 127.0f);
    const float d = from_fp16(b.d);
    for (int64_t j = 0; j < kGgmlSuperBlock / kSub; ++j) {
      b.scales[j] = static_cast<int8_t>(d > 0.0f ? std::min(127.0f, std::round(s[j] / d)) : 0.0f);
      const float step = d * b.scales[j];
      for (int64_t e = j * kSub; e < (j + 1) * kSub; ++e) {
        const int q = step > 0.0f ? static_cast<int>(std::clamp(std::round(x[e] / step), -32.0f, 31.0f)) + 32 : 32;
        const Q6Place p = q6_place(e);
        b.ql[p.ql] |= static_cast<uint8_t>((q & 0x0F) << (p.high ? 4 : 0));
        b.qh[p.qh] |= static_cast<uint8_t>((q >> 4) << p.shift);
      }
    }
  }
  return y;
}

// Sub-block j's six-bit scale and min in a Q4_K block (ggml's get_scale_min_k4), and their packing.
void q4k_scale_min(const uint8_t* s, int64_t j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63, *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}
void q4k_pack_scale_min(uint8_t* s, int64_t j, int sc, int m) {
  if (j < 4) {
    s[j] = static_cast<uint8_t>((s[j] & 0xC0) | sc), s[j + 4] = static_cast<uint8_t>((s[j + 4] & 0xC0) | m);
  } else {
    s[j + 4] = static_cast<uint8_t>((sc & 0x0F) | ((m & 0x0F) << 4));
    s[j - 4] = static_cast<uint8_t>(s[j - 4] | ((sc >> 4) << 6));
    s[j] = static_cast<uint8_t>(s[j] | ((m >> 4) << 6));
  }
}

// Element e of a Q4_K super-block: its qs byte and whether the high nibble (gguf_blocks.h).
int64_t q4k_byte(int64_t e) { return 32 * (e / 64) + e % 32; }
bool q4k_high(int64_t e) { return e % 64 >= 32; }

std::vector<GgmlBlockQ4_K> quantize_q4_k(const float* x, int64_t n) {
  std::vector<GgmlBlockQ4_K> y(n / kGgmlSuperBlock);
  constexpr int64_t kSub = 32, kSubs = kGgmlSuperBlock / kSub;
  for (size_t i = 0; i < y.size(); ++i, x += kGgmlSuperBlock) {
    GgmlBlockQ4_K& b = y[i];
    std::memset(&b, 0, sizeof(b));
    float s[kSubs], mn[kSubs], smax = 0.0f, mmax = 0.0f;
    for (int64_t j = 0; j < kSubs; ++j) {
      float lo = 0.0f, hi = x[j * kSub];
      for (int64_t e = j * kSub; e < (j + 1) * kSub; ++e) lo = std::min(lo, x[e]), hi = std::max(hi, x[e]);
      s[j] = (hi - lo) / 15.0f, mn[j] = -lo;
      smax = std::max(smax, s[j]), mmax = std::max(mmax, mn[j]);
    }
    b.d = to_fp16(smax / 63.0f), b.dmin = to_fp16(mmax / 63.0f);
    const float d = from_fp16(b.d), dmin = from_fp16(b.dmin);
    for (int64_t j = 0; j < kSubs; ++j) {
      const int sc = d > 0.0f ? static_cast<int>(std::min(63.0f, std::round(s[j] / d))) : 0;
      const int m = dmin > 0.0f ? static_cast<int>(std::min(63.0f, std::round(mn[j] / dmin))) : 0;
      q4k_pack_scale_min(b.scales, j, sc, m);
      const float step = d * static_cast<float>(sc), offset = dmin * static_cast<float>(m);
      for (int64_t e = j * kSub; e < (j + 1) * kSub; ++e) {
        const int q = step > 0.0f ? static_cast<int>(std::clamp(std::round((x[e] + offset) / step), 0.0f, 15.0f)) : 0;
        b.qs[q4k_byte(e)] |= static_cast<uint8_t>(q << (q4k_high(e) ? 4 : 0));
      }
    }
  }
  return y;
}

void decode_q4_k(const uint8_t* p, int64_t n, float* y) {
  for (int64_t i = 0; i < n / kGgmlSuperBlock; ++i, y += kGgmlSuperBlock) {
    GgmlBlockQ4_K b;
    std::memcpy(&b, p + i * sizeof(b), sizeof(b));
    const float d = from_fp16(b.d), dmin = from_fp16(b.dmin);
    for (int64_t e = 0; e < kGgmlSuperBlock; ++e) {
      int sc = 0, m = 0;
      q4k_scale_min(b.scales, e / 32, &sc, &m);
      const int q = (b.qs[q4k_byte(e)] >> (q4k_high(e) ? 4 : 0)) & 0x0F;
      y[e] = d * static_cast<float>(sc) * static_cast<float>(q) - dmin * static_cast<float>(m);
    }
  }
}

void decode_q6_k(const uint8_t* p, int64_t n, float* y) {
  for (int64_t i = 0; i < n / kGgmlSuperBlock; ++i, y += kGgmlSuperBlock) {
    GgmlBlockQ6_K b;
    std::memcpy(&b, p + i * sizeof(b), sizeof(b));
    const float d = from_fp16(b.d);
    for (int64_t e = 0; e < kGgmlSuperBlock; ++e) {
      const Q6Place pl = q6_place(e);
      const int q = ((b.ql[pl.ql] >> (pl.high ? 4 : 0)) & 0x0F) | (((b.qh[pl.qh] >> pl.shift) & 3) << 4);
      y[e] = d * static_cast<float>(b.scales[e / 16]) * static_cast<float>(q - 32);
    }
  }
}

}  // namespace

GgufTensor encode_gguf_tensor(const std::string& name, const at::Tensor& t, GgmlType type) {
  GgufTensor out;
  out.name = name, out.type = type, out.ne = ggml_shape(t, name);
  QF_REQUIRE(at::isFloatingType(t.scalar_type()), "gguf: tensor '", name, "' is ", t.scalar_type(), ", not float");
  const at::Tensor x = t.detach().to(at::kCPU, at::kFloat).contiguous();
  QF_REQUIRE(at::isfinite(x).all().item<bool>(), "gguf: tensor '", name, "' holds NaN or inf");
  const float* p = x.data_ptr<float>();
  const int64_t n = x.numel();
  switch (type) {
    case GgmlType::kF32:
      out.data.resize(n * sizeof(float));
      std::memcpy(out.data.data(), p, out.data.size());
      break;
    case GgmlType::kF16: {
      std::vector<uint16_t> h(n);
      for (int64_t i = 0; i < n; ++i) h[i] = to_fp16(p[i]);
      out.data = to_bytes(h);
      break;
    }
    case GgmlType::kQ8_0: require_blocks(x, name, type), out.data = to_bytes(quantize_q8_0(p, n)); break;
    case GgmlType::kQ4_0: require_blocks(x, name, type), out.data = to_bytes(quantize_q4_0(p, n)); break;
    case GgmlType::kQ4_K: require_blocks(x, name, type), out.data = to_bytes(quantize_q4_k(p, n)); break;
    case GgmlType::kQ6_K: require_blocks(x, name, type), out.data = to_bytes(quantize_q6_k(p, n)); break;
  }
  return out;
}

GgufTensor encode_gguf_codes(const std::string& name, const at::Tensor& codes, const at::Tensor& scales,
                             GgmlType type) {
  QF_REQUIRE(type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0, "gguf: tensor '", name,
             "': integer codes go to Q8_0 or Q4_0, not ", ggml_type_name(type));
  QF_REQUIRE(codes.dim() == 2, "gguf: tensor '", name, "': codes must be [rows, K], got ", codes.sizes());
  require_blocks(codes, name, type);
  const int64_t rows = codes.size(0), nb = codes.size(1) / kGgmlBlock;
  QF_REQUIRE(scales.sizes() == at::IntArrayRef({rows, nb}), "gguf: tensor '", name, "': scales must be [", rows, ", ",
             nb, "], got ", scales.sizes());
  const at::Tensor q = codes.to(at::kCPU, at::kInt).contiguous();
  const at::Tensor s = scales.to(at::kCPU, at::kFloat).contiguous();
  const int lo = type == GgmlType::kQ8_0 ? -128 : -8, hi = type == GgmlType::kQ8_0 ? 127 : 7;
  QF_REQUIRE(q.min().item<int>() >= lo && q.max().item<int>() <= hi, "gguf: tensor '", name, "': codes outside [", lo,
             ", ", hi, "] for ", ggml_type_name(type));
  QF_REQUIRE(at::isfinite(s).all().item<bool>(), "gguf: tensor '", name, "': a scale is NaN or inf");
  const int32_t* qp = q.data_ptr<int32_t>();
  const float* sp = s.data_ptr<float>();
  GgufTensor out;
  out.name = name, out.type = type, out.ne = ggml_shape(codes, name);
  if (type == GgmlType::kQ8_0) {
    std::vector<GgmlBlockQ8_0> y(rows * nb);
    for (int64_t b = 0; b < rows * nb; ++b) {
      y[b].d = to_fp16(sp[b]);
      for (int64_t j = 0; j < kGgmlBlock; ++j) y[b].qs[j] = static_cast<int8_t>(qp[b * kGgmlBlock + j]);
    }
    out.data = to_bytes(y);
  } else {
    std::vector<GgmlBlockQ4_0> y(rows * nb);
    for (int64_t b = 0; b < rows * nb; ++b) {
      y[b].d = to_fp16(sp[b]);
      const int32_t* v = qp + b * kGgmlBlock;
      for (int64_t j = 0; j < kGgmlBlock / 2; ++j)
        y[b].qs[j] = static_cast<uint8_t>((v[j] + 8) | ((v[j + kGgmlBlock / 2] + 8) << 4));
    }
    out.data = to_bytes(y);
  }
  return out;
}

namespace {

// Block b of a Q8_0 / Q4_0 tensor's bytes: its 32 codes into q, its scale returned (value = code * scale).
float decode_code_block(GgmlType type, const uint8_t* p, int64_t b, int8_t* q) {
  if (type == GgmlType::kQ8_0) {
    GgmlBlockQ8_0 blk;
    std::memcpy(&blk, p + b * sizeof(blk), sizeof(blk));
    std::memcpy(q, blk.qs, kGgmlBlock);
    return from_fp16(blk.d);
  }
  GgmlBlockQ4_0 blk;
  std::memcpy(&blk, p + b * sizeof(blk), sizeof(blk));
  for (int64_t j = 0; j < kGgmlBlock / 2; ++j) {
    q[j] = static_cast<int8_t>((blk.qs[j] & 0x0F) - 8);
    q[j + kGgmlBlock / 2] = static_cast<int8_t>((blk.qs[j] >> 4) - 8);
  }
  return from_fp16(blk.d);
}

}  // namespace

at::Tensor decode_gguf_tensor(const GgufTensor& t) {
  const uint64_t bytes = ggml_nbytes(t.type, t.ne, "gguf: tensor '" + t.name + "'");
  QF_REQUIRE(t.data.size() == bytes, "gguf: tensor '", t.name, "' holds ", t.data.size(), " bytes, expected ", bytes);
  std::vector<int64_t> shape(t.ne.rbegin(), t.ne.rend());
  at::Tensor out = at::empty(shape, at::kFloat);
  float* y = out.data_ptr<float>();
  const int64_t n = out.numel();
  const uint8_t* p = t.data.data();
  if (t.type == GgmlType::kF32) {
    std::memcpy(y, p, n * sizeof(float));
  } else if (t.type == GgmlType::kF16) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      y[i] = from_fp16(h);
    }
  } else if (t.type == GgmlType::kQ6_K) {
    decode_q6_k(p, n, y);
  } else if (t.type == GgmlType::kQ4_K) {
    decode_q4_k(p, n, y);
  } else {
    int8_t q[kGgmlBlock];
    for (int64_t b = 0; b < n / kGgmlBlock; ++b) {
      const float d = decode_code_block(t.type, p, b, q);
      for (int64_t j = 0; j < kGgmlBlock; ++j) y[b * kGgmlBlock + j] = static_cast<float>(q[j]) * d;
    }
  }
  return out;
}

void decode_gguf_codes(const GgufTensor& t, at::Tensor* codes, at::Tensor* scales) {
  QF_REQUIRE(t.type == GgmlType::kQ8_0 || t.type == GgmlType::kQ4_0, "gguf: tensor '", t.name, "' is ",
             ggml_type_name(t.type), ", not Q8_0 / Q4_0 codes");
  QF_REQUIRE(t.ne.size() == 2, "gguf: tensor '", t.name, "': codes are read from matrices, it has ", t.ne.size(),
             " dimensions");
  QF_REQUIRE(t.data.size() == ggml_nbytes(t.type, t.ne, "gguf: tensor '" + t.name + "'"), "gguf: tensor '", t.name,
             "' holds ", t.data.size(), " bytes, not its shape's");
  const auto rows = static_cast<int64_t>(t.ne[1]), nb = static_cast<int64_t>(t.ne[0]) / kGgmlBlock;
  *codes = at::empty({rows, nb * kGgmlBlock}, at::kChar);
  *scales = at::empty({rows, nb}, at::kFloat);
  int8_t* q = codes->data_ptr<int8_t>();
  float* d = scales->data_ptr<float>();
  const uint8_t* p = t.data.data();
  for (int64_t b = 0; b < rows * nb; ++b, q += kGgmlBlock) d[b] = decode_code_block(t.type, p, b, q);
}

}  // namespace qforge::io
