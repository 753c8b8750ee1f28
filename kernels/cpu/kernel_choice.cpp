// Decode-size kernel choice of the packed-linear dispatchers (gemv_s8.cpp, gemv_s4.cpp,
// linear_weight_only.cpp, lut_linear.cpp), without data.
#include "kernels/cpu/kernel_choice.h"

#include <string>

#include "kernels/cpu/packed_layout.h"

namespace qforge::kernels {

namespace {

// True when level `isa` is compiled in and within `usable`; otherwise *why says which.
bool level_ok(Isa isa, Isa usable, std::string* why) {
  if (!isa_compiled(isa)) {
    *why = std::string(isa_name(isa)) + " not compiled in";
    return false;
  }
  if (static_cast<int>(isa) > static_cast<int>(usable)) {
    *why = std::string(isa_name(isa)) + " not usable here (highest usable level: " + isa_name(usable) + ")";
    return false;
  }
  return true;
}

}  // namespace

const char* to_string(LinearOp op) {
  switch (op) {
    case LinearOp::kS8S8: return "s8s8";
    case LinearOp::kS8S4: return "s8s4";
    case LinearOp::kF32S8: return "f32s8";
    case LinearOp::kF32S4: return "f32s4";
    case LinearOp::kF32Lut: return "f32lut";
  }
  return "?";
}

RunInfo choose_decode_kernel(LinearOp op, Isa usable, int64_t group_size) {
  RunInfo ri;
  std::string why;
  // Each list below is its dispatcher's, in the same order, ending at the reference twin.
  struct Candidate {
    const char* name;
    Isa isa;
    bool needs_groups_of_8;
  };
  auto pick = [&](std::initializer_list<Candidate> list, const char* reference = "reference") {
    const bool groups_fit = group_size % kS4BlockK == 0;
    for (const Candidate& c : list) {
      if (!level_ok(c.isa, usable, &why)) {
        ri.skip(c.name, why);
      } else if (c.needs_groups_of_8 && !groups_fit) {
        ri.skip(c.name, "group_size=" + std::to_string(group_size) + " not a multiple of 8");
      } else {
        ri.kernel = c.name;
        return;
      }
    }
    ri.kernel = reference;
  };
  switch (op) {
    case LinearOp::kS8S8:
      pick({{"gemv_u8s8s32_n16k4_avx512vnni", Isa::kAvx512Vnni, false},
            {"gemv_s8s8s32_n16k4_avx2", Isa::kAvx2, false}});
      break;
    case LinearOp::kS8S4:
      pick({{"gemv_s8s4f32_n16k8_avx512vnni", Isa::kAvx512Vnni, true},
            {"gemv_s8s4f32_n16k8_avx2", Isa::kAvx2, true}});
      break;
    case LinearOp::kF32S8: pick({{"gemv_f32s8f32_n16k4_avx512", Isa::kAvx512, false}}); break;
    case LinearOp::kF32S4: pick({{"gemv_f32s4f32_n16k8_avx512", Isa::kAvx512, true}}); break;
    case LinearOp::kF32Lut:
      pick({{"gemv_f32lut_avx512", Isa::kAvx512, false}, {"gemv_f32lut_avx2", Isa::kAvx2, false}},
           "linear_f32lut_reference");
      break;
  }
  return ri;
}

}  // namespace qforge::kernels
