// Register-tile scaffolding of the n16k4 / n16k8 GEMV and GEMM kernels, written once: the loop
// over column blocks and row tiles, the MR x NR tile choice, and the pointer set-up of a tile.
// Each ISA file supplies only its tile kernel, as a type
//
//   struct Kernel {
//     using Args = GemvS8Args;                       // what the tile reads and writes
//     static constexpr int kMaxRows = 4;             // MR <= kMaxRows
//     static constexpr int kMaxBlocks = 4;           // NR <= kMaxBlocks 16-column blocks
//     template <int MR, int NR>
//     static void tile(const Args&, int64_t m0, int64_t nb0, Extra...);
//   };
//
// (the pattern of fake_quant/fake_quantize_simd.h; XNNPACK's *.c.in). No intrinsics and no ATen.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/cpu/packed_layout.h"

namespace qforge::kernels::detail {

// Internal linkage: ISA files compiled with different -m flags each keep their own copy (ODR).
namespace {

inline int32_t load_u32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// p[c] = base + (nb0 + c) * block_stride: the first byte of each of the tile's column blocks.
template <int NR, typename T>
inline void block_pointers(const T* base, int64_t nb0, int64_t block_stride, const T* (&p)[NR]) {
  #pragma GCC unroll 16
  for (int c = 0; c < NR; ++c) p[c] = base + (nb0 + c) * block_stride;
}

// p[r] = base + (m0 + r) * ld: the tile's activation rows.
template <int MR, typename T>
inline void row_pointers(const T* base, int64_t m0, int64_t ld, const T* (&p)[MR]) {
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) p[r] = base + (m0 + r) * ld;
}

// A tile's operands: w[c], the first byte of each of its NR column blocks (block_stride apart
// from w_base's block nb0), and a[r], its MR activation rows (ld apart from a_base's row m0).
template <int MR, int NR, typename W, typename A>
struct TileOperands {
  const W* w[NR];
  const A* a[MR];
  TileOperands(const W* w_base, int64_t nb0, int64_t block_stride, const A* a_base, int64_t m0, int64_t ld) {
    block_pointers(w_base, nb0, block_stride, w);
    row_pointers(a_base, m0, ld, a);
  }
};

// Software prefetch of the next tile. A decode GEMV streams its tile's column blocks from DRAM
// side by side; when the blocks are short (K = 768: 7 KB of int4 codes, GPT-2 small; K = 2048:
// 18 KB) the hardware prefetcher restarts on every new stream and one core reads DRAM at 60-80 %
// of the speed it reaches on long ones (docs/kernels.md §4.6c). So a tile
// reading bytes [offset, offset + bytes) of its blocks w[c] prefetches the same bytes `ahead`
// further on, where the next tile reads them, for offsets below kPrefetchSpan: the first 8 KB of
// each next block (all of a short one), after which the hardware prefetcher runs the stream
// (prefetching whole 37 KB blocks measured 0-8 % slower than this at K = 4096). `valid` of the
// NR blocks ahead lie inside the weight (0 from its last tile on). The AVX2 int8-activation GEMVs
// read one block per tile, one stream the hardware follows across blocks: there the prefetch
// measured 5-40 % slower, and they do not call it. __builtin_prefetch: no intrinsic, so every ISA
// file may call it; a prefetch never faults.
inline constexpr int64_t kPrefetchSpan = 8192;

template <int NR, typename T>
__attribute__((always_inline)) inline void prefetch_ahead(const T* const (&w)[NR], int valid, int64_t ahead,
                                                          int64_t offset, int64_t bytes) {
  constexpr int64_t kLine = 64;
  if (offset >= kPrefetchSpan) return;
  #pragma GCC unroll 16
  for (int c = 0; c < NR; ++c) {
    if (c >= valid) break;
    const char* p = reinterpret_cast<const char*>(w[c]) + ahead + offset;
    for (int64_t l = 0; l < bytes; l += kLine) __builtin_prefetch(p + l, 0, 3);
  }
}

// How many of the NR column blocks one tile (NR blocks) past nb0 exist among `blocks`, for a
// tile of `rows` rows: none for any one-row tile of one block, which reads a single stream that
// the hardware prefetcher follows into the next block (for_each_tile's short-block case below;
// also the last tile of a thread's range, and the one-row rest of an M > 1 call, whose block's
// larger row tile has prefetched already).
template <int NR>
inline int blocks_ahead(int64_t nb0, int64_t blocks, int64_t rows) {
  if (NR == 1 && rows == 1) return 0;
  const int64_t left = blocks - (nb0 + NR);
  return left <= 0 ? 0 : left < NR ? static_cast<int>(left) : NR;
}

// The end of chunk i of `per` units (a group's k blocks, a block's k quads), clipped to `total`.
inline int64_t chunk_end(int64_t i, int64_t per, int64_t total) {
  return (i + 1) * per < total ? (i + 1) * per : total;
}

// Every element of a register tile set to v (e.g. the zero vector).
template <int MR, int NR, typename V>
__attribute__((always_inline)) inline void fill_tile(V (&t)[MR][NR], V v) {
  #pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < NR; ++c) t[r][c] = v;
}

template <class Kernel>
using TileFn = decltype(&Kernel::template tile<1, 1>);

// A plain array in this namespace, not std::array: its operator[] would be one symbol shared by
// every ISA file's copy.
template <class Kernel>
struct TileTable {
  TileFn<Kernel> fn[Kernel::kMaxRows * Kernel::kMaxBlocks];
};

// A kernel may declare `static constexpr bool kRowsShareBlock = true`: a one-row call then takes
// tiles of up to kMaxBlocks column blocks, a several-row call tiles of one block (its K-long weight
// panel stays in L1 while up to kMaxRows rows reuse it). Only those MR x NR shapes are
// instantiated (compile time, and no spilling tile<4, 4> that never runs).
template <class Kernel, typename = void>
struct RowsShareBlock : std::false_type {};
template <class Kernel>
struct RowsShareBlock<Kernel, std::enable_if_t<Kernel::kRowsShareBlock>> : std::true_type {};

template <class Kernel>
constexpr bool uses_tile(int mr, int nr) {
  return !RowsShareBlock<Kernel>::value || mr == 1 || nr == 1;
}

template <class Kernel, int MR, int NR>
constexpr TileFn<Kernel> tile_or_null() {
  if constexpr (!uses_tile<Kernel>(MR, NR)) {
    return nullptr;
  } else {
    return &Kernel::template tile<MR, NR>;
  }
}

template <class Kernel, size_t... I>
constexpr TileTable<Kernel> tile_table(std::index_sequence<I...>) {
  return {{tile_or_null<Kernel, static_cast<int>(I) / Kernel::kMaxBlocks + 1,
                        static_cast<int>(I) % Kernel::kMaxBlocks + 1>()...}};
}

// The tile<MR, NR> instance for a tile of mr rows and nr column blocks.
template <class Kernel>
TileFn<Kernel> select_tile(int mr, int nr) {
  static constexpr TileTable<Kernel> kTiles =
      tile_table<Kernel>(std::make_index_sequence<Kernel::kMaxRows * Kernel::kMaxBlocks>());
  return kTiles.fn[(mr - 1) * Kernel::kMaxBlocks + (nr - 1)];
}

// Column blocks [nb_begin, nb_end), all args.m rows. Column blocks outermost: a panel of up to
// max_blocks blocks stays in cache while every row tile streams over it, so weights come from
// memory once. prepare_panel(nb, nr) runs before each panel's row tiles (e.g. to unpack it).
template <class Kernel, class PreparePanel, class... Extra>
void for_each_tile(const typename Kernel::Args& args, int64_t nb_begin, int64_t nb_end, int max_blocks,
                   const PreparePanel& prepare_panel, Extra... extra) {
  for (int64_t nb = nb_begin; nb < nb_end; nb += max_blocks) {
    const int nr = static_cast<int>(nb_end - nb < max_blocks ? nb_end - nb : max_blocks);
    prepare_panel(nb, nr);
    for (int64_t m0 = 0; m0 < args.m; m0 += Kernel::kMaxRows) {
      const int mr = static_cast<int>(args.m - m0 < Kernel::kMaxRows ? args.m - m0 : Kernel::kMaxRows);
      select_tile<Kernel>(mr, nr)(args, m0, nb, extra...);
    }
  }
}

// Bytes of one column block's codes: the length of the stream a tile reads per block.
inline int64_t column_block_bytes(const S4N16K8View& w) { return s4_column_block_offset(w, 1); }
inline int64_t column_block_bytes(const S8N16K4View& w) { return w.kp * kS8BlockN; }
inline int64_t column_block_bytes(const S8GroupView& w) { return w.kp * kS8BlockN; }

// A one-row decode GEMV whose column blocks are shorter than this reads one block per tile: the
// blocks lie one after another, so the whole weight is then a single stream, which the hardware
// prefetcher follows from block to block at the speed of a sequential read. Several blocks per
// tile are several short streams, each restarting the prefetcher (prefetch_ahead only partly
// makes up for it). Measured on one core (AMD EPYC Zen 5, docs/kernels.md §4.6c), one block per
// tile against four with prefetch_ahead: faster up to K = 3072 for int4 (27 KB blocks) and at
// K = 768 for int8 (12 KB); for int8 at K = 1536-2048 (24-32 KB) the rounds split; slower from
// int8 K = 3072 (48 KB) and int4 K = 4096 (36 KB), where four long streams keep more of DRAM busy.
inline constexpr int64_t kOneStreamBytes = 28 * 1024;

// A kernel may declare `static constexpr bool kOneStreamWhenShort = true` (its tiles read the
// column blocks of args.w and prefetch through blocks_ahead / prefetch_ahead). The AVX-512 decode
// and weight-only GEMVs do; the AVX2 ones read one block per tile at any K already, except
// gemv_f32s8gf32_n16k4_avx2 (two), not measured in this form.
template <class Kernel, typename = void>
struct OneStreamWhenShort : std::false_type {};
template <class Kernel>
struct OneStreamWhenShort<Kernel, std::enable_if_t<Kernel::kOneStreamWhenShort>> : std::true_type {};

// The common case: nothing to prepare per panel; tiles of up to Kernel::kMaxBlocks blocks, or of
// one block for several rows when the kernel declares kRowsShareBlock, or for one row when it
// declares kOneStreamWhenShort and its blocks are short (kOneStreamBytes).
template <class Kernel>
void for_each_tile(const typename Kernel::Args& args, int64_t nb_begin, int64_t nb_end) {
  int max_blocks = RowsShareBlock<Kernel>::value && args.m > 1 ? 1 : Kernel::kMaxBlocks;
  if constexpr (OneStreamWhenShort<Kernel>::value) {
    if (args.m == 1 && column_block_bytes(args.w) < kOneStreamBytes) max_blocks = 1;
  }
  for_each_tile<Kernel>(args, nb_begin, nb_end, max_blocks, [](int64_t, int) {});
}

}  // namespace
}  // namespace qforge::kernels::detail
