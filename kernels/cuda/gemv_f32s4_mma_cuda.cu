// The int4 GEMV on tensor cores (see gemv_f32s4_mma_cuda.h for the formula and the bound).
// Roles are swapped for small M: the weight is mma's A (16 weight rows x 16 k), the activations
// its B (16 k x 8 columns), so a tile of 16 weight rows serves up to 4 (8, 16) rows of x held
// as hi and lo fp16 columns. A block of 8 warps owns 16 * kTiles weight rows; warp w takes the
// 128-wide k blocks w, w + 8, ...: lane (g, t) loads 16 bytes (32 codes) of rows g and g + 8 of
// every tile per block, up to kDepth blocks ahead of the one it computes (a ring of registers;
// mma_dispatch picks the depth). Each warp stages its own block of x (scaled, split, and
// permuted to the fragments' k order) in shared memory, or reads the call's staging, with one
// 16-byte load per 8-column block and code word, reused across its tiles.
#include "kernels/cuda/gemv_f32s4_mma_cuda.h"

#include <cuda_fp16.h>

#include <atomic>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv_s4_rules.h"

namespace qforge::cuda {
namespace {

constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMmaKb = 128;                 // k per warp step: 4 lanes x 32 codes
constexpr int kMmaRowHalves = kMmaKb + 32;  // staged row stride: 320 bytes, 64 mod 128 (no bank conflicts)
constexpr uint32_t kHalfMagic = 0x64006400u;  // fp16 1024 in both halves: 1024 + f for a nibble f in the mantissa
constexpr int kScaleExpTop = 14;              // a block's largest |x| is scaled into [2^14, 2^15)
constexpr int kMmaKnownDevices = 64;          // per-device facts remembered for devices 0..63

// Floats 2^e for the exponent range the kernel uses (normal numbers only).
__device__ __forceinline__ float mma_pow2(int e) { return __int_as_float((127 + e) << 23); }

// The exponent e that puts a block's largest |x| in [2^14, 2^15), clamped so 2^e and 2^-e are
// normal floats; 0 for a zero or non-finite block (non-finite values then reach y as they are).
__device__ __forceinline__ int mma_block_exponent(float amax) {
  if (!(amax > 0.0f) || !isfinite(amax)) return 0;
  const int e = kScaleExpTop - ilogbf(amax);
  return e < -113 ? -113 : (e > 100 ? 100 : e);
}

// (a & mask) | magic in one instruction.
__device__ __forceinline__ uint32_t mma_and_or(uint32_t a, uint32_t mask, uint32_t magic) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(mask), "r"(magic));
  return r;
}

// Two nibbles 2s and 2s + 4 of w as the fp16 pair (f - off, f' - off): 1024 + f from the magic
// exponent (q = w >> 8s, nibbles 0 and 4 of q), minus 1024 + off (sub2): exact, so is the difference.
__device__ __forceinline__ uint32_t mma_dequant_even(uint32_t q, uint32_t sub2) {
  uint32_t r;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(mma_and_or(q, 0x000F000Fu, kHalfMagic)), "r"(sub2));
  return r;
}

// Nibbles 2s + 1 and 2s + 5: masked in place they give 1024 + 16 f, and (1024 + 16 f) / 16 -
// (64 + off) = f - off in one fma (fma2 holds -(64 + off)); every value is an integer below
// 2048, so the fma is exact and the pair equals the even form's for the same nibbles.
__device__ __forceinline__ uint32_t mma_dequant_odd(uint32_t q, uint32_t fma2) {
  constexpr uint32_t kSixteenth2 = 0x2C002C00u;  // fp16 1/16 in both halves
  uint32_t r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(mma_and_or(q, 0x00F000F0u, kHalfMagic)), "r"(kSixteenth2),
      "r"(fma2));
  return r;
}

// -(64 + off) from 1024 + off: 960 - (1024 + off), exact.
__device__ __forceinline__ uint32_t mma_fma_offset(uint32_t sub2) {
  constexpr uint32_t k960x2 = 0x63806380u;  // fp16 960 in both halves
  uint32_t r;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(k960x2), "r"(sub2));
  return r;
}

// (1024 + off) as fp16 in both halves of a word.
__device__ __forceinline__ uint32_t mma_offset_pair(int off) {
  const uint32_t h = __half_as_ushort(__float2half_rn(static_cast<float>(1024 + off)));
  return h | (h << 16);
}

__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

struct MmaArgs {
  const float* x;
  int M;
  const uint4* codes;  // 16-byte words: row n starts at word n * (K / 32) (tiled: s4_tiled_index)
  int N, K;
  const float* scale;
  const int32_t* zero;
  int G;                                // scale groups per row
  int group_blocks, group_blocks_log2;  // group_size / 128, its log2 (-1 when not a power of 2)
  const float* bias;
  float* y;
  const uint4* xf;    // staged x (gemv_f32s4_mma_staged_cuda): B fragments, see mma_stage_x_kernel
  const float* xinv;  // staged x: 2^-e per (128-wide block, padded row of x)
};

// What lane (g, t) reads of one 128-wide block: 32 codes of rows g and g + 8 of each tile, with
// the rows' scale and the fp16 offset (1024 + zero point [+ 8 for qint4]).
// With kXR > 0 (the unstaged kernel for M <= kXR) it also carries the lane's float4 of each row
// of x of the block, so that x arrives with the codes rather than by a load issued per step.
template <int kTiles, int kXR = 0>
struct MmaStep {
  uint4 w[kTiles][2];
  float s[kTiles][2];
  uint32_t off[kTiles][2];
  float4 x[kXR > 0 ? kXR : 1];
};

// The lane's 4 floats of row m of 128-wide block kb of x.
__device__ __forceinline__ float4 mma_load_x(const MmaArgs& a, int m, int kb, int lane) {
  return __ldg(reinterpret_cast<const float4*>(a.x + int64_t{m} * a.K + kb * kMmaKb) + lane);
}

// kTiled: the codes are in the tiled layout (s4_tiled_index, unpack_s4_math.h): the 16 bytes of
// lane (g, t) for rows g + 8h of a tile sit at word 64 (tile * K / 128 + kb) + 32h + lane.
template <int kTiles, bool kSigned, int kXR, bool kTiled = false>
__device__ __forceinline__ void mma_load_step(MmaStep<kTiles, kXR>& st, const MmaArgs& a, int n0, int kb, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int m = 0; m < kXR; ++m)
    if (m < a.M) st.x[m] = mma_load_x(a, m, kb, lane);
  const int gi = a.group_blocks_log2 >= 0 ? kb >> a.group_blocks_log2 : kb / a.group_blocks;
  const int64_t row_words = a.K / 32;
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int n = n0 + 16 * tile + g + 8 * h;
      n = n < a.N ? n : a.N - 1;  // rows past N read row N - 1 (tiled: the last tile) and are not written
      if constexpr (kTiled) {
        // Tiles past the last (a 32-row block over an odd tile count) read the last tile.
        const int t_idx = min(n0 / 16 + tile, (a.N - 1) / 16);
        st.w[tile][h] = __ldcs(a.codes + ((int64_t{t_idx} * (a.K / kMmaKb) + kb) * 64 + h * 32 + lane));
      } else {
        st.w[tile][h] = __ldcs(a.codes + n * row_words + kb * 4 + t);
      }
      const int64_t si = int64_t{n} * a.G + gi;
      st.s[tile][h] = __ldg(a.scale + si);
      st.off[tile][h] = a.zero != nullptr ? mma_offset_pair((kSigned ? 8 : 0) + __ldg(a.zero + si))
                                          : mma_offset_pair(kSigned ? 8 : 0);
    }
}

// Row m of block kb of x, scaled by the block's 2^e and split: lane's 16 bytes of the hi (even
// lanes) or lo (odd lanes) staged row, at halves slot .. slot + 7 of it; *e gets the exponent.
// In a row, the codes k = 32t + 8i + j of lane (g, t)'s word i sit at 32i + 8t + perm(j), perm =
// (0, 2, 4, 6, 1, 3, 5, 7): one 16-byte load gives the B fragments of both mma steps of word i
// (pairs (j, j + 4), see mma_tiles). slot = 32i + 8t with i = (lane % 8) / 2, t = lane / 8.
// v: the lane's float4 of the row (mma_load_x).
__device__ __forceinline__ uint4 mma_split_row(const float4 v, int lane, int* e_out) {
  const bool even = (lane & 1) == 0;  // even: k offsets 0..3 of the word, odd: 4..7
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  const int e = mma_block_exponent(amax);
  const float up = mma_pow2(e);
  const float f[4] = {__fmul_rn(v.x, up), __fmul_rn(v.y, up), __fmul_rn(v.z, up), __fmul_rn(v.w, up)};
  uint32_t hi[2], lo[2];
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    const __half h0 = __float2half_rn(f[2 * p]), h1 = __float2half_rn(f[2 * p + 1]);
    const __half l0 = __float2half_rn(__fsub_rn(f[2 * p], __half2float(h0)));
    const __half l1 = __float2half_rn(__fsub_rn(f[2 * p + 1], __half2float(h1)));
    hi[p] = __half_as_ushort(h0) | (uint32_t{__half_as_ushort(h1)} << 16);
    lo[p] = __half_as_ushort(l0) | (uint32_t{__half_as_ushort(l1)} << 16);
  }
  // The even lane takes the hi slot (its x0..x3 with the odd lane's x4..x7), the odd lane the lo slot.
  uint32_t got[2];
#pragma unroll
  for (int p = 0; p < 2; ++p) got[p] = __shfl_xor_sync(0xFFFFFFFFu, even ? lo[p] : hi[p], 1);
  const uint32_t* mine = even ? hi : lo;
  const uint32_t e0 = even ? mine[0] : got[0], e1 = even ? mine[1] : got[1];  // offsets 0..3
  const uint32_t o0 = even ? got[0] : mine[0], o1 = even ? got[1] : mine[1];  // offsets 4..7
  uint4 out;
  out.x = (e0 & 0xFFFFu) | (o0 << 16);      // (x0, x4)
  out.y = (e0 >> 16) | (o0 & 0xFFFF0000u);  // (x1, x5)
  out.z = (e1 & 0xFFFFu) | (o1 << 16);      // (x2, x6)
  out.w = (e1 >> 16) | (o1 & 0xFFFF0000u);  // (x3, x7)
  *e_out = e;
  return out;
}

__device__ __forceinline__ int mma_split_slot(int lane) { return 32 * ((lane & 7) >> 1) + 8 * (lane >> 3); }

// Stages block kb of x for one warp: row m's hi at staged row m, lo at row kMP + m; inv[m] = 2^-e.
// Rows come from the step (kXR > 0: st_x holds rows 0..M-1) or are loaded here.
template <int kMP, int kXR>
__device__ __forceinline__ void mma_stage_x(const MmaArgs& a, int kb, int lane, __half* xs, float* inv,
                                            const float4* st_x) {
  constexpr int kRowsHeld = kXR > 0 ? (kXR < kMP ? kXR : kMP) : kMP;
#pragma unroll
  for (int m = 0; m < kRowsHeld; ++m) {
    if (m >= a.M) break;
    int e = 0;
    const uint4 out = mma_split_row(kXR > 0 ? st_x[m] : mma_load_x(a, m, kb, lane), lane, &e);
    *reinterpret_cast<uint4*>(xs + ((lane & 1) == 0 ? m : kMP + m) * kMmaRowHalves + mma_split_slot(lane)) = out;
    if (lane == 0) inv[m] = mma_pow2(-e);
  }
}

// Stages all of x once per call for gemv_f32s4_mma_staged_cuda, warp m of block kb doing row m
// of it: the 16 bytes lane (g, t) of a warp loads in mma_tiles for (block kb, word i, column
// block nb) sit at xf[((kb * 4 + i) * kNB + nb) * 32 + lane] (512 contiguous bytes a load), and
// inv[kb * kMP + m] = 2^-e. Rows past M are zero with factor 1.
template <int kMP>
__global__ void __launch_bounds__(32 * kMP) mma_stage_x_kernel(const MmaArgs a, uint4* xf, float* inv) {
  constexpr int kNB = kMP / 4;
  const int lane = threadIdx.x & 31, m = threadIdx.x >> 5, kb = blockIdx.x;
  int e = 0;
  const uint4 out = m < a.M ? mma_split_row(mma_load_x(a, m, kb, lane), lane, &e) : make_uint4(0, 0, 0, 0);
  const int r = (lane & 1) == 0 ? m : kMP + m, slot = mma_split_slot(lane);
  const int i = slot / 32, t = (slot % 32) / 8;
  xf[((int64_t{kb} * 4 + i) * kNB + r / 8) * 32 + (r % 8) * 4 + t] = out;
  if (lane == 0) inv[int64_t{kb} * kMP + m] = mma_pow2(-e);
}

// Word i of a 16-byte load (i a compile-time constant after unrolling).
__device__ __forceinline__ uint32_t mma_word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// The mma chains of the step's tiles over one 128-wide block. k order: lane t's logical k (2t,
// 2t + 1, 2t + 8, 2t + 9) of step (i, s) are its codes 8i + (2s, 2s + 4, 2s + 1, 2s + 5) of the
// block (32t + ...), the same for A (weight rows g, g + 8) and B (staged columns g), so each
// column sums every code of the block exactly once. qint4: q = (f ^ 8) - 8, so q - z = (f ^ 8) -
// (8 + z). B of (word i, column block nb) is b[i][nb] (MmaB), used by every tile; each tile's
// chain runs in the same order whatever kTiles.
template <int kTiles, int kNB, bool kSigned, int kXR>
__device__ __forceinline__ void mma_tiles(float (&c)[kTiles][kNB][4], const MmaStep<kTiles, kXR>& st,
                                          const uint4 (&b)[4][kNB]) {
  constexpr uint32_t kFlip = kSigned ? 0x88888888u : 0u;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile) {
      const uint32_t w0 = mma_word(st.w[tile][0], i) ^ kFlip, w1 = mma_word(st.w[tile][1], i) ^ kFlip;
      const uint32_t(&off)[2] = st.off[tile];
      const uint32_t fma0 = mma_fma_offset(off[0]), fma1 = mma_fma_offset(off[1]);
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        // Nibble pairs (2s, 2s + 4) and (2s + 1, 2s + 5) of each word.
        const uint32_t q0 = s == 0 ? w0 : w0 >> 8, q1 = s == 0 ? w1 : w1 >> 8;
        const uint32_t a0 = mma_dequant_even(q0, off[0]), a1 = mma_dequant_even(q1, off[1]);
        const uint32_t a2 = mma_dequant_odd(q0, fma0), a3 = mma_dequant_odd(q1, fma1);
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb)
          mma_16816(c[tile][nb], a0, a1, a2, a3, s == 0 ? b[i][nb].x : b[i][nb].z, s == 0 ? b[i][nb].y : b[i][nb].w);
      }
    }
  }
}

// The B side of one warp step: the fragments of every word i and column block nb, and the
// columns' factors 2^-e (inv[nb][j]: column 8nb + 2t + j).
template <int kNB>
struct MmaB {
  uint4 b[4][kNB];
  float inv[kNB][2];
};

// Block kb's B from the call's staging (kStaged: 16 coalesced bytes a lane per word and column
// block) or from the warp's staged block in shared memory (xs / inv, after mma_stage_x).
template <int kMP, bool kStaged>
__device__ __forceinline__ void mma_load_b(MmaB<2 * kMP / 8>& B, const MmaArgs& a, int kb, int lane, const __half* xs,
                                           const float* inv) {
  constexpr int kNB = 2 * kMP / 8;
  const int g = lane >> 2, t = lane & 3;
  const float* kb_inv = kStaged ? a.xinv + int64_t{kb} * kMP : inv;
  const uint4* b_src = kStaged ? a.xf + int64_t{kb} * 4 * kNB * 32 + lane
                               : reinterpret_cast<const uint4*>(xs + g * kMmaRowHalves + 8 * t);
  const int i_stride = kStaged ? kNB * 32 : 4, nb_stride = kStaged ? 32 : kMmaRowHalves;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
      const uint4* src = b_src + i * i_stride + nb * nb_stride;
      B.b[i][nb] = kStaged ? __ldg(src) : *src;
    }
#pragma unroll
  for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
    for (int j = 0; j < 2; ++j) B.inv[nb][j] = kb_inv[(8 * nb + 2 * t + j) % kMP];
}

// One warp step: the codes of st times B, each block sum scaled by 2^-e and s into acc.
template <int kMP, int kTiles, bool kSigned, int kXR>
__device__ __forceinline__ void mma_step(float (&acc)[kTiles][2 * kMP / 8][4], const MmaStep<kTiles, kXR>& st,
                                         const MmaB<2 * kMP / 8>& B) {
  constexpr int kNB = 2 * kMP / 8;
  float c[kTiles][kNB][4];
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) c[tile][nb][0] = c[tile][nb][1] = c[tile][nb][2] = c[tile][nb][3] = 0.0f;
  mma_tiles<kTiles, kNB, kSigned, kXR>(c, st, B.b);
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        acc[tile][nb][r] =
            __fmaf_rn(__fmul_rn(c[tile][nb][r], B.inv[nb][r & 1]), st.s[tile][r >> 1], acc[tile][nb][r]);
}

// Blocks per SM the register budget is sized for: 4 (64 registers) for the smallest kernel, 1
// for the widest (its accumulators alone take 64), 2 otherwise; rows of x in the ring (xr, four
// registers a row and step) count like codes.
constexpr int mma_min_blocks(int mp, int tiles, int depth, int xr = 0) {
  return mp * tiles >= 32 ? 1 : (mp * tiles * depth + xr * depth <= 8 ? 4 : 2);
}

// kMP rows of x (padded: 4, 8 or 16) as 2 * kMP staged columns (hi, then lo): kNB = kMP / 4
// column blocks of 8. Accumulator c of column block nb: c[0..1] weight row g, columns
// 8nb + 2t + (0, 1); c[2..3] row g + 8.
// kStaged: x was staged once per call by mma_stage_x_kernel (a.xf, a.xinv) and B is read from
// there; otherwise each warp stages its blocks of x in shared memory.
// kDepth: steps whose codes are in flight per warp (a ring of registers refilled as each step
// is consumed), so a warp keeps kDepth 16-byte loads a lane outstanding rather than one.
// kXR (unstaged only, M <= kXR): the ring also carries the steps' rows of x (MmaStep).
template <int kMP, int kTiles, int kDepth, bool kSigned, bool kStaged, int kXR = 0, bool kTiled = false>
__global__ void __launch_bounds__(kMmaThreads, mma_min_blocks(kMP, kTiles, kDepth, kXR))
    gemv_f32s4_mma_kernel(const MmaArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kCols = 2 * kMP;
  constexpr int kNB = kCols / 8;
  constexpr int kRowsPerBlock = 16 * kTiles;
  extern __shared__ uint4 mma_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  __half* xs = reinterpret_cast<__half*>(mma_smem) + warp * kCols * kMmaRowHalves;
  float* inv = reinterpret_cast<float*>(reinterpret_cast<__half*>(mma_smem) + kMmaWarps * kCols * kMmaRowHalves) +
               warp * kMP;
  if (!kStaged) {
    // Padding columns (rows of x past M) stay zero; their factors stay 1.
    for (int i = lane; i < kCols * kMmaRowHalves / 8; i += 32)
      reinterpret_cast<uint4*>(xs)[i] = make_uint4(0, 0, 0, 0);
    if (lane < kMP) inv[lane] = 1.0f;
    __syncwarp();
  }

  const int n0 = blockIdx.x * kRowsPerBlock;
  const int KB = a.K / kMmaKb;
  float acc[kTiles][kNB][4];
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[tile][nb][r] = 0.0f;

  static_assert(kXR == 0 || !kStaged, "the staged kernel reads x from its staging");
  MmaStep<kTiles, kXR> ring[kDepth];
#pragma unroll
  for (int d = 0; d < kDepth; ++d)
    if (warp + d * kMmaWarps < KB)
      mma_load_step<kTiles, kSigned, kXR, kTiled>(ring[d], a, n0, warp + d * kMmaWarps, lane);
  for (int kb0 = warp; kb0 < KB; kb0 += kDepth * kMmaWarps) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int kb = kb0 + d * kMmaWarps;
      if (kb >= KB) break;
      if (!kStaged) {
        mma_stage_x<kMP, kXR>(a, kb, lane, xs, inv, ring[d].x);
        __syncwarp();
      }
      MmaB<kNB> b;
      mma_load_b<kMP, kStaged>(b, a, kb, lane, xs, inv);
      mma_step<kMP, kTiles, kSigned, kXR>(acc, ring[d], b);
      if (!kStaged) __syncwarp();  // every lane has read the staged block before the next one overwrites it
      if (kb + kDepth * kMmaWarps < KB)
        mma_load_step<kTiles, kSigned, kXR, kTiled>(ring[d], a, n0, kb + kDepth * kMmaWarps, lane);
    }
  }

  // Fixed-order reduction: part[warp][column][row], then per output hi + lo over warps 0..7.
  __syncthreads();
  float* part = reinterpret_cast<float*>(mma_smem);
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int col = 8 * nb + 2 * t + (r & 1), row = 16 * tile + g + 8 * (r >> 1);
        part[(warp * kCols + col) * kRowsPerBlock + row] = acc[tile][nb][r];
      }
  __syncthreads();
  for (int i = threadIdx.x; i < a.M * kRowsPerBlock; i += kMmaThreads) {
    const int m = i / kRowsPerBlock, row = i % kRowsPerBlock, n = n0 + row;
    if (n >= a.N) continue;
    float hi = part[m * kRowsPerBlock + row], lo = part[(kMP + m) * kRowsPerBlock + row];
#pragma unroll
    for (int w = 1; w < kMmaWarps; ++w) {
      hi = __fadd_rn(hi, part[(w * kCols + m) * kRowsPerBlock + row]);
      lo = __fadd_rn(lo, part[(w * kCols + kMP + m) * kRowsPerBlock + row]);
    }
    float v = __fadd_rn(hi, lo);
    if (a.bias != nullptr) v = __fadd_rn(v, __ldg(a.bias + n));
    a.y[int64_t{m} * a.N + n] = v;
  }
#else
  __trap();  // never launched: gemv_f32s4_mma_runs_here refuses builds without sm_80 code
#endif
}

template <int kMP, int kTiles, bool kStaged>
constexpr size_t mma_smem_bytes() {
  constexpr size_t reduction = size_t{kMmaWarps} * 2 * kMP * 16 * kTiles * 4;
  constexpr size_t staging = size_t{kMmaWarps} * (2 * kMP * kMmaRowHalves * 2 + kMP * 4);
  static_assert(kStaged || reduction <= staging, "the reduction reuses the staging memory");
  return kStaged ? reduction : staging;
}

template <int kMP, int kTiles, int kDepth, bool kStaged, int kXR = 0, bool kTiled = false>
void mma_launch(bool is_signed, cudaStream_t stream, const MmaArgs& a) {
  // The ring holds kXR rows of x: more would leave rows unstaged.
  QF_REQUIRE(kXR == 0 || a.M <= kXR, "kernels/cuda: gemv_f32s4_mma: M=", a.M, " above the ", kXR,
             " rows of x the ring carries");
  const auto kernel = is_signed ? gemv_f32s4_mma_kernel<kMP, kTiles, kDepth, true, kStaged, kXR, kTiled>
                                : gemv_f32s4_mma_kernel<kMP, kTiles, kDepth, false, kStaged, kXR, kTiled>;
  constexpr size_t bytes = mma_smem_bytes<kMP, kTiles, kStaged>();
  if constexpr (bytes > 48 * 1024) {
    // Above 48 KiB a kernel must opt in, once per device and kernel.
    static std::atomic<bool> opted_in[2][kMmaKnownDevices];  // static storage: all false
    int dev = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    std::atomic<bool>* done = dev >= 0 && dev < kMmaKnownDevices ? &opted_in[is_signed ? 1 : 0][dev] : nullptr;
    if (done == nullptr || !done->load(std::memory_order_relaxed)) {
      check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                 "cudaFuncSetAttribute");
      if (done != nullptr) done->store(true, std::memory_order_relaxed);
    }
  }
  const auto blocks = static_cast<unsigned>((a.N + 16 * kTiles - 1) / (16 * kTiles));
  kernel<<<blocks, kMmaThreads, bytes, stream>>>(a);
}

// Rows of x padded to the kernel's column count: 4, 8 or 16.
int64_t mma_padded_m(int64_t M) { return M <= 4 ? 4 : (M <= 8 ? 8 : 16); }

// log2(v) for a power of two v > 0, else -1.
int mma_log2_or_minus1(int64_t v) { return v > 0 && (v & (v - 1)) == 0 ? __builtin_ctzll(v) : -1; }

// The shared checks of both entry points; the kernel arguments on success.
MmaArgs mma_checked_args(const char* name, const float* x, int64_t M, const uint8_t* packed, int64_t N, int64_t K,
                         const float* scale, const int32_t* zero, int64_t group_size, const float* bias, float* y) {
  std::string why;
  QF_REQUIRE(gemv_f32s4_mma_supported(M, K, group_size, &why), "kernels/cuda: ", name, ": ", why);
  QF_REQUIRE(gemv_f32s4_mma_pointers_supported(x, packed, &why), "kernels/cuda: ", name, ": ", why);
  QF_REQUIRE(N >= 0 && N <= INT32_MAX && K <= INT32_MAX, "kernels/cuda: ", name, ": N=", N, " K=", K,
             " beyond 32-bit indices");
  QF_REQUIRE(gemv_f32s4_mma_runs_here(&why), "kernels/cuda: ", name, ": ", why);
  return MmaArgs{x,
                 static_cast<int>(M),
                 reinterpret_cast<const uint4*>(packed),
                 static_cast<int>(N),
                 static_cast<int>(K),
                 scale,
                 zero,
                 static_cast<int>((K + group_size - 1) / group_size),
                 static_cast<int>(group_size / kMmaKb),
                 mma_log2_or_minus1(group_size / kMmaKb),
                 bias,
                 y,
                 nullptr,
                 nullptr};
}

// Multiprocessors of the current device (asked once per device).
int mma_sm_count() {
  static std::atomic<int> counts[kMmaKnownDevices];  // static storage: all 0 (not asked yet)
  int dev = 0, n = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev >= 0 && dev < kMmaKnownDevices && (n = counts[dev].load(std::memory_order_relaxed)) > 0) return n;
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  if (dev >= 0 && dev < kMmaKnownDevices) counts[dev].store(n, std::memory_order_relaxed);
  return n;
}

// Tiles and ring depth per padded M, from the H200 sweeps of 2026-11-26 (docs/performance.md): one
// tile everywhere for the staged kernel; at M <= 4 four steps in flight while the grid fits in
// two blocks per SM (4096 rows: 256 blocks) and two, at 64 registers and four resident blocks,
// for larger grids (14336 rows); four at M <= 8 and two at M <= 16. Unstaged keeps its earlier
// shapes except at M = 1 (below). Each depth is a one-run median, several within the run-to-run spread (~6 %), so the
// choices are provisional. Unstaged at M = 1 with the grid in two blocks per SM: x carried in the
// ring (kXR = 1; H200 sweep of 2026-11-28: 1 x 4096 x 4096 0.0071-0.0072 ms against 0.0076 ms for
// the ring without x, whose 64-register budget keeps four blocks per SM for larger grids).
// Every choice gives the same bits (the tile and step order of each output is fixed).
template <bool kStaged, bool kTiled>
void mma_dispatch(bool is_signed, cudaStream_t stream, const MmaArgs& a) {
  if (a.M <= 4) {
    const bool fits_two_per_sm = (a.N + 15) / 16 <= 2 * int64_t{mma_sm_count()};
    if constexpr (kStaged) {
      if (fits_two_per_sm) return mma_launch<4, 1, 4, true, 0, kTiled>(is_signed, stream, a);
    } else {
      if (a.M == 1 && fits_two_per_sm) return mma_launch<4, 1, 2, false, 1, kTiled>(is_signed, stream, a);
    }
    mma_launch<4, 1, 2, kStaged, 0, kTiled>(is_signed, stream, a);
  } else if (a.M <= 8) {
    mma_launch<8, kStaged ? 1 : 2, kStaged ? 4 : 2, kStaged, 0, kTiled>(is_signed, stream, a);
  } else {
    mma_launch<16, 1, 2, kStaged, 0, kTiled>(is_signed, stream, a);
  }
}

}  // namespace

bool gemv_f32s4_mma_runs_here(std::string* why) {
  int dev = 0, major = 0, minor = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  // A yes is remembered per device (the question is asked on every call); a no is asked again.
  static std::atomic<bool> runs[kMmaKnownDevices];  // static storage: all false
  if (dev >= 0 && dev < kMmaKnownDevices && runs[dev].load(std::memory_order_relaxed)) {
    if (why != nullptr) why->clear();
    return true;
  }
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cudaDeviceGetAttribute");
  if (major < 8) {
    if (why != nullptr) *why = "sm_" + std::to_string(major * 10 + minor) + " has no mma.sync m16n8k16 (sm_80+)";
    return false;
  }
  cudaFuncAttributes attr{};
  check_cuda(cudaFuncGetAttributes(&attr, gemv_f32s4_mma_kernel<4, 1, 2, true, false>), "cudaFuncGetAttributes");
  if (attr.binaryVersion < 80 && attr.ptxVersion < 80) {
    if (why != nullptr) *why = "built without sm_80+ code (CMAKE_CUDA_ARCHITECTURES)";
    return false;
  }
  if (dev >= 0 && dev < kMmaKnownDevices) runs[dev].store(true, std::memory_order_relaxed);
  if (why != nullptr) why->clear();
  return true;
}

void gemv_f32s4_mma_cuda(const float* x, int64_t M, const uint8_t* packed, int64_t N, int64_t K, bool is_signed,
                         const float* scale, const int32_t* zero, int64_t group_size, const float* bias, float* y,
                         cudaStream_t stream, bool tiled) {
  const MmaArgs args = mma_checked_args("gemv_f32s4_mma_cuda", x, M, packed, N, K, scale, zero, group_size, bias, y);
  if (N == 0) return;
  if (tiled) {
    mma_dispatch<false, true>(is_signed, stream, args);
  } else {
    mma_dispatch<false, false>(is_signed, stream, args);
  }
  check_cuda(cudaGetLastError(), "gemv_f32s4_mma_cuda launch");
}

size_t gemv_f32s4_mma_staged_workspace_bytes(int64_t M, int64_t K) {
  const int64_t blocks = K / kMmaKb, mp = mma_padded_m(M);
  return static_cast<size_t>(blocks * mp * (kMmaKb * 2 * 2 + 4));  // hi + lo fp16 per code, one float factor
}

void gemv_f32s4_mma_staged_cuda(const float* x, int64_t M, const uint8_t* packed, int64_t N, int64_t K,
                                bool is_signed, const float* scale, const int32_t* zero, int64_t group_size,
                                const float* bias, float* y, void* workspace, cudaStream_t stream, bool tiled) {
  MmaArgs args = mma_checked_args("gemv_f32s4_mma_staged_cuda", x, M, packed, N, K, scale, zero, group_size, bias, y);
  QF_REQUIRE(workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 16 == 0,
             "kernels/cuda: gemv_f32s4_mma_staged_cuda: workspace pointer null or not 16-byte aligned");
  if (N == 0) return;
  const int64_t blocks = K / kMmaKb, mp = mma_padded_m(M);
  auto* xf = static_cast<uint4*>(workspace);
  auto* inv = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + blocks * mp * kMmaKb * 2 * 2);
  const auto grid = static_cast<unsigned>(blocks);
  if (mp == 4) {
    mma_stage_x_kernel<4><<<grid, 32 * 4, 0, stream>>>(args, xf, inv);
  } else if (mp == 8) {
    mma_stage_x_kernel<8><<<grid, 32 * 8, 0, stream>>>(args, xf, inv);
  } else {
    mma_stage_x_kernel<16><<<grid, 32 * 16, 0, stream>>>(args, xf, inv);
  }
  check_cuda(cudaGetLastError(), "gemv_f32s4_mma_staged_cuda staging launch");
  args.xf = xf;
  args.xinv = inv;
  if (tiled) {
    mma_dispatch<true, true>(is_signed, stream, args);
  } else {
    mma_dispatch<true, false>(is_signed, stream, args);
  }
  check_cuda(cudaGetLastError(), "gemv_f32s4_mma_staged_cuda launch");
}

}  // namespace qforge::cuda
