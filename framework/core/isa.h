// Instruction-set levels, what this CPU supports, and the user cap (set_max_isa / QFORGE_MAX_ISA)
// that lets tests and benchmarks force the fallback chains. The one ISA detector: the kernel
// dispatchers of fake_quant/ and kernels/cpu/ both read it, each adding what it compiled in.
#pragma once

#include <string>
#include <string_view>

namespace qforge {

// Ordered: a level implies every level below it (avx512vnni => avx512 => avx2 => reference).
enum class Isa : int {
  kReference = 0,  // scalar C++, always available
  kAvx2 = 1,       // AVX2 + FMA + F16C
  kAvx512 = 2,     // AVX-512 F/BW/VL/DQ
  kAvx512Vnni = 3, // AVX-512 + VNNI (VPDPBUSD)
};

const char* isa_name(Isa isa);

// Parses "reference", "avx2", "avx512", "avx512vnni" (case-sensitive); throws qforge::Error with
// the closest valid name.
Isa isa_from_name(std::string_view name);

// Highest level this CPU supports (checked once with __builtin_cpu_supports).
Isa cpu_isa();

// Caps the levels every dispatcher may use. The initial cap comes from the environment variable
// QFORGE_MAX_ISA when set (same names), else it is avx512vnni (no cap). Thread-safe.
void set_max_isa(Isa isa);
void set_max_isa(std::string_view name);
Isa max_isa();

// The level dispatchers may use: min(cpu_isa(), max_isa()).
Isa usable_isa();

// True when this CPU supports `isa` and the cap allows it; otherwise false, and *why (when given)
// says which. A library adds its own "compiled in" check (kernels::isa_usable).
bool isa_allowed(Isa isa, std::string* why = nullptr);

// RAII cap for tests: caps to `isa` for the scope's lifetime, then restores the previous cap.
class ScopedMaxIsa {
 public:
  explicit ScopedMaxIsa(Isa isa) : previous_(max_isa()) { set_max_isa(isa); }
  ~ScopedMaxIsa() { set_max_isa(previous_); }
  ScopedMaxIsa(const ScopedMaxIsa&) = delete;
  ScopedMaxIsa& operator=(const ScopedMaxIsa&) = delete;

 private:
  Isa previous_;
};

}  // namespace qforge
