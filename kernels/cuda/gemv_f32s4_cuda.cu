// The int4 weight-only GEMV on the GPU (see gemv_f32s4_cuda.h for the formula and the bound).
// A block of kWarps warps owns kRows weight rows; each lane reads 1, 2 or 4 consecutive 32-bit
// words (eight nibbles each) of every row per step, the activations' floats of the step once
// (float4) for all kRows rows, and the next step's codes while computing this one.
#include "kernels/cuda/gemv_f32s4_cuda.h"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv_loads.cuh"
#include "kernels/cuda/gemv_s4_rules.h"

namespace qforge::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRows = 4;
constexpr int kWordK = 8;             // nibbles per 32-bit word
constexpr float kTwo23 = 8388608.0f;  // 2^23: its float has unit spacing

// float(f) - offset for the nibble j of w: 2^23 + f (f < 16) is the float with f in its low
// mantissa bits, and offset = 2^23 + (8 + z) or 2^23 + z, so the difference is the exact integer.
__device__ __forceinline__ float code_minus_zero(uint32_t w, int j, float offset) {
  return __fsub_rn(__uint_as_float(0x4B000000u | ((w >> (4 * j)) & 0xFu)), offset);
}

// What one lane reads for one step: kWords words of each of the block's rows, with their group's
// scale and zero point (a lane's 8 * kWords codes lie in one group).
template <int kWords>
struct Step {
  uint32_t w[kRows][kWords];
  float s[kRows];
  int z[kRows];
};

template <int kWords>
__device__ __forceinline__ void load_step(Step<kWords>& st, const uint32_t* __restrict__ words, int64_t row_words,
                                          const float* __restrict__ scale, const int32_t* __restrict__ zero, int n0,
                                          int N, int k0, int group_size, int G) {
  const int g = k0 / group_size;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int n = n0 + r < N ? n0 + r : N - 1;  // rows past N read row N - 1 and are not written
    gemv::load_words<kWords>(words + n * row_words + k0 / kWordK, st.w[r]);
    const int64_t gi = int64_t{n} * G + g;
    st.s[r] = __ldg(scale + gi);
    st.z[r] = zero != nullptr ? __ldg(zero + gi) : 0;
  }
}

struct Args {
  const float* x;
  int M;
  const uint32_t* words;
  int N, K;
  const float* scale;
  const int32_t* zero;
  int group_size, G;
  const float* bias;
  float* y;
};

constexpr int kGemvThreads = kWarps * 32;

// Block b owns rows [kRows * b, kRows * b + kRows); lane l of warp w takes the codes at
// k0 = (step * kWarps + w) * 32 * kLaneK + kLaneK * l of each row (a warp reads 128 * kWords
// contiguous bytes per row and step: coalesced; the block's warps split K), and loads the next
// step's codes before computing the current one. Lanes, then warps, are added at the end.
template <int MT, int kWords, bool kSigned>
__global__ void __launch_bounds__(kGemvThreads) gemv_f32s4_kernel(const Args a) {
  constexpr int kLaneK = kWordK * kWords;
  constexpr int kBlockK = kWarps * 32 * kLaneK;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int n0 = blockIdx.x * kRows;
  const int64_t row_words = a.K / kWordK;
  float acc[MT][kRows];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[m][r] = 0.0f;

  int k0 = (warp * 32 + lane) * kLaneK;
  Step<kWords> cur;
  if (k0 < a.K) load_step(cur, a.words, row_words, a.scale, a.zero, n0, a.N, k0, a.group_size, a.G);
  for (; k0 < a.K; k0 += kBlockK) {
    Step<kWords> next;
    if (k0 + kBlockK < a.K)
      load_step(next, a.words, row_words, a.scale, a.zero, n0, a.N, k0 + kBlockK, a.group_size, a.G);
    float xv[MT][kLaneK];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int i = 0; i < kLaneK / 4; ++i) {
        const float4 v = m < a.M ? __ldg(reinterpret_cast<const float4*>(a.x + int64_t{m} * a.K + k0) + i) : float4{};
        xv[m][4 * i] = v.x, xv[m][4 * i + 1] = v.y, xv[m][4 * i + 2] = v.z, xv[m][4 * i + 3] = v.w;
      }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      // qint4: q = (f ^ 8) - 8, so q - z = (f ^ 8) - (8 + z); quint4: q - z = f - z.
      const float offset = __fadd_rn(kTwo23, static_cast<float>(kSigned ? 8 + cur.z[r] : cur.z[r]));
      float t[MT];
#pragma unroll
      for (int m = 0; m < MT; ++m) t[m] = 0.0f;
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        const uint32_t wf = kSigned ? (cur.w[r][i] ^ 0x88888888u) : cur.w[r][i];
#pragma unroll
        for (int j = 0; j < kWordK; ++j) {
          const float v = code_minus_zero(wf, j, offset);
#pragma unroll
          for (int m = 0; m < MT; ++m) t[m] = __fmaf_rn(xv[m][kWordK * i + j], v, t[m]);
        }
      }
#pragma unroll
      for (int m = 0; m < MT; ++m) acc[m][r] = __fmaf_rn(t[m], cur.s[r], acc[m][r]);
    }
    cur = next;
  }

  __shared__ float part[kWarps][MT][kRows];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float v = acc[m][r];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
      if (lane == 0) part[warp][m][r] = v;
    }
  __syncthreads();
  for (int t = threadIdx.x; t < MT * kRows; t += blockDim.x) {
    const int m = t / kRows, r = t % kRows, n = n0 + r;
    if (m >= a.M || n >= a.N) continue;
    float v = part[0][m][r];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v = __fadd_rn(v, part[w][m][r]);
    if (a.bias != nullptr) v = __fadd_rn(v, __ldg(a.bias + n));
    a.y[int64_t{m} * a.N + n] = v;
  }
}

template <int MT, int kWords>
void launch(bool is_signed, cudaStream_t stream, const Args& a) {
  const auto blocks = static_cast<unsigned>((a.N + kRows - 1) / kRows);
  const auto kernel = is_signed ? gemv_f32s4_kernel<MT, kWords, true> : gemv_f32s4_kernel<MT, kWords, false>;
  kernel<<<blocks, kGemvThreads, 0, stream>>>(a);
}

// Wider loads (16 or 8 bytes a lane) where K and the group size allow and registers suffice.
template <int MT, int kMaxWords>
void launch_widest(bool is_signed, cudaStream_t stream, const Args& a) {
  const auto fits = [&](int words) { return a.K % (kWordK * words) == 0 && a.group_size % (kWordK * words) == 0; };
  if (kMaxWords >= 4 && fits(4)) return launch<MT, (kMaxWords >= 4 ? 4 : 1)>(is_signed, stream, a);
  if (kMaxWords >= 2 && fits(2)) return launch<MT, (kMaxWords >= 2 ? 2 : 1)>(is_signed, stream, a);
  launch<MT, 1>(is_signed, stream, a);
}

}  // namespace

void gemv_f32s4_cuda(const float* x, int64_t M, const uint8_t* packed, int64_t N, int64_t K, bool is_signed,
                     const float* scale, const int32_t* zero, int64_t group_size, const float* bias, float* y,
                     cudaStream_t stream) {
  std::string why;
  QF_REQUIRE(gemv_f32s4_supported(M, K, group_size, &why), "kernels/cuda: gemv_f32s4_cuda: ", why);
  QF_REQUIRE(gemv_f32s4_pointers_supported(x, packed, &why), "kernels/cuda: gemv_f32s4_cuda: ", why);
  QF_REQUIRE(N >= 0 && N <= INT32_MAX && K <= INT32_MAX, "kernels/cuda: gemv_f32s4_cuda: N=", N, " K=", K,
             " beyond 32-bit indices");
  if (N == 0) return;
  const Args args{x,
                  static_cast<int>(M),
                  reinterpret_cast<const uint32_t*>(packed),
                  static_cast<int>(N),
                  static_cast<int>(K),
                  scale,
                  zero,
                  static_cast<int>(group_size),
                  static_cast<int>((K + group_size - 1) / group_size),
                  bias,
                  y};
  if (M == 1) {
    launch_widest<1, 4>(is_signed, stream, args);
  } else if (M == 2) {
    launch_widest<2, 4>(is_signed, stream, args);
  } else if (M <= 4) {
    launch_widest<4, 2>(is_signed, stream, args);
  } else if (M <= 8) {
    launch<8, 1>(is_signed, stream, args);
  } else {
    launch<16, 1>(is_signed, stream, args);
  }
  check_cuda(cudaGetLastError(), "gemv_f32s4_cuda launch");
}

}  // namespace qforge::cuda
