// Decode-size kernel choice of the packed-linear ops, read from their kernel tables without data.
#include "kernels/cpu/kernel_choice.h"

#include "kernels/cpu/gemv_s4.h"
#include "kernels/cpu/gemv_s8.h"
#include "kernels/cpu/linear_decode.h"
#include "kernels/cpu/linear_weight_only.h"
#include "kernels/cpu/lut_linear.h"

namespace qforge::kernels {

namespace {

template <typename Problem>
RunInfo plan_table(const KernelTable<Problem>& table, const Problem& p, Isa usable) {
  RunInfo ri;
  select_kernel(table, p, IsaGate::up_to(usable), &ri);
  return ri;
}

}  // namespace

const char* to_string(LinearOp op) {
  switch (op) {
    case LinearOp::kS8S8: return "s8s8";
    case LinearOp::kS8S4: return "s8s4";
    case LinearOp::kF32S8: return "f32s8";
    case LinearOp::kF32S4: return "f32s4";
    case LinearOp::kF32Lut: return "f32lut";
    case LinearOp::kQ8S8: return "q8s8";
    case LinearOp::kQ8S4: return "q8s4";
  }
  return "?";
}

RunInfo choose_kernel(LinearOp op, Isa usable, int64_t m, int64_t group_size) {
  switch (op) {
    case LinearOp::kS8S8: {
      GemvS8Problem p;
      p.m = m;
      return plan_table(gemv_s8_kernels(), p, usable);
    }
    case LinearOp::kS8S4: {
      GemvS4Problem p;
      p.m = m;
      p.w.group_size = group_size;
      return plan_table(gemv_s4_kernels(), p, usable);
    }
    case LinearOp::kF32S8: {
      LinearF32S8Problem p;
      p.m = m;
      return plan_table(linear_f32s8_kernels(), p, usable);
    }
    case LinearOp::kF32S4: {
      LinearF32S4Problem p;
      p.m = m;
      p.w.group_size = group_size;
      return plan_table(linear_f32s4_kernels(), p, usable);
    }
    case LinearOp::kF32Lut: {
      LutProblem p;
      p.m = m;
      return plan_table(lut_linear_kernels(), p, usable);
    }
    case LinearOp::kQ8S8: {
      LinearQ8S8Problem p;
      p.m = m;
      return plan_table(linear_q8s8_kernels(), p, usable);
    }
    case LinearOp::kQ8S4: {
      LinearQ8S4Problem p;
      p.m = m;
      p.w.group_size = group_size;
      p.w.groups = group_size > 0 ? 2 : 1;  // 0: one group per row (any K fits), else the size decides
      return plan_table(linear_q8s4_kernels(), p, usable);
    }
  }
  return RunInfo{};
}

RunInfo choose_decode_kernel(LinearOp op, Isa usable, int64_t group_size) {
  return choose_kernel(op, usable, 1, group_size);
}

}  // namespace qforge::kernels
