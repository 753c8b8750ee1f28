// Run-time CPU feature detection and the ISA cap used by every kernel dispatcher.
#include "framework/core/isa.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "framework/core/error.h"

namespace qforge {

namespace {

constexpr Isa kAllIsas[] = {Isa::kReference, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Vnni};

Isa detect_cpu_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // F16C belongs to the AVX2 level: the int4 kernels convert their fp16 group scales with it.
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq");
  const bool vnni = avx512 && __builtin_cpu_supports("avx512vnni");
  if (vnni) return Isa::kAvx512Vnni;
  if (avx512) return Isa::kAvx512;
  if (avx2) return Isa::kAvx2;
#endif
  return Isa::kReference;
}

Isa initial_cap() {
  const char* env = std::getenv("QFORGE_MAX_ISA");
  if (env == nullptr || *env == '\0') return Isa::kAvx512Vnni;
  return isa_from_name(env);
}

std::atomic<int>& cap_storage() {
  static std::atomic<int> cap{static_cast<int>(initial_cap())};
  return cap;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kReference: return "reference";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Vnni: return "avx512vnni";
  }
  return "unknown";
}

Isa isa_from_name(std::string_view name) {
  std::vector<std::string> names;
  for (Isa isa : kAllIsas) {
    if (name == isa_name(isa)) return isa;
    names.emplace_back(isa_name(isa));
  }
  const std::string hint = closest_match(std::string(name), names);
  QF_REQUIRE(false, "qforge: unknown ISA '", name, "' (QFORGE_MAX_ISA / set_max_isa)",
             hint.empty() ? std::string() : "; did you mean '" + hint + "'?",
             " Valid: reference, avx2, avx512, avx512vnni");
  return Isa::kReference;
}

Isa cpu_isa() {
  static const Isa detected = detect_cpu_isa();
  return detected;
}

void set_max_isa(Isa isa) { cap_storage().store(static_cast<int>(isa)); }
void set_max_isa(std::string_view name) { set_max_isa(isa_from_name(name)); }
Isa max_isa() { return static_cast<Isa>(cap_storage().load()); }

Isa usable_isa() { return std::min(cpu_isa(), max_isa()); }

bool isa_allowed(Isa isa, std::string* why) {
  auto fail = [&](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  if (static_cast<int>(cpu_isa()) < static_cast<int>(isa)) {
    return fail(std::string(isa_name(isa)) + " not supported by this CPU");
  }
  if (static_cast<int>(max_isa()) < static_cast<int>(isa)) {
    return fail(std::string(isa_name(isa)) + " capped by set_max_isa(\"" + isa_name(max_isa()) + "\")");
  }
  return true;
}

}  // namespace qforge
