// When the int8 weight-only GEMV (gemv_f32s8_cuda) serves a call; pure host code (no CUDA
// headers) so the CPU test suite and plan_linear_cuda() read the same rules the launcher checks.
// The kernel reads each weight row in 16-byte (M = 1), 8-byte (M = 2, 5..16) or 4-byte (M = 3..4)
// steps, narrower where K or the codes' alignment does not allow them, the activations as float4,
// and keeps one accumulator per (row of x, weight row) in registers:
//   - 1 <= M <= kGemvS8MaxM (decode-sized calls; larger M dequantize and run at::linear);
//   - K a multiple of 4 (row n starts on a 32-bit word: byte n * K);
//   - x 16-byte aligned (float4 loads), codes 4-byte aligned.
#pragma once

#include <cstdint>
#include <string>

namespace qforge::cuda {

constexpr int64_t kGemvS8MaxM = 16;
constexpr int64_t kGemvS8KMultiple = 4;
constexpr uintptr_t kGemvS8XAlignment = 16;
constexpr uintptr_t kGemvS8CodeAlignment = 4;

// True when the shape meets the rules above; otherwise false with the first failing rule in *why.
inline bool gemv_f32s8_supported(int64_t M, int64_t K, std::string* why) {
  const auto s = [](int64_t v) { return std::to_string(v); };
  std::string reason;
  if (M < 1 || M > kGemvS8MaxM) {
    reason = "M=" + s(M) + " outside 1.." + s(kGemvS8MaxM);
  } else if (K <= 0 || K % kGemvS8KMultiple != 0) {
    reason = "K=" + s(K) + " not a positive multiple of 4";
  }
  if (why != nullptr) *why = reason;
  return reason.empty();
}

// True when x is 16-byte and the codes 4-byte aligned; otherwise false with the reason.
inline bool gemv_f32s8_pointers_supported(const void* x, const void* codes, std::string* why) {
  std::string reason;
  if (reinterpret_cast<uintptr_t>(x) % kGemvS8XAlignment != 0) {
    reason = "x pointer not 16-byte aligned";
  } else if (reinterpret_cast<uintptr_t>(codes) % kGemvS8CodeAlignment != 0) {
    reason = "int8 codes pointer not 4-byte aligned";
  }
  if (why != nullptr) *why = reason;
  return reason.empty();
}

}  // namespace qforge::cuda
