// The ISA levels compiled into qforge_kernels_cpu (the CPU check and cap: framework/core/isa).
#include "kernels/cpu/isa.h"

namespace qforge::kernels {

bool isa_compiled(Isa isa) {
  switch (isa) {
    case Isa::kReference: return true;
    case Isa::kAvx2:
#ifdef QFORGE_KERNELS_AVX2
      return true;
#else
      return false;
#endif
    case Isa::kAvx512:
#ifdef QFORGE_KERNELS_AVX512
      return true;
#else
      return false;
#endif
    case Isa::kAvx512Vnni:
#ifdef QFORGE_KERNELS_AVX512VNNI
      return true;
#else
      return false;
#endif
  }
  return false;
}

bool isa_usable(Isa isa, std::string* why) {
  if (!isa_compiled(isa)) {
    if (why != nullptr) *why = std::string(isa_name(isa)) + " not compiled in";
    return false;
  }
  return isa_allowed(isa, why);
}

}  // namespace qforge::kernels
