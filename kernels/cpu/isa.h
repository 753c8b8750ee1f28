// Instruction-set levels the CPU kernels are built for, what this CPU supports, and the user cap
// (set_max_isa / QFORGE_MAX_ISA) that lets tests and benchmarks force the fallback chain.
#pragma once

#include <string>
#include <string_view>

namespace qforge::kernels {

// Ordered: a level implies every level below it (avx512vnni => avx512 => avx2 => reference).
enum class Isa : int {
  kReference = 0,  // scalar C++, always available
  kAvx2 = 1,       // AVX2 + FMA + F16C
  kAvx512 = 2,     // AVX-512 F/BW/VL/DQ
  kAvx512Vnni = 3, // AVX-512 + VNNI (VPDPBUSD)
};

const char* isa_name(Isa isa);

// Parses "reference", "avx2", "avx512", "avx512vnni" (case-sensitive); throws qforge::Error.
Isa isa_from_name(std::string_view name);

// Highest level this CPU supports (checked once with __builtin_cpu_supports).
Isa cpu_isa();

// True when kernels for `isa` were compiled into this build (the compiler supported the flags).
bool isa_compiled(Isa isa);

// Caps the levels the dispatchers may use. The initial cap comes from the environment variable
// QFORGE_MAX_ISA when set (same names), else it is avx512vnni (no cap). Thread-safe.
void set_max_isa(Isa isa);
void set_max_isa(std::string_view name);
Isa max_isa();

// True when kernels of level `isa` may run here: compiled in, supported by the CPU and not
// capped. Otherwise false, and *why (when given) says which of the three failed.
bool isa_usable(Isa isa, std::string* why = nullptr);

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

}  // namespace qforge::kernels
