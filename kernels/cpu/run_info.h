// What a dispatcher ran: the kernel's name and, when it is not the first choice, why the faster
// kernels before it in the ordered list were skipped.
#pragma once

#include <string>

namespace qforge::kernels {

struct RunInfo {
  std::string kernel;    // e.g. "gemv_u8s8s32_n16k4_avx512vnni", "gemm_s8s8s32_onednn", "reference"
  std::string fallback;  // empty when the first choice ran, else "avx512vnni not supported ..."

  // Records that a candidate was skipped and why (joined with "; ").
  void skip(const std::string& candidate, const std::string& why) {
    if (!fallback.empty()) fallback += "; ";
    fallback += candidate + ": " + why;
  }
};

}  // namespace qforge::kernels
