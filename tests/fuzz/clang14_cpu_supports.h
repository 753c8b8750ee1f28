// Fuzz build only, force-included into framework/core/isa.cpp when clang < 15 builds it: clang 14's
// __builtin_cpu_supports rejects "f16c" at compile time, so that one feature is read from CPUID
// here; the others go to the builtin as before (same run-time ISA choice as the g++ build).
#pragma once

#include <cpuid.h>

#include <cstring>

static inline bool qforge_fuzz_cpu_supports(const char* feature) {
  if (std::strcmp(feature, "f16c") == 0) {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
  }
  if (std::strcmp(feature, "avx2") == 0) return __builtin_cpu_supports("avx2");
  if (std::strcmp(feature, "fma") == 0) return __builtin_cpu_supports("fma");
  if (std::strcmp(feature, "avx512f") == 0) return __builtin_cpu_supports("avx512f");
  if (std::strcmp(feature, "avx512bw") == 0) return __builtin_cpu_supports("avx512bw");
  if (std::strcmp(feature, "avx512vl") == 0) return __builtin_cpu_supports("avx512vl");
  if (std::strcmp(feature, "avx512dq") == 0) return __builtin_cpu_supports("avx512dq");
  if (std::strcmp(feature, "avx512vnni") == 0) return __builtin_cpu_supports("avx512vnni");
  return false;  // a feature isa.cpp starts asking for: the reference kernels are always correct
}
#define __builtin_cpu_supports(feature) qforge_fuzz_cpu_supports(feature)
