// When the one-launch int8 Linear (linear_s8_fused_cuda) serves a call, which tile it runs, and
// the mma.sync m16n8k32 fragment positions it reads and writes. Host/device code with no CUDA
// headers, so tests/kernels/cuda_math_test and the framework read the same rules the launcher
// checks. The kernel keeps a block's BM rows of int8 activation codes for the whole K in shared
// memory (quantized once per block) and streams [BN, 64] weight tiles through a cp.async ring
// (8 tiles deep for the 16-row tile, 3 for the others):
//   - M, N >= 1; K a positive multiple of 32 (one mma k-step; a 64-wide tile's odd half is zero);
//   - BM * (K rounded up to 64, + 16 bytes of padding) codes + the weight ring fit the device's
//     opt-in shared memory per block (H100: 227 KiB; K <= 3072 for 64 x 128, 3328 for 64 x 64);
//   - x (float, 16 bytes), codes (int8, 16 bytes) and W (16 bytes) aligned;
//   - M / BM blocks within gridDim.y (65535), N and K within 32-bit indices.
// Split K (splits S > 1): grid z = S slices of ceil(K / 64 / S) weight tiles each; a block
// quantizes and multiplies only its slice (its code panel holds the slice), writes int32 partial
// sums to a caller's workspace [S, M, N], and the last block of each output tile adds them.
// Tile per M (constants below, set from the qbench_gpu table): M <= 16 the 16 x 64 tile,
// M <= kFusedMidMaxM 64 x 64, larger M 64 x 128, or 32 x 128 when K makes the 64-row code panel
// leave one block per SM (K > kFusedWideMaxK). The dispatch (linear_s8_fused_choose) runs the
// fused kernel only for M <= kFusedMaxM (1), with fused_splits_for's S.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "framework/core/host_device.h"

namespace qforge::cuda {

constexpr int64_t kFusedKStep = 32;        // mma.sync m16n8k32: k per instruction
constexpr int64_t kFusedBK = 64;           // k per weight tile of the ring
constexpr int64_t kFusedRowPad = 16;       // bytes after each smem row: conflict-free fragment reads
constexpr int kFusedThreads = 128;         // 4 warps per block
constexpr int64_t kFusedMaxGridY = 65535;  // row blocks
constexpr uintptr_t kFusedAlignment = 16;
constexpr int64_t kFusedMinOptInSmem = 101376;  // 99 KiB: sm_86 / sm_89, the least opt-in of sm_80+ GPUs

// Dispatch constants (docs/kernels.md): the largest M of the 16-row tile and of the 64 x 64 tile,
// and the largest K for which large M takes the 64-row 64 x 128 tile rather than 32 x 128.
constexpr int64_t kFusedSmallMaxM = 16;
constexpr int64_t kFusedMidMaxM = 256;
constexpr int64_t kFusedWideMaxK = 1024;
// The largest M the dispatch gives the fused kernel, the most K slices it uses, the smallest K it
// splits, and the most blocks (column blocks x slices) split K may make. Measured on an H200
// (qbench_gpu, 2026-11-26 23:06 UTC, docs/performance.md): at M = 1 the fused kernel beat the
// three-launch chain on every BERT shape (0.0102-0.0141 ms against 0.0134-0.0181), at M = 16 it
// lost on every one (0.0171-0.0320 against 0.0137-0.0170; M 2-15 not measured), and above that the
// chain's cuBLASLt GEMM was 3-25x faster; K/4 slices won at K = 3072, none at K = 768.
constexpr int64_t kFusedMaxM = 1;
constexpr int64_t kFusedMaxSplits = 4;
constexpr int64_t kFusedSplitMinK = 2048;
constexpr int64_t kFusedSplitMaxBlocks = 264;  // two blocks per SM of a 132-SM H100
constexpr int64_t kFusedSplitLimit = 64;       // splits a call may ask for (grid z, workspace)

enum class FusedTile : int { k16x64 = 0, k64x64 = 1, k64x128 = 2, k32x128 = 3 };
constexpr int kFusedTileCount = 4;

struct FusedTileShape {
  int bm, bn, warps_m, warps_n;  // block tile and warp grid (warps_m * warps_n == 4)
  int stages;                    // weight tiles of the cp.async ring (stages - 1 in flight)
};

QF_HOST_DEVICE constexpr FusedTileShape fused_tile_shape(FusedTile t) {
  // Small M has few blocks (N / 64), so its ring is deep: latency, not compute, bounds it.
  return t == FusedTile::k16x64    ? FusedTileShape{16, 64, 1, 4, 8}
         : t == FusedTile::k64x64  ? FusedTileShape{64, 64, 2, 2, 3}
         : t == FusedTile::k64x128 ? FusedTileShape{64, 128, 2, 2, 3}
                                   : FusedTileShape{32, 128, 1, 4, 3};
}

inline const char* fused_tile_name(FusedTile t) {
  switch (t) {
    case FusedTile::k16x64: return "16x64";
    case FusedTile::k64x64: return "64x64";
    case FusedTile::k64x128: return "64x128";
    default: return "32x128";
  }
}

// Row stride of the activation code panel in shared memory: K rounded up to 64, plus 16 bytes
// (the 8 fragment rows of a warp's load then start in 8 different 4-bank groups).
QF_HOST_DEVICE constexpr int64_t fused_a_stride(int64_t K) {
  return (K + kFusedBK - 1) / kFusedBK * kFusedBK + kFusedRowPad;
}
constexpr int64_t kFusedWStride = kFusedBK + kFusedRowPad;  // 80 bytes per weight row of a tile

// 64-wide k tiles per K slice, and the slices that are not empty (ceil(K / 64) tiles over S).
QF_HOST_DEVICE constexpr int64_t fused_split_tiles(int64_t K, int64_t splits) {
  return ((K + kFusedBK - 1) / kFusedBK + splits - 1) / splits;
}
QF_HOST_DEVICE constexpr int64_t fused_effective_splits(int64_t K, int64_t splits) {
  return ((K + kFusedBK - 1) / kFusedBK + fused_split_tiles(K, splits) - 1) / fused_split_tiles(K, splits);
}

// Dynamic shared memory of one block: code panel (one K slice), weight ring, per-row scales.
QF_HOST_DEVICE constexpr int64_t fused_smem_bytes(FusedTile t, int64_t K, int64_t splits = 1) {
  return fused_tile_shape(t).bm * fused_a_stride(fused_split_tiles(K, splits) * kFusedBK) +
         fused_tile_shape(t).stages * fused_tile_shape(t).bn * kFusedWStride + fused_tile_shape(t).bm * 4;
}

// The prologue's work items (all threads of a block on its rows): item f is row f / per_row and
// chunk column tid + 128 (f % per_row), per_row = ceil(chunks per row / 128); row and item are
// the same for every thread of the block, so each row's reduction is block-uniform.
QF_HOST_DEVICE constexpr int fused_item_row(int f, int per_row) { return f / per_row; }
QF_HOST_DEVICE constexpr int fused_item_col(int f, int per_row, int tid) {
  return tid + (f - f / per_row * per_row) * kFusedThreads;
}

// Caller-owned split-K storage: int32 partial sums [S, M, N] and one ticket per output tile
// (unsigned, zero before the first call; the kernel leaves them zero).
constexpr int64_t fused_workspace_ints(int64_t M, int64_t N, int64_t K, int64_t splits) {
  return fused_effective_splits(K, splits) > 1 ? fused_effective_splits(K, splits) * M * N : 0;
}
constexpr int64_t fused_ticket_count(FusedTile t, int64_t M, int64_t N) {
  const FusedTileShape sh = fused_tile_shape(t);
  return (M + sh.bm - 1) / sh.bm * ((N + sh.bn - 1) / sh.bn);
}

// mma.sync.m16n8k32 .s8 fragments (PTX ISA, "Matrix fragments for mma.m16n8k32"), lane = 4 g + t:
// A register r (4 consecutive k bytes): row g + 8 (r & 1), k 4 t + 16 (r >> 1);
// B register r: column g, k 4 t + 16 r; C element i: row g + 8 (i >> 1), column 2 t + (i & 1).
QF_HOST_DEVICE constexpr int fused_a_frag_row(int lane, int r) { return (lane >> 2) + 8 * (r & 1); }
QF_HOST_DEVICE constexpr int fused_a_frag_k(int lane, int r) { return 4 * (lane & 3) + 16 * (r >> 1); }
QF_HOST_DEVICE constexpr int fused_b_frag_col(int lane) { return lane >> 2; }
QF_HOST_DEVICE constexpr int fused_b_frag_k(int lane, int r) { return 4 * (lane & 3) + 16 * r; }
QF_HOST_DEVICE constexpr int fused_c_frag_row(int lane, int i) { return (lane >> 2) + 8 * (i >> 1); }
QF_HOST_DEVICE constexpr int fused_c_frag_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }

// The tile for M rows and depth K (before the shared-memory check).
inline FusedTile fused_tile_for(int64_t M, int64_t K) {
  if (M <= kFusedSmallMaxM) return FusedTile::k16x64;
  if (M <= kFusedMidMaxM) return FusedTile::k64x64;
  return K <= kFusedWideMaxK ? FusedTile::k64x128 : FusedTile::k32x128;
}

// K slices for the dispatch: 1 below kFusedSplitMinK, else the most of kFusedMaxSplits, 2, 1 whose grid (column blocks x S)
// stays within kFusedSplitMaxBlocks and whose slices are not empty.
inline int64_t fused_splits_for(FusedTile t, int64_t N, int64_t K) {
  if (K < kFusedSplitMinK) return 1;
  const int64_t col_blocks = (N + fused_tile_shape(t).bn - 1) / fused_tile_shape(t).bn;
  for (int64_t s = kFusedMaxSplits; s > 1; s /= 2)
    if (col_blocks * s <= kFusedSplitMaxBlocks && fused_effective_splits(K, s) == s) return s;
  return 1;
}

// True when tile t can run the shape on a device with max_smem bytes of opt-in shared memory per
// block; otherwise false with the first failing rule in *why.
inline bool linear_s8_fused_supported(int64_t M, int64_t N, int64_t K, FusedTile t, int64_t max_smem,
                                      std::string* why, int64_t splits = 1) {
  auto fail = [why](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  const auto s = [](int64_t v) { return std::to_string(v); };
  if (M < 1 || N < 1) return fail("empty problem M=" + s(M) + " N=" + s(N));
  if (K < kFusedKStep || K % kFusedKStep != 0) return fail("K=" + s(K) + " not a positive multiple of 32");
  if (N > INT32_MAX || K > INT32_MAX || M > INT32_MAX) return fail("shape beyond 32-bit indices");
  if (splits < 1 || splits > kFusedSplitLimit) return fail("splits=" + s(splits) + " outside 1..64");
  const FusedTileShape sh = fused_tile_shape(t);
  if ((M + sh.bm - 1) / sh.bm > kFusedMaxGridY)
    return fail("M=" + s(M) + " needs more than 65535 row blocks of " + s(sh.bm));
  const int64_t need = fused_smem_bytes(t, K, splits);
  if (need > max_smem)
    return fail(std::string("tile ") + fused_tile_name(t) + " needs " + s(need) + " bytes of shared memory at K=" +
                s(K) + ", the device allows " + s(max_smem));
  if (why != nullptr) why->clear();
  return true;
}

// True when the activation (float x or int8 codes) and the weight are 16-byte aligned.
inline bool linear_s8_fused_pointers_supported(const void* act, const void* weight, std::string* why) {
  if (reinterpret_cast<uintptr_t>(act) % kFusedAlignment != 0) {
    if (why != nullptr) *why = "activation pointer not 16-byte aligned";
    return false;
  }
  if (reinterpret_cast<uintptr_t>(weight) % kFusedAlignment != 0) {
    if (why != nullptr) *why = "weight pointer not 16-byte aligned";
    return false;
  }
  if (why != nullptr) why->clear();
  return true;
}

}  // namespace qforge::cuda
