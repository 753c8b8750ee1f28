// When the int4 weight-only GEMV (gemv_f32s4_cuda) serves a call; pure host code (no CUDA
// headers) so the CPU test suite and plan_linear_cuda() read the same rules the launcher checks.
// The kernel reads each weight row as 32-bit words of eight nibbles and the activations as
// float4, and keeps one accumulator per (row of x, weight row) in registers:
//   - 1 <= M <= kGemvS4MaxM (decode-sized calls; larger M dequantize once and run a GEMM);
//   - K a multiple of 8 (a row starts on a word: row n begins at nibble n * K);
//   - group_size a multiple of 8 (a word never straddles two scale groups);
//   - x 16-byte aligned, packed codes 4-byte aligned.
// The tensor-core GEMV (gemv_f32s4_mma_cuda) reads 128 codes of a row per warp step with one
// 16-byte load a lane and sums one scale group per mma chain, so it takes:
//   - 1 <= M <= kGemvS4MaxM;
//   - K and group_size multiples of 128 (a row is whole 16-byte words; a step is one group);
//   - x and the packed codes 16-byte aligned.
// Among the two tensor-core launchers, 2 <= M <= kGemvS4MaxM runs the staged one
// (gemv_f32s4_mma_staged_cuda: x split once per call, not once per block of weight rows), which
// the H200 measured at 0.97-1.74x cuBLASLt fp16 at M = 4..16. At M = 1 the shape decides: the
// staged one (two launches) measured 1.72x / 1.63x fp16 on the Llama-3-8B shapes (N or K = 14336)
// against 1.55x / 1.44x for the one-launch gemv_f32s4_mma_cuda, but 1.47x against 1.52x at
// 4096 x 4096, where its extra launch is not repaid (docs/performance.md, "GPU: NVIDIA H200").
// Re-timed on tiled codes (2026-11-28, H200, graph replays): 4096 x 4096 0.0067 ms one launch
// against 0.0070 staged; 14336 x 4096 0.0166 against 0.0139; 4096 x 14336 0.0170 against 0.0150.
// So M = 1 stages when N or K reaches kGemvS4MmaStagedM1MinDim (between the measured 4096 and
// 14336; set it from a sweep of sizes in between when one is timed).
#pragma once

#include <cstdint>
#include <string>

namespace qforge::cuda {

constexpr int64_t kGemvS4MaxM = 16;
constexpr int64_t kGemvS4KMultiple = 8;
constexpr uintptr_t kGemvS4XAlignment = 16;
constexpr uintptr_t kGemvS4CodeAlignment = 4;
constexpr int64_t kGemvS4MmaKMultiple = 128;
constexpr uintptr_t kGemvS4MmaCodeAlignment = 16;
constexpr int64_t kGemvS4MmaStagedMinM = 2;
constexpr int64_t kGemvS4MmaStagedM1MinDim = 8192;

// True when an M x N x K call runs the staged tensor-core launcher (the rule above).
inline bool gemv_f32s4_mma_staged_for(int64_t M, int64_t N, int64_t K) {
  return M >= kGemvS4MmaStagedMinM || N >= kGemvS4MmaStagedM1MinDim || K >= kGemvS4MmaStagedM1MinDim;
}

// The tensor-core launcher for an M x N x K call (both compute the same result, bit for bit).
inline const char* gemv_f32s4_mma_kernel_for(int64_t M, int64_t N, int64_t K) {
  return gemv_f32s4_mma_staged_for(M, N, K) ? "gemv_f32s4_mma_staged_cuda" : "gemv_f32s4_mma_cuda";
}

// True when the shape meets the rules above; otherwise false with the first failing rule in *why.
inline bool gemv_f32s4_supported(int64_t M, int64_t K, int64_t group_size, std::string* why) {
  auto fail = [why](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  const auto s = [](int64_t v) { return std::to_string(v); };
  if (M < 1 || M > kGemvS4MaxM) return fail("M=" + s(M) + " outside 1.." + s(kGemvS4MaxM));
  if (K <= 0 || K % kGemvS4KMultiple != 0) return fail("K=" + s(K) + " not a positive multiple of 8");
  if (group_size <= 0 || group_size % kGemvS4KMultiple != 0)
    return fail("group_size=" + s(group_size) + " not a multiple of 8");
  if (why != nullptr) why->clear();
  return true;
}

// True when x is 16-byte and the codes 4-byte aligned; otherwise false with the reason.
inline bool gemv_f32s4_pointers_supported(const void* x, const void* packed, std::string* why) {
  if (reinterpret_cast<uintptr_t>(x) % kGemvS4XAlignment != 0) {
    if (why != nullptr) *why = "x pointer not 16-byte aligned";
    return false;
  }
  if (reinterpret_cast<uintptr_t>(packed) % kGemvS4CodeAlignment != 0) {
    if (why != nullptr) *why = "packed codes pointer not 4-byte aligned";
    return false;
  }
  if (why != nullptr) why->clear();
  return true;
}

// The rules of gemv_f32s4_mma_cuda (above): true, or false with the first failing rule in *why.
inline bool gemv_f32s4_mma_supported(int64_t M, int64_t K, int64_t group_size, std::string* why) {
  if (!gemv_f32s4_supported(M, K, group_size, why)) return false;
  const auto s = [](int64_t v) { return std::to_string(v); };
  std::string reason;
  if (K % kGemvS4MmaKMultiple != 0) {
    reason = "K=" + s(K) + " not a multiple of 128";
  } else if (group_size % kGemvS4MmaKMultiple != 0) {
    reason = "group_size=" + s(group_size) + " not a multiple of 128";
  }
  if (why != nullptr) *why = reason;
  return reason.empty();
}

// True when x and the packed codes are both 16-byte aligned; otherwise false with the reason.
inline bool gemv_f32s4_mma_pointers_supported(const void* x, const void* packed, std::string* why) {
  if (!gemv_f32s4_pointers_supported(x, packed, why)) return false;
  if (reinterpret_cast<uintptr_t>(packed) % kGemvS4MmaCodeAlignment != 0) {
    if (why != nullptr) *why = "packed codes pointer not 16-byte aligned";
    return false;
  }
  return true;
}

}  // namespace qforge::cuda
