// Which instruction-set levels the CPU kernels were compiled for. Detection and the cap live in
// framework/core/isa.h (one detector for every dispatcher); this adds the "compiled in" half.
#pragma once

#include <string>

#include "framework/core/isa.h"

namespace qforge::kernels {

using qforge::Isa;
using qforge::isa_from_name;
using qforge::isa_name;
using qforge::max_isa;
using qforge::ScopedMaxIsa;
using qforge::set_max_isa;
using qforge::cpu_isa;

// True when kernels for `isa` were compiled into this build (the compiler supported the flags).
bool isa_compiled(Isa isa);

// True when kernels of level `isa` may run here: compiled in, supported by the CPU and not
// capped. Otherwise false, and *why (when given) says which of the three failed.
bool isa_usable(Isa isa, std::string* why = nullptr);

}  // namespace qforge::kernels
