// Decode-size kernel choice of the packed-linear ops, read from their kernel tables without data.
#include "kernels/cpu/kernel_choice.h"

#include <algorithm>

#include "kernels/cpu/conv_s8.h"
#include "kernels/cpu/fp4_linear.h"
#include "kernels/cpu/gemv_s4.h"
#include "kernels/cpu/gemv_s8.h"
#include "kernels/cpu/linear_decode.h"
#include "kernels/cpu/linear_s8g.h"
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

// The int4 ops' problems carry the group size; the others have none. The block-32 decode table
// (LinearQ8S4Problem, the same struct) also reads whether a row has several groups: 0 is one group.
// The weight-only int4 problems (exact and block-32) also carry the layout.
template <typename Problem>
void set_group(Problem&, int64_t, S4Layout) {}
void set_group(GemvS4Problem& p, int64_t g, S4Layout) { p.w.group_size = g; }
void set_group(LinearF32S4Problem& p, int64_t g, S4Layout layout) {
  p.w.group_size = g;
  p.w.groups = g > 0 ? 2 : 1;
  p.w.layout = layout;
}
void set_group(LinearS8GProblem& p, int64_t g, S4Layout) {
  p.w.group_size = g;
  p.w.groups = g > 0 ? 2 : 1;
}

// f(table, at) with at(m) the table's data-free problem of m rows.
template <typename Problem, typename F>
auto with_table(const KernelTable<Problem>& table, int64_t group_size, const F& f,
                S4Layout layout = S4Layout::kN16K8) {
  return f(table, [group_size, layout](int64_t m) {
    Problem p;
    p.m = m;
    set_group(p, group_size, layout);
    return p;
  });
}

template <typename F>
auto with_op_table(LinearOp op, int64_t group_size, S4Layout layout, const F& f) {
  switch (op) {
    case LinearOp::kS8S8: return with_table(gemv_s8_kernels(), group_size, f);
    case LinearOp::kS8S4: return with_table(gemv_s4_kernels(), group_size, f);
    case LinearOp::kF32S8: return with_table(linear_f32s8_kernels(), group_size, f);
    case LinearOp::kF32S4: return with_table(linear_f32s4_kernels(), group_size, f, layout);
    case LinearOp::kQ8S8: return with_table(linear_q8s8_kernels(), group_size, f);
    case LinearOp::kQ8S4: return with_table(linear_q8s4_kernels(), group_size, f, layout);
    case LinearOp::kF32S8G: return with_table(linear_f32s8g_kernels(), group_size, f);
    case LinearOp::kQ8S8G: return with_table(linear_q8s8g_kernels(), group_size, f);
    case LinearOp::kF32Fp4: return with_table(fp4_linear_kernels(), group_size, f);
    case LinearOp::kF32Lut: break;
  }
  return with_table(lut_linear_kernels(), group_size, f);
}

ConvS8Problem conv_problem(bool int4, bool depthwise, int64_t m) {
  ConvS8Problem p;
  p.int4 = int4;
  p.depthwise = depthwise;
  p.m = m;
  return p;
}

// The chain the convolution table's entry `e` runs: im2col's chunks through the Linear op's
// GEMM, or oneDNN's convolution and its epilogue.
RunInfo conv_chain(const KernelEntry<ConvS8Problem>& e, const RunInfo& entry, bool int4, Isa usable, int64_t m,
                   int64_t k) {
  if (conv_entry_kind(e) == ConvEntryKind::kOneDnn) return RunInfo{entry.kernel + "+dequantize_s32_f32", entry.fallback};
  if (conv_entry_kind(e) == ConvEntryKind::kDepthwise) return entry;  // one kernel, no GEMM behind it
  const RunInfo gemm = int4 ? choose_kernel(LinearOp::kS8S4, usable, std::min(m, kMinConvChunkRows), k)
                            : choose_kernel(LinearOp::kS8S8, usable, std::min(m, kMinConvChunkRows));
  RunInfo ri{"im2col_s8+" + gemm.kernel, entry.fallback};
  if (!gemm.fallback.empty()) ri.fallback += (ri.fallback.empty() ? "" : "; ") + gemm.fallback;
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
    case LinearOp::kF32Fp4: return "f32fp4";
    case LinearOp::kQ8S8: return "q8s8";
    case LinearOp::kQ8S4: return "q8s4";
    case LinearOp::kF32S8G: return "f32s8g";
    case LinearOp::kQ8S8G: return "q8s8g";
  }
  return "?";
}

RunInfo choose_kernel(LinearOp op, Isa usable, int64_t m, int64_t group_size, S4Layout layout) {
  return with_op_table(op, group_size, layout,
                       [&](const auto& table, const auto& at) { return plan_table(table, at(m), usable); });
}

RunInfo choose_decode_kernel(LinearOp op, Isa usable, int64_t group_size, S4Layout layout) {
  return choose_kernel(op, usable, 1, group_size, layout);
}

int64_t choose_large_m(LinearOp op, Isa usable, int64_t group_size, RunInfo* large, S4Layout layout) {
  return with_op_table(op, group_size, layout, [&](const auto& table, const auto& at) {
    return switch_m(table, at, 1, IsaGate::up_to(usable), large);
  });
}

ConvChoice choose_conv_kernel(bool int4, Isa usable, int64_t k, bool depthwise, int64_t groups) {
  ConvChoice c;
  if (groups > 1 && !depthwise) {
    ConvS8Problem p = conv_problem(int4, false, kMinConvChunkRows);
    p.g.groups = groups;
    std::string why;
    for (const KernelEntry<ConvS8Problem>& e : conv_s8_kernels()) {
      if (conv_entry_kind(e) != ConvEntryKind::kOneDnn) continue;
      if (!e.serves(p)) {
        why = std::string(e.name) + ": int8 weights only";
      } else if (IsaGate::up_to(usable).allows(e.isa, &why)) {
        c.kernel = RunInfo{std::string(e.name) + "+dequantize_s32_f32 (" + std::to_string(groups) + " groups in one call)", ""};
        c.needs_onednn_copy = true;
        return c;
      } else {
        why = std::string(e.name) + ": " + why;
      }
    }
    c = choose_conv_kernel(int4, usable, k, false, 1);
    const std::string per = " per group (" + std::to_string(groups) + " groups)";
    c.kernel.kernel += per;
    c.kernel.fallback = why + (c.kernel.fallback.empty() ? "" : "; ") + c.kernel.fallback;
    if (c.large_rows > 0) c.large_kernel.kernel += per;
    return c;
  }
  const auto at = [int4, depthwise](int64_t m) { return conv_problem(int4, depthwise, m); };
  const IsaGate gate = IsaGate::up_to(usable);
  // The entry for m rows, its record in *ri, its chain added to the plan.
  const auto plan_rows = [&](int64_t m, RunInfo* ri) {
    RunInfo entry;
    const KernelEntry<ConvS8Problem>& e = select_kernel(conv_s8_kernels(), at(m), gate, &entry);
    *ri = conv_chain(e, entry, int4, usable, m, k);
    c.needs_onednn_copy = c.needs_onednn_copy || conv_entry_kind(e) == ConvEntryKind::kOneDnn;
  };
  plan_rows(kMinConvChunkRows, &c.kernel);
  c.large_rows = switch_m(conv_s8_kernels(), at, kMinConvChunkRows, gate, nullptr);
  if (c.large_rows > 0) plan_rows(c.large_rows, &c.large_kernel);
  return c;
}
}  // namespace qforge::kernels
