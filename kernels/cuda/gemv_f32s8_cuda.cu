// The int8 weight-only GEMV on the GPU (see gemv_f32s8_cuda.h for the formula and the bound).
// A block of kWarps warps owns kRows weight rows; each lane reads 4, 8 or 16 consecutive codes of
// every row per step (one streaming load each; the widths per M in gemv_f32s8_cuda), turns them
// into floats once, reads the step's
// activations (float4) once per row of x for all kRows rows, and has the next step's codes in
// flight while computing this one. The block's warps split K; lanes, then warps, are added at the end.
#include "kernels/cuda/gemv_f32s8_cuda.h"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv_loads.cuh"
#include "kernels/cuda/gemv_s8_rules.h"

namespace qforge::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWordCodes = 4;                  // int8 codes per 32-bit word
constexpr uint32_t kSignFlip = 0x80808080u;    // q + 128 in every byte: the unsigned code u
constexpr uint32_t kTwo23Bits = 0x4B000000u;   // the float 2^23: unit spacing in the mantissa
constexpr float kCodeOffset = 8388608.0f + 128.0f;  // 2^23 + 128

// float(q) for byte j of a sign-flipped word: the float 2^23 + u (u in the low mantissa byte,
// one byte permute), minus 2^23 + 128: exact.
template <int j>
__device__ __forceinline__ float code_value(uint32_t flipped) {
  return __fsub_rn(__uint_as_float(__byte_perm(flipped, kTwo23Bits, 0x7650u | j)), kCodeOffset);
}

struct Args {
  const float* x;
  int M;
  const uint32_t* words;
  int N, K;
  const float* scale;
  const float* bias;
  float* y;
};

// One lane's codes of one step: kWords words of each of the block's kRows rows.
template <int kWords, int kRows>
struct Step {
  uint32_t w[kRows][kWords];
};

template <int kWords, int kRows>
__device__ __forceinline__ void load_step(Step<kWords, kRows>& st, const Args& a, int64_t row_words, int n0, int k0) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int n = n0 + r < a.N ? n0 + r : a.N - 1;  // rows past N read row N - 1 and are not written
    gemv::load_words<kWords>(a.words + n * row_words + k0 / kWordCodes, st.w[r]);
  }
}

// Block b owns rows [kRows * b, kRows * b + kRows); lane l of warp w takes the codes at
// k0 = (step * kWarps + w) * 32 * kLaneK + kLaneK * l of each row (a warp reads 128 * kWords
// contiguous bytes per row and step: coalesced). MT: rows of x the accumulators hold (>= M);
// kRows: weight rows per block (each activation load serves kRows rows); kMinBlocks: resident
// blocks per SM the register budget must allow (__launch_bounds__).
template <int MT, int kWords, int kRows, int kMinBlocks = 1>
__global__ void __launch_bounds__(kThreads, kMinBlocks) gemv_f32s8_kernel(const Args a) {
  constexpr int kLaneK = kWordCodes * kWords;
  constexpr int kBlockK = kWarps * 32 * kLaneK;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int n0 = blockIdx.x * kRows;
  const int64_t row_words = a.K / kWordCodes;
  float acc[MT][kRows];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[m][r] = 0.0f;

  int k0 = (warp * 32 + lane) * kLaneK;
  Step<kWords, kRows> cur;
  if (k0 < a.K) load_step(cur, a, row_words, n0, k0);
  for (; k0 < a.K; k0 += kBlockK) {
    Step<kWords, kRows> next;
    if (k0 + kBlockK < a.K) load_step(next, a, row_words, n0, k0 + kBlockK);
    float v[kRows][kLaneK];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        const uint32_t f = cur.w[r][i] ^ kSignFlip;
        v[r][4 * i] = code_value<0>(f);
        v[r][4 * i + 1] = code_value<1>(f);
        v[r][4 * i + 2] = code_value<2>(f);
        v[r][4 * i + 3] = code_value<3>(f);
      }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (m >= a.M) break;
      float xv[kLaneK];
#pragma unroll
      for (int i = 0; i < kLaneK / 4; ++i) {
        const float4 q = __ldg(reinterpret_cast<const float4*>(a.x + int64_t{m} * a.K + k0) + i);
        xv[4 * i] = q.x, xv[4 * i + 1] = q.y, xv[4 * i + 2] = q.z, xv[4 * i + 3] = q.w;
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int j = 0; j < kLaneK; ++j) acc[m][r] = __fmaf_rn(xv[j], v[r][j], acc[m][r]);
    }
    cur = next;
  }

  __shared__ float part[kWarps][MT][kRows];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float s = acc[m][r];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xFFFFFFFFu, s, off));
      if (lane == 0) part[warp][m][r] = s;
    }
  __syncthreads();
  for (int t = threadIdx.x; t < MT * kRows; t += blockDim.x) {
    const int m = t / kRows, r = t % kRows, n = n0 + r;
    if (m >= a.M || n >= a.N) continue;
    float s = part[0][m][r];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) s = __fadd_rn(s, part[w][m][r]);
    s = __fmul_rn(s, __ldg(a.scale + n));
    if (a.bias != nullptr) s = __fadd_rn(s, __ldg(a.bias + n));
    a.y[int64_t{m} * a.N + n] = s;
  }
}

template <int MT, int kWords, int kRows = 4, int kMinBlocks = 1>
void launch(cudaStream_t stream, const Args& a) {
  const auto blocks = static_cast<unsigned>((a.N + kRows - 1) / kRows);
  gemv_f32s8_kernel<MT, kWords, kRows, kMinBlocks><<<blocks, kThreads, 0, stream>>>(a);
}

// The widest load K and the codes' alignment allow, up to kMaxWords (registers: the converted
// codes are kRows * 4 * kWords floats, the accumulators MT * kRows).
template <int MT, int kMaxWords, int kRows = 4, int kMinBlocks = 1>
void launch_widest(cudaStream_t stream, const Args& a) {
  const auto fits = [&](int words) {
    return a.K % (kWordCodes * words) == 0 && reinterpret_cast<uintptr_t>(a.words) % (4 * words) == 0;
  };
  if (kMaxWords >= 4 && fits(4)) return launch<MT, (kMaxWords >= 4 ? 4 : 1), kRows, kMinBlocks>(stream, a);
  if (kMaxWords >= 2 && fits(2)) return launch<MT, (kMaxWords >= 2 ? 2 : 1), kRows, kMinBlocks>(stream, a);
  launch<MT, 1, kRows, kMinBlocks>(stream, a);
}

}  // namespace

void gemv_f32s8_cuda(const float* x, int64_t M, const int8_t* codes, int64_t N, int64_t K, const float* scale,
                     const float* bias, float* y, cudaStream_t stream) {
  std::string why;
  QF_REQUIRE(gemv_f32s8_supported(M, K, &why), "kernels/cuda: gemv_f32s8_cuda: ", why);
  QF_REQUIRE(gemv_f32s8_pointers_supported(x, codes, &why), "kernels/cuda: gemv_f32s8_cuda: ", why);
  // 32-bit indices with room for a block's last rows (n0 + kRows) and a lane's next step (k0 + 2048).
  QF_REQUIRE(N >= 0 && N <= INT32_MAX - 8 && K <= INT32_MAX - 2048,
             "kernels/cuda: gemv_f32s8_cuda: N=", N, " K=", K, " beyond 32-bit indices");
  if (N == 0) return;
  const Args args{x, static_cast<int>(M), reinterpret_cast<const uint32_t*>(codes), static_cast<int>(N),
                  static_cast<int>(K), scale, bias, y};
  // Configurations from a sweep on the H200 (load width, 2-8 rows per block, register caps;
  // docs/performance.md): at M = 1 16-byte loads with registers capped for 8 resident blocks
  // (64 a thread: 7-10 % faster than 79 uncapped); no spills (ptxas, sm_90, CUDA 13.0). Above 8
  // rows of x, launches of at most 8 rows each: the weight is read again per launch, but two
  // 8-row launches took 0.55-0.69 of the time of one 16-row launch (16 x 14336 x 4096: 0.096
  // against 0.176 ms; 16 x 4096 x 4096: 0.036 against 0.056 ms).
  if (M == 1) {
    launch_widest<1, 4, 4, 8>(stream, args);
  } else if (M == 2) {
    launch_widest<2, 2>(stream, args);
  } else if (M <= 4) {
    launch<4, 1>(stream, args);
  } else {
    for (int64_t m0 = 0; m0 < M; m0 += 8) {
      Args part = args;
      part.x = x + m0 * K;
      part.y = y + m0 * N;
      part.M = static_cast<int>(M - m0 < 8 ? M - m0 : 8);
      launch_widest<8, 2>(stream, part);
    }
  }
  check_cuda(cudaGetLastError(), "gemv_f32s8_cuda launch");
}

}  // namespace qforge::cuda
