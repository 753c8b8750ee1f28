// Run-time choice of the fake-quant kernel set: the fastest ISA the CPU has, in the order
// avx512 → avx2 → reference, capped by QFORGE_MAX_ISA or set_max_isa() (framework/core/isa.h).
#include "fake_quant/fake_quantize_kernels.h"
#include "framework/core/isa.h"

namespace qforge::fq {

#ifndef QFORGE_FQ_HAVE_AVX512
const FakeQuantKernels* avx512_kernels() { return nullptr; }
#endif
#ifndef QFORGE_FQ_HAVE_AVX2
const FakeQuantKernels* avx2_kernels() { return nullptr; }
#endif

// Recomputed per call from the one cap (an atomic load and two compares), so set_max_isa() and
// ScopedMaxIsa switch fake-quant and the integer kernels together.
const FakeQuantKernels& active_kernels() {
  const Isa isa = usable_isa();
  if (isa >= Isa::kAvx512 && avx512_kernels()) return *avx512_kernels();
  if (isa >= Isa::kAvx2 && avx2_kernels()) return *avx2_kernels();
  return reference_kernels();
}

}  // namespace qforge::fq
