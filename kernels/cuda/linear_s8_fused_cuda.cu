// The one-launch int8 Linear (see linear_s8_fused_cuda.h). A block owns BM rows x BN columns
// of y and one K slice (grid z; one slice unless split K): its prologue, all threads together
// with many 16-byte loads in flight, writes the BM rows' int8 codes for its slice into shared
// memory (dynamic: per-row absmax over the whole K, then the codes, with the formulas of
// quantize_rows_s8_math.h; static: the given codes), while the first weight tiles [BN, 64] are
// already in flight through a cp.async ring (stages per tile: linear_s8_fused_rules.h). Each of
// the 4 warps computes a (BM / warps_m) x (BN / warps_n) sub-tile with mma.sync m16n8k32 (exact
// int32 sums); split K hands the sums to the tile's last block, and the epilogue applies
// dequantize_s32_f32_value in registers and stores float y.
#include "kernels/cuda/linear_s8_fused_cuda.h"

#include <atomic>
#include <string>
#include <type_traits>

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
  int splits, split_tiles;  // K slices (gridDim.z) and 64-wide k tiles per slice
  int32_t* partial;         // splits > 1: [splits, M, N] int32 partial sums
  unsigned* tickets;        // splits > 1: one counter per (row block, column block), zero between calls
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

// Loads in flight per thread in the prologue: 16 x 16 bytes, several rows at once, so a block
// keeps 32 KiB of x requests outstanding instead of one dependent round trip per 512 bytes.
constexpr int kPrologueBatch = 16;

// |max| of the finite elements of v (x columns 4 j4 .. 4 j4 + 3 of row m); a non-finite one goes
// to first_bad when this block reports (one block per row block reads the whole row).
__device__ __forceinline__ float absmax4(const FusedParams& p, float4 v, int m, int j4, bool report) {
  const float e[4] = {v.x, v.y, v.z, v.w};
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (!isfinite(e[i])) {
      if (report) atomicMin(p.first_bad, static_cast<unsigned long long>(int64_t{m} * p.K + 4 * j4 + i));
    } else {
      amax = fmaxf(amax, fabsf(e[i]));
    }
  }
  return amax;
}

// Warp max, then one shared atomicMax per warp into row r's absmax bits (non-negative floats
// order as their int bits, and max is order-free: the same value as the sequential reference).
__device__ __forceinline__ void flush_row_amax(int* amax_bits, int r, float run) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) run = fmaxf(run, __shfl_xor_sync(0xFFFFFFFFu, run, off));
  if ((threadIdx.x & 31) == 0) atomicMax(amax_bits + r, __float_as_int(run));
}

// Per-row absmax over the whole K of the block's rows (all threads, float4 items as
// fused_item_row / fused_item_col map them), then the scales.
template <int kBM>
__device__ __forceinline__ void row_scales(const FusedParams& p, int m0, float* a_scale, bool report) {
  int* amax_bits = reinterpret_cast<int*>(a_scale);  // the bits live where the scales go
  if (threadIdx.x < kBM) amax_bits[threadIdx.x] = 0;
  __syncthreads();
  const int k4 = p.K / 4, per_row = (k4 + kFusedThreads - 1) / kFusedThreads;
  const int rows = min(kBM, p.M - m0), items = rows * per_row;
  const float4* x = reinterpret_cast<const float4*>(p.x) + int64_t{m0} * k4;
  int cur = 0;
  float run = 0.0f;
  for (int base = 0; base < items; base += kPrologueBatch) {
    float4 v[kPrologueBatch];
#pragma unroll
    for (int q = 0; q < kPrologueBatch; ++q) {
      const int f = base + q, r = fused_item_row(f, per_row), j = fused_item_col(f, per_row, threadIdx.x);
      v[q] = f < items && j < k4 ? __ldg(x + int64_t{r} * k4 + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int q = 0; q < kPrologueBatch; ++q) {
      const int f = base + q, r = fused_item_row(f, per_row), j = fused_item_col(f, per_row, threadIdx.x);
      if (f >= items) continue;
      if (r != cur) {
        flush_row_amax(amax_bits, cur, run);
        cur = r;
        run = 0.0f;
      }
      if (j < k4) run = fmaxf(run, absmax4(p, v[q], m0 + r, j, report));
    }
  }
  flush_row_amax(amax_bits, cur, run);
  __syncthreads();
  if (threadIdx.x < kBM) {
    const int r = threadIdx.x;  // reads its own bits, writes its own scale: no race
    a_scale[r] = r < rows ? act_scale_from_amax(__int_as_float(amax_bits[r])) : 1.0f;
  }
  __syncthreads();
}

// The code panel: columns [0, width) of the block's rows hold x columns k_lo .. k_lo + width - 1
// quantized (dynamic; these reads mostly hit L2) or copied (static); zero past K and past M.
template <int kBM, bool kDynamic>
__device__ __forceinline__ void fill_code_panel(const FusedParams& p, int m0, int k_lo, int width, int stride,
                                                int8_t* as, const float* a_scale) {
  constexpr int kBytes = kDynamic ? 4 : 16;  // panel bytes per item: one float4 or one 16-code chunk
  const int per_row = (width / kBytes + kFusedThreads - 1) / kFusedThreads, items = kBM * per_row;
  for (int base = 0; base < items; base += kPrologueBatch) {
    using In = typename std::conditional<kDynamic, float4, uint4>::type;
    In v[kPrologueBatch];
#pragma unroll
    for (int q = 0; q < kPrologueBatch; ++q) {
      const int f = base + q, r = fused_item_row(f, per_row), c = fused_item_col(f, per_row, threadIdx.x);
      const int k = k_lo + c * kBytes, m = m0 + r;
      const bool in = f < items && c * kBytes < width && k < p.K && m < p.M;
      if (kDynamic) {
        v[q] = in ? __ldg(reinterpret_cast<const In*>(p.x + int64_t{m} * p.K + k)) : In{};
      } else {
        v[q] = in ? __ldg(reinterpret_cast<const In*>(p.codes + int64_t{m} * p.K + k)) : In{};
      }
    }
#pragma unroll
    for (int q = 0; q < kPrologueBatch; ++q) {
      const int f = base + q, r = fused_item_row(f, per_row), c = fused_item_col(f, per_row, threadIdx.x);
      if (f >= items || c * kBytes >= width) continue;
      if (kDynamic) {
        const float4 x4 = reinterpret_cast<const float4&>(v[q]);
        const float inv = act_inv_scale(a_scale[r]);
        const bool in = k_lo + c * 4 < p.K && m0 + r < p.M;
        reinterpret_cast<uint32_t*>(as + r * stride)[c] =
            in ? uint32_t{static_cast<uint8_t>(quantize_act_s8(x4.x, inv))} |
                     uint32_t{static_cast<uint8_t>(quantize_act_s8(x4.y, inv))} << 8 |
                     uint32_t{static_cast<uint8_t>(quantize_act_s8(x4.z, inv))} << 16 |
                     uint32_t{static_cast<uint8_t>(quantize_act_s8(x4.w, inv))} << 24
               : 0u;
      } else {
        reinterpret_cast<uint4*>(as + r * stride)[c] = reinterpret_cast<const uint4&>(v[q]);
      }
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

// f(mt, nt, i, m, n) for every accumulator of the warp's sub-tile that lies inside y.
template <int kMT, int kNT, typename F>
__device__ __forceinline__ void for_each_output(const FusedParams& p, int m_base, int n_base, int lane, F&& f) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int m = m_base + 16 * mt + fused_c_frag_row(lane, i), n = n_base + 8 * nt + fused_c_frag_col(lane, i);
        if (m < p.M && n < p.N) f(mt, nt, i, m, n);
      }
}

// Split K: this block's int32 sums go to its slice of the workspace; the last block of the tile
// to arrive (ticket) adds the slices in order 0..S-1 (exact int32 sums: the same bits as one
// block), resets the ticket for the next call and returns true to run the epilogue. flag: a
// shared int no thread reads any more (the weight ring, idle after the main loop).
template <int kMT, int kNT>
__device__ __forceinline__ bool reduce_split_k(const FusedParams& p, int (&acc)[kMT][kNT][4], int m_base, int n_base,
                                               int lane, int* flag) {
  const auto slot = [&](int split, int m, int n) { return p.partial + (int64_t{split} * p.M + m) * p.N + n; };
  for_each_output<kMT, kNT>(p, m_base, n_base, lane, [&](int mt, int nt, int i, int m, int n) {
    __stcg(slot(blockIdx.z, m, n), acc[mt][nt][i]);
  });
  __threadfence();  // this block's partial sums are visible device-wide before its ticket
  __syncthreads();  // every thread is past the main loop and has fenced its stores
  if (threadIdx.x == 0) {
    unsigned* ticket = p.tickets + blockIdx.y * gridDim.x + blockIdx.x;
    const bool last = atomicAdd(ticket, 1u) == static_cast<unsigned>(p.splits - 1);
    if (last) *ticket = 0u;  // every slice has arrived: nothing else touches it in this launch
    *flag = last ? 1 : 0;
  }
  __syncthreads();
  if (*flag == 0) return false;
  __threadfence();  // the other slices' sums were published before their tickets
  for_each_output<kMT, kNT>(p, m_base, n_base, lane, [&](int mt, int nt, int i, int m, int n) {
    int sum = 0;
    for (int s = 0; s < p.splits; ++s)
      sum += s == static_cast<int>(blockIdx.z) ? acc[mt][nt][i] : __ldcg(slot(s, m, n));
    acc[mt][nt][i] = sum;
  });
  return true;
}

template <int kBM, int kBN, int kWM, int kWN, int kStages, bool kDynamic>
__global__ void __launch_bounds__(kFusedThreads, 1) linear_s8_fused_kernel(const FusedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kMT = kBM / kWM / 16, kNT = kBN / kWN / 8;
  static_assert(kWM * kWN == kWarps && kMT >= 1 && kNT >= 1, "warp grid must cover the tile");
  static_assert(kStages >= 2, "the ring needs a tile in flight");
  extern __shared__ __align__(16) int8_t smem[];
  // This block's K slice: tiles [kt0, kt0 + KT) of the whole K's 64-wide tiles.
  const int kt0 = blockIdx.z * p.split_tiles;
  const int KT = min(p.split_tiles, (p.K + static_cast<int>(kFusedBK) - 1) / static_cast<int>(kFusedBK) - kt0);
  const int width = p.split_tiles * static_cast<int>(kFusedBK);
  const int a_stride = static_cast<int>(fused_a_stride(width));
  int8_t* as = smem;
  int8_t* wring = smem + kBM * a_stride;
  float* a_scale = reinterpret_cast<float*>(wring + kStages * kBN * kFusedWStride);
  const int n0 = blockIdx.x * kBN, m0 = blockIdx.y * kBM;
  // The first weight tiles fly while the prologue builds the code panel.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_w_tile<kBN>(p, n0, kt0 + s, wring + s * kBN * kFusedWStride);
    cp_async_commit();
  }
  if (kDynamic) {
    // One block per row block (column block 0, slice 0) reads every column and reports.
    row_scales<kBM>(p, m0, a_scale, p.first_bad != nullptr && blockIdx.x == 0 && blockIdx.z == 0);
  } else if (threadIdx.x < kBM) {
    a_scale[threadIdx.x] = p.static_scale;
  }
  fill_code_panel<kBM, kDynamic>(p, m0, kt0 * static_cast<int>(kFusedBK), width, a_stride, as, a_scale);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp / kWN, wn = warp % kWN;
  const int8_t* a_warp = as + wm * (kBM / kWM) * a_stride;
  int acc[kMT][kNT][4] = {};
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile kt (and, at kt = 0, the code panel) visible to every thread; slot (kt - 1) % S free
    const int next = kt + kStages - 1;
    if (next < KT) load_w_tile<kBN>(p, n0, kt0 + next, wring + (next % kStages) * kBN * kFusedWStride);
    cp_async_commit();
    const int8_t* ws = wring + (kt % kStages) * kBN * kFusedWStride + wn * (kBN / kWN) * kFusedWStride;
    mma_tile<kMT, kNT>(acc, a_warp, a_stride, kt * static_cast<int>(kFusedBK), ws, lane);
  }
  const int m_base = m0 + wm * (kBM / kWM), n_base = n0 + wn * (kBN / kWN);
  if (p.splits > 1 && !reduce_split_k<kMT, kNT>(p, acc, m_base, n_base, lane, reinterpret_cast<int*>(wring)))
    return;
  for_each_output<kMT, kNT>(p, m_base, n_base, lane, [&](int mt, int nt, int i, int m, int n) {
    p.y[int64_t{m} * p.N + n] = dequantize_s32_f32_value(acc[mt][nt][i], a_scale[m - m0], __ldg(p.w_scale + n),
                                                         p.bias != nullptr ? __ldg(p.bias + n) : 0.0f);
  });
#else
  __trap();  // never launched: linear_s8_fused_choose refuses devices and builds without sm_80 code
#endif
}

template <FusedTile kTile>
void fused_launch(const FusedParams& p, bool dynamic, int64_t bytes, cudaStream_t stream) {
  constexpr FusedTileShape kS = fused_tile_shape(kTile);
  const auto kernel = dynamic ? linear_s8_fused_kernel<kS.bm, kS.bn, kS.warps_m, kS.warps_n, kS.stages, true>
                              : linear_s8_fused_kernel<kS.bm, kS.bn, kS.warps_m, kS.warps_n, kS.stages, false>;
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
  const dim3 grid(static_cast<unsigned>((p.N + kS.bn - 1) / kS.bn), static_cast<unsigned>((p.M + kS.bm - 1) / kS.bm),
                  static_cast<unsigned>(p.splits));
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

bool linear_s8_fused_choose(const LinearS8FusedArgs& a, FusedTile* tile, int64_t* splits, std::string* why) {
  if (a.M > kFusedMaxM) {
    if (why != nullptr)
      *why = "M=" + std::to_string(a.M) + " above " + std::to_string(kFusedMaxM) +
             ": the chain's cuBLASLt GEMM is faster there (docs/kernels.md)";
    return false;
  }
  const FusedTile t = fused_tile_for(a.M, a.K);
  const int64_t s = fused_splits_for(t, a.N, a.K);
  const void* act = a.x != nullptr ? static_cast<const void*>(a.x) : static_cast<const void*>(a.codes);
  // The same sm_80 mma.sync requirement as the int4 tensor-core GEMV, built into the same library.
  if (!linear_s8_fused_supported(a.M, a.N, a.K, t, linear_s8_fused_max_smem(), why, s) ||
      !linear_s8_fused_pointers_supported(act, a.weight, why) || !gemv_f32s4_mma_runs_here(why))
    return false;
  if (tile != nullptr) *tile = t;
  if (splits != nullptr) *splits = s;
  return true;
}

void linear_s8_fused_cuda(const LinearS8FusedArgs& a, FusedTile t, cudaStream_t stream) {
  std::string why;
  const bool dynamic = a.x != nullptr;
  QF_REQUIRE(dynamic != (a.codes != nullptr), "kernels/cuda: linear_s8_fused_cuda needs exactly one of x and codes");
  QF_REQUIRE(a.weight != nullptr && a.w_scale != nullptr && a.y != nullptr,
             "kernels/cuda: linear_s8_fused_cuda: weight, w_scale and y must be given");
  QF_REQUIRE(linear_s8_fused_supported(a.M, a.N, a.K, t, linear_s8_fused_max_smem(), &why, a.splits),
             "kernels/cuda: linear_s8_fused_cuda: ", why);
  const int64_t splits = fused_effective_splits(a.K, a.splits);
  QF_REQUIRE(splits == 1 || (a.workspace != nullptr && a.tickets != nullptr),
             "kernels/cuda: linear_s8_fused_cuda: splits=", a.splits, " needs a workspace and tickets");
  QF_REQUIRE(linear_s8_fused_pointers_supported(dynamic ? static_cast<const void*>(a.x) : a.codes, a.weight, &why),
             "kernels/cuda: linear_s8_fused_cuda: ", why);
  QF_REQUIRE(gemv_f32s4_mma_runs_here(&why), "kernels/cuda: linear_s8_fused_cuda: ", why);
  const FusedParams p{a.x,
                      a.codes,
                      a.static_scale,
                      a.weight,
                      a.w_scale,
                      a.bias,
                      a.y,
                      static_cast<int>(a.M),
                      static_cast<int>(a.N),
                      static_cast<int>(a.K),
                      a.first_nonfinite,
                      static_cast<int>(splits),
                      static_cast<int>(fused_split_tiles(a.K, a.splits)),
                      a.workspace,
                      a.tickets};
  const int64_t bytes = fused_smem_bytes(t, a.K, a.splits);
  switch (t) {
    case FusedTile::k16x64: fused_launch<FusedTile::k16x64>(p, dynamic, bytes, stream); break;
    case FusedTile::k64x64: fused_launch<FusedTile::k64x64>(p, dynamic, bytes, stream); break;
    case FusedTile::k64x128: fused_launch<FusedTile::k64x128>(p, dynamic, bytes, stream); break;
    case FusedTile::k32x128: fused_launch<FusedTile::k32x128>(p, dynamic, bytes, stream); break;
  }
  check_cuda(cudaGetLastError(), "linear_s8_fused_cuda launch");
}

}  // namespace qforge::cuda
