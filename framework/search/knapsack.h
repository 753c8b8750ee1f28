// The exact solver of the mixed-precision search: a multiple-choice knapsack. Each group (a layer,
// or layers tied to one width) takes exactly one of its choices; each choice has a value (the
// predicted sensitivity, lower is better) and one additive cost per budget (bytes, latency, bits).
// Dynamic programming over Pareto-optimal partial states: a partial assignment is kept only when
// no other one is at most as costly in every budget and at most as sensitive, and only when the
// remaining groups' cheapest choices still fit. Exact: no costs are rounded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qforge::search {

struct Choice {
  std::string name;           // e.g. "qint4 per_group(128)"
  std::vector<double> costs;  // one per budget, same order as the budgets
  double value = 0.0;         // predicted sensitivity
};

struct Group {
  std::string name;  // layer path, or the tied layers' paths joined
  std::vector<Choice> choices;
};

struct Assignment {
  std::vector<int> picks;     // choice index per group
  std::vector<double> costs;  // totals per budget
  double value = 0.0;         // total predicted sensitivity
};

struct KnapsackOptions {
  // Partial states kept per group at most; past it the solver throws (exactness is never
  // traded for speed). Enough for hundreds of layers with a handful of candidates each.
  int64_t max_states = 4'000'000;
};

// The assignment of least total value whose total cost is at most budgets[d] in every budget d.
// Throws qforge::Error when no assignment fits: the message names the budget and the smallest
// total that budget can reach (cheapest choice of every group), e.g. "size budget 1.2 MB cannot
// be met: the smallest reachable is 1.9 MB". `budget_names` label the budgets in that message.
Assignment solve_knapsack(const std::vector<Group>& groups, const std::vector<double>& budgets,
                          const std::vector<std::string>& budget_names, const KnapsackOptions& options = {});

// Every Pareto-optimal assignment in budget 0 vs value (other budgets still enforced), by
// increasing cost: the front a report plots (for each cost, nothing cheaper is less sensitive).
std::vector<Assignment> pareto_front(const std::vector<Group>& groups, const std::vector<double>& budgets,
                                     const KnapsackOptions& options = {});

}  // namespace qforge::search
