// One ordered table per kernel op: {name, ISA, predicates, function}. The op's dispatcher runs the
// first entry whose ISA is usable and whose predicates hold; plans (kernel_choice.h) walk the same
// table with an ISA level instead of the machine's; tests iterate it entry by entry. (ggml's
// type_traits_cpu[], oneDNN's implementation lists.) No ATen here: ISA files may include it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/run_info.h"

// The function of an entry whose ISA files are not compiled in: never called (isa_compiled says
// no first), so the table still lists the entry and says why it was skipped.
#ifdef QFORGE_KERNELS_AVX2
#define QF_KERNEL_AVX2(fn) (fn)
#else
#define QF_KERNEL_AVX2(fn) nullptr
#endif
#ifdef QFORGE_KERNELS_AVX512
#define QF_KERNEL_AVX512(fn) (fn)
#else
#define QF_KERNEL_AVX512(fn) nullptr
#endif
#ifdef QFORGE_KERNELS_AVX512VNNI
#define QF_KERNEL_AVX512VNNI(fn) (fn)
#else
#define QF_KERNEL_AVX512VNNI(fn) nullptr
#endif

namespace qforge::kernels {

// Which ISA levels an entry may use: the machine's (compiled in, CPU, cap) when running, or every
// compiled level up to a given one when planning without running.
class IsaGate {
 public:
  static IsaGate machine() { return IsaGate(false, Isa::kReference); }
  static IsaGate up_to(Isa usable) { return IsaGate(true, usable); }

  bool allows(Isa isa, std::string* why) const {
    if (!planning_) return isa_usable(isa, why);
    if (!isa_compiled(isa)) {
      *why = std::string(isa_name(isa)) + " not compiled in";
      return false;
    }
    if (static_cast<int>(isa) > static_cast<int>(usable_)) {
      *why = std::string(isa_name(isa)) + " not usable here (highest usable level: " + isa_name(usable_) + ")";
      return false;
    }
    return true;
  }

 private:
  IsaGate(bool planning, Isa usable) : planning_(planning), usable_(usable) {}
  bool planning_;
  Isa usable_;
};

// `Problem` is the op's call: shapes, scheme and (when running) the data pointers. Predicates
// see no data when planning (pointers null) and then answer for the shape alone.
template <typename Problem>
struct KernelEntry {
  const char* name;  // RunInfo::kernel, named as kernels/README.md says
  Isa isa;
  // Shapes the entry is for (e.g. M <= kWeightOnlyMaxM); others pass it over without a fallback
  // reason, since a kernel made for other shapes is not a faster one skipped. nullptr: every shape.
  bool (*serves)(const Problem& p);
  // Conditions the kernel needs; false records the entry as skipped with *why. nullptr: none.
  bool (*applies)(const Problem& p, std::string* why);
  // Computes the op (the dispatcher calls it only for a non-empty problem).
  void (*run)(const Problem& p);
};

template <typename Problem>
using KernelTable = std::vector<KernelEntry<Problem>>;

// The entry that serves `p` under `gate`, recording every skipped faster entry in *info (reset
// first; nullptr: no record, so a warm call with nothing skipped builds no string). Every table
// ends with entries that always apply, so one is always found.
template <typename Problem>
const KernelEntry<Problem>& select_kernel(const KernelTable<Problem>& table, const Problem& p, const IsaGate& gate,
                                          RunInfo* info) {
  if (info != nullptr) *info = RunInfo{};
  std::string why;
  for (const KernelEntry<Problem>& e : table) {
    if (e.serves != nullptr && !e.serves(p)) continue;
    if (!gate.allows(e.isa, &why) || (e.applies != nullptr && !e.applies(p, &why))) {
      if (info != nullptr) info->skip(e.name, why);
      continue;
    }
    if (info != nullptr) info->kernel = e.name;
    return e;
  }
  QF_CHECK(false, "kernels/cpu: a kernel table has no entry for this problem");
  return table.back();
}

// Planning: the smallest M above `from` at which the table's choice under `gate` differs from its
// choice at `from` (at(m) builds the problem of M rows, without data), and that entry's RunInfo in
// *large; 0 when the choice holds up to max_m. The tables' row rules are thresholds (an entry
// serves from or up to some M), so the choice changes at most once above decode size; the
// kernel-table test checks this against a row-by-row scan.
template <typename Problem, typename At>
int64_t switch_m(const KernelTable<Problem>& table, const At& at, int64_t from, const IsaGate& gate, RunInfo* large,
                 int64_t max_m = int64_t{1} << 24) {
  const KernelEntry<Problem>* first = &select_kernel(table, at(from), gate, nullptr);
  auto differs = [&](int64_t m) { return &select_kernel(table, at(m), gate, nullptr) != first; };
  int64_t lo = from, hi = std::max<int64_t>(from + 1, 2 * from);
  while (!differs(hi)) {
    if (hi >= max_m) return 0;
    lo = hi;
    hi = std::min(max_m, 2 * hi);
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (differs(mid) ? hi : lo) = mid;
  }
  if (large != nullptr) select_kernel(table, at(hi), gate, large);
  return hi;
}

// Runs the table's choice for `p` on this machine; info (when given) names it.
template <typename Problem>
void run_kernel_table(const KernelTable<Problem>& table, const Problem& p, int64_t m, RunInfo* info) {
  const KernelEntry<Problem>& e = select_kernel(table, p, IsaGate::machine(), info);
  if (m > 0) e.run(p);
}

// An op with one ISA kernel before its reference, where the kernel may decline at run time (e.g.
// on non-finite input): fast(&why) runs when `isa` is usable and returns false, with *why set, to
// hand over; the reference then runs and *info (when given) names what ran and why.
template <typename Fast, typename Reference>
void run_isa_or_reference(Isa isa, const char* name, RunInfo* info, const Fast& fast, const Reference& reference) {
  RunInfo local;
  RunInfo& ri = info != nullptr ? *info : local;
  ri = RunInfo{};
  std::string why;
  if (isa_usable(isa, &why) && fast(&why)) {
    ri.kernel = name;
    return;
  }
  ri.skip(name, why);
  ri.kernel = "reference";
  reference();
}

}  // namespace qforge::kernels
