// Run-time choice of the fake-quant kernel set: the fastest ISA the CPU has, in the order
// avx512 → avx2 → reference, capped by QFORGE_MAX_ISA or set_max_isa().
#include <atomic>
#include <cstdlib>

#include "fake_quant/fake_quantize_kernels.h"
#include "framework/core/error.h"

namespace qforge::fq {

#ifndef QFORGE_FQ_HAVE_AVX512
const FakeQuantKernels* avx512_kernels() { return nullptr; }
#endif
#ifndef QFORGE_FQ_HAVE_AVX2
const FakeQuantKernels* avx2_kernels() { return nullptr; }
#endif

namespace {

int isa_rank(const std::string& isa) {
  if (isa == "reference") return 0;
  if (isa == "avx2") return 1;
  if (isa == "avx512") return 2;
  throw Error("fake_quant: unknown ISA '" + isa + "' (valid: reference, avx2, avx512)");
}

const FakeQuantKernels& best_kernels(int max_rank) {
  __builtin_cpu_init();
  if (max_rank >= 2 && avx512_kernels() && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return *avx512_kernels();
  if (max_rank >= 1 && avx2_kernels() && __builtin_cpu_supports("avx2")) return *avx2_kernels();
  return reference_kernels();
}

std::atomic<const FakeQuantKernels*>& active_slot() {
  static std::atomic<const FakeQuantKernels*> slot{[] {
    const char* env = std::getenv("QFORGE_MAX_ISA");
    return &best_kernels(env && *env ? isa_rank(env) : 2);
  }()};
  return slot;
}

}  // namespace

const FakeQuantKernels& active_kernels() { return *active_slot().load(std::memory_order_acquire); }

const FakeQuantKernels& set_max_isa(const std::string& isa) {
  const FakeQuantKernels* k = &best_kernels(isa_rank(isa));
  active_slot().store(k, std::memory_order_release);
  return *k;
}

}  // namespace qforge::fq
