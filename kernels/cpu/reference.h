// Scalar reference kernels: they DEFINE the results of every CPU/oneDNN/CUDA kernel in qforge and
// are the oracles of tests/kernels. Plain loops, no SIMD, explicit float operation order (fmaf
// where docs/kernels.md says so). All matrices are dense row-major; W is [N, K] like torch Linear.
#pragma once

#include <cstdint>

namespace qforge::kernels {

// Granularity of the dynamic (run-time) activation scale.
enum class ActScale { kPerRow, kPerTensor };

// Largest magnitude of a dynamically quantized activation: symmetric int8 grid [-127, 127]
// (never -128, so AVX2's sign trick and the +128 offset of VNNI are both exact).
inline constexpr int kActQMax = 127;

// Dynamic symmetric int8 quantization of activations x[M, K] (ldx = K) onto [-qmax, qmax]
// (qmax 127; narrower grids' codes in int8 lanes: W4A4's qint4 rows take qmax 7), the row's range
// clipped to clip · amax (QuaRot's clipping; 1: the whole amax):
//   amax  = max |x| over the row (kPerRow) or the whole matrix (kPerTensor)
//   range = clip == 1 ? amax : amax * clip               (float product)
//   scale = range > 0 ? range / float(qmax) : 1.0f      (float division)
//   inv   = 1.0f / scale
//   q     = clamp(nearbyint(x * inv), -qmax, qmax)   (float product, round half to even)
// q is written to q[m * ldq + k]; columns [K, ldq) are set to 0. a_scale[m] receives scale.
// Throws qforge::Error when x holds NaN or Inf, qmax is outside [1, 127] or clip outside (0, 1].
void quantize_rows_s8_reference(const float* x, int64_t M, int64_t K, ActScale mode, int8_t* q,
                                int64_t ldq, float* a_scale, int qmax = kActQMax, float clip = 1.0f);

// Static symmetric int8 quantization with a calibrated scale (the fake-quant formula of a
// per-tensor symmetric input quantizer, zero point 0, as int8 codes):
//   q = clamp(nearbyint(x * inv), qmin, qmax)   (float product, round half to even)
// with inv = 1.0f / scale (at::reciprocal), -128 <= qmin <= qmax <= 127. Throws qforge::Error
// naming the first element that is NaN or Inf.
void quantize_static_s8_reference(const float* x, int64_t count, float inv, int qmin, int qmax, int8_t* q);

// C[m, n] = sum_k A[m, k] * W[n, k], exact int32 (sequential k).
void gemm_s8s8s32_reference(const int8_t* A, const int8_t* W, int32_t* C, int64_t M, int64_t N,
                            int64_t K);

// C[m, n] = sum_k (A[m, k] - a_zero_point) * W[n, k], exact int32.
void gemm_u8s8s32_reference(const uint8_t* A, int32_t a_zero_point, const int8_t* W, int32_t* C,
                            int64_t M, int64_t N, int64_t K);

// Dequantizing epilogue of the int8 GEMM:
//   y[m, n] = fmaf(float(acc[m, n]) * w_scale[n], a_scale[m], bias ? bias[n] : 0.0f)
// float(acc) rounds to nearest even; the product is rounded once, then one fused multiply-add.
// Per-tensor activation scale: pass a_scale with M equal entries.
void dequantize_s32_f32_reference(const int32_t* acc, const float* a_scale, const float* w_scale,
                                  const float* bias, float* y, int64_t M, int64_t N);

// Number of weight groups along K: ceil(K / group_size).
int64_t num_groups(int64_t K, int64_t group_size);

// int8 activations x int4 weights with per-group scales (and optional zero points), float out.
// W holds the int4 grid values one per byte ([-8, 7] for qint4, [0, 15] for quint4); groups are
// [g * group_size, min(K, (g + 1) * group_size)). w_scale and w_zero are [N, G], G = num_groups.
//   acc_g  = sum_{k in g} A[m, k] * (W[n, k] - z[n, g])            exact int32 (z = 0 if null)
//   t      = 0; for g = 0..G-1: t = fmaf(float(acc_g), w_scale[n, g], t)
//   y[m,n] = fmaf(t, a_scale[m], bias ? bias[n] : 0.0f)
// With G == 1 this equals dequantize_s32_f32_reference of the per-channel int8 case.
void gemm_s8s4f32_reference(const int8_t* A, const float* a_scale, const int8_t* W,
                            const float* w_scale, const int32_t* w_zero, int64_t group_size,
                            const float* bias, float* y, int64_t M, int64_t N, int64_t K);

// Weight-only int8 linear with float activations (no activation quantization):
//   t = 0; for k: t = fmaf(x[m, k], float(W[n, k]), t)      (sequential k)
//   y[m, n] = t * w_scale[n] + (bias ? bias[n] : 0.0f)        (product rounded, then added)
void linear_f32_s8_reference(const float* x, const int8_t* W, const float* w_scale,
                             const float* bias, float* y, int64_t M, int64_t N, int64_t K);

// Weight-only int4 linear with float activations, per-group scales and optional zero points:
//   t = 0; for g: { s = 0; for k in g: s = fmaf(x[m, k], float(W[n, k] - z[n, g]), s);
//                   t = fmaf(s, w_scale[n, g], t) }
//   y[m, n] = t + (bias ? bias[n] : 0.0f)
void linear_f32_s4_reference(const float* x, const int8_t* W, const float* w_scale,
                             const int32_t* w_zero, int64_t group_size, const float* bias, float* y,
                             int64_t M, int64_t N, int64_t K);

// Weight-only codebook (look-up-table, k-means) linear with float activations. idx [N, K] uint8,
// each < L = 2^bits (bits 2, 3 or 4); codebook [N, G, L] with G = K / group_size;
// W[n, k] = codebook[n, k / group_size, idx[n, k]]. With s = 4 stored bits (bits 3, 4) or 2
// (bits 2), P = 8 / s planes, block B = 16 * P and Kp = K rounded up to B (x and idx are 0 beyond
// K, whose group is the last one):
//   acc[a][l] = 0                                          (a < P, l < 16)
//   for block b, plane a, lane l:  k = b*B + a*16 + l;  acc[a][l] = fmaf(x[m, k], W[n, k], acc[a][l])
//   t[l] = acc[0][l]; for a = 1 .. P-1: t[l] = t[l] + acc[a][l]
//   for w = 8, 4, 2, 1: for l < w: t[l] = t[l] + t[l + w]
//   y[m, n] = bias ? t[0] + bias[n] : t[0]
// (the lanes and planes of the VPERMPS kernels, kernels/cpu/lut_linear.h). Throws qforge::Error
// for bits outside {2, 3, 4}, a group_size that does not divide K, or an index >= L.
void linear_f32_lut_reference(const float* x, int64_t M, const uint8_t* idx, const float* codebook,
                              int64_t N, int64_t K, int64_t group_size, int bits, const float* bias,
                              float* y);

// Block-32 dynamic activation quantization of the decode kernels (Q8_0-like: llama.cpp's
// activation side). Row m's K values are cut into Kb = ceil(K / 32) blocks of 32 (the last one
// padded with zeros); per block b:
//   amax = max |x| over the block;  step = amax / 127.0f (float division)
//   when 1.0f / step is finite:  d = step,  q = clamp(nearbyint(x * (1.0f / step)), -127, 127)
//                                (float product, ties to even)
//   otherwise (amax == 0, or amax < ~3.7e-37 where 1 / step overflows):  d = 0,  q = 0
//   s    = sum of the block's q (exact int32)
// q [M, ldq >= Kb * 32] (columns [K, ldq) set to 0), d [M, Kb], s [M, Kb]. Throws qforge::Error
// naming the first element that is NaN or Inf.
inline constexpr int64_t kQ8Block = 32;
// Kb: the number of 32-blocks of a row of K values, ceil(K / 32).
inline constexpr int64_t q8_block_count(int64_t K) { return (K + kQ8Block - 1) / kQ8Block; }
void quantize_rows_q8b32_reference(const float* x, int64_t M, int64_t K, int8_t* q, int64_t ldq, float* d,
                                   int32_t* s);

// Block-32 activations (quantize_rows_q8b32_reference) x int8 weights W [N, K] with per-channel
// scale, float out:
//   i_b = sum_{k in b} q[m, k] * W[n, k]                        exact int32
//   u = 0; for b = 0 .. Kb-1: u = fmaf(float(i_b), d[m, b], u)
//   y[m, n] = u * w_scale[n] + (bias ? bias[n] : 0.0f)           (product rounded, then added)
void linear_q8b32_s8_reference(const int8_t* q, const float* d, int64_t ldq, const int8_t* W, const float* w_scale,
                               const float* bias, float* y, int64_t M, int64_t N, int64_t K);

// Block-32 activations x 4-bit weights (grid values W [N, K], scales and optional zero points
// [N, G] as in linear_f32_s4_reference); group_size % 32 == 0 or a single group (else throws):
//   i_b = sum_{k in b} q[m, k] * (W[n, k] - z[n, g])            exact int32
//   t = 0; for g: { u = 0; for b in g: u = fmaf(float(i_b), d[m, b], u); t = fmaf(u, w_scale[n, g], t) }
//   y[m, n] = t + (bias ? bias[n] : 0.0f)
void linear_q8b32_s4_reference(const int8_t* q, const float* d, int64_t ldq, const int8_t* W, const float* w_scale,
                               const int32_t* w_zero, int64_t group_size, const float* bias, float* y, int64_t M,
                               int64_t N, int64_t K);

// Dense sub-byte packing, low bits first: value i lives in byte i / per_byte at bit
// (i % per_byte) * bits. Values are stored as two's complement bit fields (value & mask).
// Bytes needed: ceil(n / 2) for 4-bit, ceil(n / 4) for 2-bit; unused high fields are 0.
void pack_s4_reference(const int8_t* values, int64_t n, uint8_t* packed);    // values in [-8, 7]
void unpack_s4_reference(const uint8_t* packed, int64_t n, int8_t* values);  // sign-extends
void pack_u4_reference(const int8_t* values, int64_t n, uint8_t* packed);    // values in [0, 15]
void unpack_u4_reference(const uint8_t* packed, int64_t n, int8_t* values);  // zero-extends
void pack_s2_reference(const int8_t* values, int64_t n, uint8_t* packed);    // values in [-2, 1]
void unpack_s2_reference(const uint8_t* packed, int64_t n, int8_t* values);  // sign-extends
void pack_u2_reference(const int8_t* values, int64_t n, uint8_t* packed);    // values in [0, 3]
void unpack_u2_reference(const uint8_t* packed, int64_t n, int8_t* values);  // zero-extends

}  // namespace qforge::kernels
