// The one-launch int8 Linear (see linear_s8_fused_cuda.h). A block owns BM rows x BN columns
// of y: its prologue writes the BM rows' int8 codes for all of K into shared memory (dynamic:
// per-row absmax over K from global memory, then the codes, both with the formulas of
// quantize_rows_s8_math.h; static: the given codes), while the first weight tiles [BN, 64] are
// already in flight through a cp.async ring (stages per tile: linear_s8_fused_rules.h). Each of the 4 warps computes a
// (BM / warps_m) x (BN / warps_n) sub-tile with mma.sync m16n8k32 (exact int32 sums), and the
// epilogue applies dequantize_s32_f32_value in registers and stores float y.
#include "kernels/cuda/linear_s8_fused_cuda.h"

#include <atomic>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/epilogue_math.h"
#include "kernels/cuda/gemv_f32s4_mma_cuda.h"
#include "kernels/cuda/quantize_rows_s8_math.h"

namespace qforge::cuda {
namespace {

constexpr int kFusedKnownDevices = 64;  // per-device facts remembered for devices 0..63
constexpr int kWarps = kFusedThreads / 32;

struct FusedParams {
  const float* x;
  const int8_t* codes;
  float static_scale;
  const int8_t* w;
  const float* w_scale;
  const float* bias;
  float* y;
  int M, N, K;
  unsigned long long* first_bad;
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void mma_s8_16832(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Weight tile kt ([BN, 64] bytes of rows n0..n0+BN-1) into ring slot ws: 16-byte chunks, rows
// past N and k past K zero-filled (src-size 0), so they add nothing to the sums.
template <int kBN>
__device__ __forceinline__ void load_w_tile(const FusedParams& p, int n0, int kt, int8_t* ws) {
#pragma unroll
  for (int i = 0; i < kBN * 4 / kFusedThreads; ++i) {
    const int c = threadIdx.x + i * kFusedThreads;
    const int row = c >> 2, part = c & 3;
    const int n = n0 + row, k = kt * static_cast<int>(kFusedBK) + part * 16;
    const bool in = n < p.N && k < p.K;
    const int8_t* src = in ? p.w + int64_t{n} * p.K + k : p.w;
    cp_async16(ws + row * kFusedWStride + part * 16, src, in ? 16 : 0);
  }
}

// Row r of the code panel from float x (dynamic): absmax over K skipping non-finite values (the
// smallest bad index goes to first_bad), then the codes; columns [K, stride - 16) are zero.
__device__ __forceinline__ void quantize_row(const FusedParams& p, int m, int8_t* row, float* scale_out,
                                             int padded_k, int lane) {
  const float4* xr = reinterpret_cast<const float4*>(p.x + int64_t{m} * p.K);
  const int k4 = p.K / 4;
  float amax = 0.0f;
  for (int j = lane; j < k4; j += 32) {
    const float4 v = __ldg(xr + j);
    const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (!isfinite(e[i])) {
        if (p.first_bad != nullptr)
          atomicMin(p.first_bad, static_cast<unsigned long long>(int64_t{m} * p.K + 4 * j + i));
      } else {
        amax = fmaxf(amax, fabsf(e[i]));
      }
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  const float scale = act_scale_from_amax(amax);
  const float inv = act_inv_scale(scale);
  for (int j = lane; j < padded_k / 4; j += 32) {
    uint32_t packed = 0;
    if (j < k4) {
      const float4 v = __ldg(xr + j);
      packed = uint32_t{static_cast<uint8_t>(quantize_act_s8(v.x, inv))} |
               uint32_t{static_cast<uint8_t>(quantize_act_s8(v.y, inv))} << 8 |
               uint32_t{static_cast<uint8_t>(quantize_act_s8(v.z, inv))} << 16 |
               uint32_t{static_cast<uint8_t>(quantize_act_s8(v.w, inv))} << 24;
    }
    reinterpret_cast<uint32_t*>(row)[j] = packed;
  }
  if (lane == 0) *scale_out = scale;
}

// Row r of the code panel from the given int8 codes (static path), zero past K.
__device__ __forceinline__ void copy_codes_row(const FusedParams& p, int m, int8_t* row, int padded_k, int lane) {
  const uint4* src = reinterpret_cast<const uint4*>(p.codes + int64_t{m} * p.K);
  for (int j = lane; j < padded_k / 16; j += 32)
    reinterpret_cast<uint4*>(row)[j] = j < p.K / 16 ? __ldg(src + j) : make_uint4(0, 0, 0, 0);
}

// The block's code panel and per-row scales; rows past M are zero (their outputs are not stored).
template <int kBM, bool kDynamic>
__device__ __forceinline__ void fill_code_panel(const FusedParams& p, int m0, int8_t* as, float* a_scale) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int stride = static_cast<int>(fused_a_stride(p.K)), padded_k = stride - static_cast<int>(kFusedRowPad);
  for (int r = warp; r < kBM; r += kWarps) {
    const int m = m0 + r;
    int8_t* row = as + r * stride;
    if (m >= p.M) {
      for (int j = lane; j < padded_k / 16; j += 32) reinterpret_cast<uint4*>(row)[j] = make_uint4(0, 0, 0, 0);
      if (lane == 0) a_scale[r] = 1.0f;
    } else if (kDynamic) {
      quantize_row(p, m, row, a_scale + r, padded_k, lane);
    } else {
      copy_codes_row(p, m, row, padded_k, lane);
      if (lane == 0) a_scale[r] = p.static_scale;
    }
  }
}

// One 64-wide k tile of the warp's sub-tile: two m16n8k32 steps over every (m16, n8) pair.
template <int kMT, int kNT>
__device__ __forceinline__ void mma_tile(int (&acc)[kMT][kNT][4], const int8_t* as, int a_stride, int a_k0,
                                         const int8_t* ws, int lane) {
#pragma unroll
  for (int ks = 0; ks < static_cast<int>(kFusedBK / kFusedKStep); ++ks) {
    uint32_t a[kMT][4], b[kNT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        a[mt][r] = *reinterpret_cast<const uint32_t*>(as + (16 * mt + fused_a_frag_row(lane, r)) * a_stride + a_k0 +
                                                      32 * ks + fused_a_frag_k(lane, r));
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        b[nt][r] = *reinterpret_cast<const uint32_t*>(ws + (8 * nt + fused_b_frag_col(lane)) * kFusedWStride +
                                                      32 * ks + fused_b_frag_k(lane, r));
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) mma_s8_16832(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
  }
}

template <int kBM, int kBN, int kWM, int kWN, int kStages, bool kDynamic>
__global__ void __launch_bounds__(kFusedThreads) linear_s8_fused_kernel(const FusedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kMT = kBM / kWM / 16, kNT = kBN / kWN / 8;
  static_assert(kWM * kWN == kWarps && kMT >= 1 && kNT >= 1, "warp grid must cover the tile");
  static_assert(kStages >= 2, "the ring needs a tile in flight");
  extern __shared__ __align__(16) int8_t smem[];
  const int a_stride = static_cast<int>(fused_a_stride(p.K));
  int8_t* as = smem;
  int8_t* wring = smem + kBM * a_stride;
  float* a_scale = reinterpret_cast<float*>(wring + kStages * kBN * kFusedWStride);
  const int n0 = blockIdx.x * kBN, m0 = blockIdx.y * kBM;
  const int KT = (p.K + static_cast<int>(kFusedBK) - 1) / static_cast<int>(kFusedBK);
  // The first weight tiles fly while the prologue builds the code panel.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_w_tile<kBN>(p, n0, s, wring + s * kBN * kFusedWStride);
    cp_async_commit();
  }
  fill_code_panel<kBM, kDynamic>(p, m0, as, a_scale);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp / kWN, wn = warp % kWN;
  const int8_t* a_warp = as + wm * (kBM / kWM) * a_stride;
  int acc[kMT][kNT][4] = {};
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile kt landed for every thread; slot (kt - 1) % S is free again
    const int next = kt + kStages - 1;
    if (next < KT) load_w_tile<kBN>(p, n0, next, wring + (next % kStages) * kBN * kFusedWStride);
    cp_async_commit();
    const int8_t* ws = wring + (kt % kStages) * kBN * kFusedWStride + wn * (kBN / kWN) * kFusedWStride;
    mma_tile<kMT, kNT>(acc, a_warp, a_stride, kt * static_cast<int>(kFusedBK), ws, lane);
  }
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = wm * (kBM / kWM) + 16 * mt + fused_c_frag_row(lane, i);
        const int m = m0 + r, n = n0 + wn * (kBN / kWN) + 8 * nt + fused_c_frag_col(lane, i);
        if (m < p.M && n < p.N)
          p.y[int64_t{m} * p.N + n] = dequantize_s32_f32_value(acc[mt][nt][i], a_scale[r], __ldg(p.w_scale + n),
                                                               p.bias != nullptr ? __ldg(p.bias + n) : 0.0f);
      }
#else
  __trap();  // never launched: linear_s8_fused_choose refuses devices and builds without sm_80 code
#endif
}

template <FusedTile kTile>
void fused_launch(const FusedParams& p, bool dynamic, cudaStream_t stream) {
  constexpr FusedTileShape kS = fused_tile_shape(kTile);
  const auto kernel = dynamic ? linear_s8_fused_kernel<kS.bm, kS.bn, kS.warps_m, kS.warps_n, kS.stages, true>
                              : linear_s8_fused_kernel<kS.bm, kS.bn, kS.warps_m, kS.warps_n, kS.stages, false>;
  const int64_t bytes = fused_smem_bytes(kTile, p.K);
  if (bytes > 48 * 1024) {
    // Above 48 KiB a kernel must opt in; the device's whole opt-in size, once per device.
    static std::atomic<bool> opted_in[2][kFusedKnownDevices];  // static storage: all false
    int dev = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    std::atomic<bool>* done = dev >= 0 && dev < kFusedKnownDevices ? &opted_in[dynamic ? 1 : 0][dev] : nullptr;
    if (done == nullptr || !done->load(std::memory_order_relaxed)) {
      check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(linear_s8_fused_max_smem())),
                 "cudaFuncSetAttribute");
      if (done != nullptr) done->store(true, std::memory_order_relaxed);
    }
  }
  const dim3 grid(static_cast<unsigned>((p.N + kS.bn - 1) / kS.bn), static_cast<unsigned>((p.M + kS.bm - 1) / kS.bm));
  kernel<<<grid, kFusedThreads, static_cast<size_t>(bytes), stream>>>(p);
}

}  // namespace

int64_t linear_s8_fused_max_smem() {
  static std::atomic<int> sizes[kFusedKnownDevices];  // static storage: all 0 (not asked yet)
  int dev = 0, n = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev >= 0 && dev < kFusedKnownDevices && (n = sizes[dev].load(std::memory_order_relaxed)) > 0) return n;
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "cudaDeviceGetAttribute");
  if (dev >= 0 && dev < kFusedKnownDevices) sizes[dev].store(n, std::memory_order_relaxed);
  return n;
}

bool linear_s8_fused_choose(const LinearS8FusedArgs& a, FusedTile* tile, std::string* why) {
  const FusedTile t = fused_tile_for(a.M, a.K);
  const void* act = a.x != nullptr ? static_cast<const void*>(a.x) : static_cast<const void*>(a.codes);
  // The same sm_80 mma.sync requirement as the int4 tensor-core GEMV, built into the same library.
  if (!linear_s8_fused_supported(a.M, a.N, a.K, t, linear_s8_fused_max_smem(), why) ||
      !linear_s8_fused_pointers_supported(act, a.weight, why) || !gemv_f32s4_mma_runs_here(why))
    return false;
  if (tile != nullptr) *tile = t;
  return true;
}

void linear_s8_fused_cuda(const LinearS8FusedArgs& a, FusedTile t, cudaStream_t stream) {
  std::string why;
  const bool dynamic = a.x != nullptr;
  QF_REQUIRE(dynamic != (a.codes != nullptr), "kernels/cuda: linear_s8_fused_cuda needs exactly one of x and codes");
  QF_REQUIRE(a.weight != nullptr && a.w_scale != nullptr && a.y != nullptr,
             "kernels/cuda: linear_s8_fused_cuda: weight, w_scale and y must be given");
  QF_REQUIRE(linear_s8_fused_supported(a.M, a.N, a.K, t, linear_s8_fused_max_smem(), &why),
             "kernels/cuda: linear_s8_fused_cuda: ", why);
  QF_REQUIRE(linear_s8_fused_pointers_supported(dynamic ? static_cast<const void*>(a.x) : a.codes, a.weight, &why),
             "kernels/cuda: linear_s8_fused_cuda: ", why);
  QF_REQUIRE(gemv_f32s4_mma_runs_here(&why), "kernels/cuda: linear_s8_fused_cuda: ", why);
  const FusedParams p{a.x,       a.codes, a.static_scale,       a.weight,
                      a.w_scale, a.bias,  a.y,                  static_cast<int>(a.M),
                      static_cast<int>(a.N), static_cast<int>(a.K), a.first_nonfinite};
  switch (t) {
    case FusedTile::k16x64: fused_launch<FusedTile::k16x64>(p, dynamic, stream); break;
    case FusedTile::k64x64: fused_launch<FusedTile::k64x64>(p, dynamic, stream); break;
    case FusedTile::k64x128: fused_launch<FusedTile::k64x128>(p, dynamic, stream); break;
    case FusedTile::k32x128: fused_launch<FusedTile::k32x128>(p, dynamic, stream); break;
  }
  check_cuda(cudaGetLastError(), "linear_s8_fused_cuda launch");
}

}  // namespace qforge::cuda
