// Multiple-choice knapsack by dynamic programming over Pareto-optimal partial states.
#include "framework/search/knapsack.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "framework/core/error.h"

namespace qforge::search {

namespace {

struct State {
  std::vector<double> costs;
  double value = 0.0;
  int parent = -1;  // index into the previous layer's states
  int pick = -1;    // choice taken in this group
};

// a is at most b in every cost and value (a dominates or equals b).
bool dominates(const State& a, const State& b) {
  if (a.value > b.value) return false;
  for (size_t d = 0; d < a.costs.size(); ++d)
    if (a.costs[d] > b.costs[d]) return false;
  return true;
}

// Keeps the states no other state dominates (ties: the first). Sorted by cost 0, then value.
std::vector<State> pareto(std::vector<State> s) {
  std::sort(s.begin(), s.end(), [](const State& a, const State& b) {
    if (a.costs[0] != b.costs[0]) return a.costs[0] < b.costs[0];
    return a.value < b.value;
  });
  std::vector<State> kept;
  if (s.empty()) return kept;
  if (s[0].costs.size() == 1) {
    // One budget: a state survives when it is less sensitive than every cheaper one.
    double best = std::numeric_limits<double>::infinity();
    for (State& st : s) {
      if (st.value < best) {
        best = st.value;
        kept.push_back(std::move(st));
      }
    }
    return kept;
  }
  for (State& st : s) {
    bool dominated = false;
    for (const State& k : kept)
      if (dominates(k, st)) {
        dominated = true;
        break;
      }
    if (!dominated) kept.push_back(std::move(st));
  }
  return kept;
}

void check_input(const std::vector<Group>& groups, size_t dims) {
  QF_REQUIRE(dims >= 1, "search: the knapsack needs at least one budget");
  QF_REQUIRE(!groups.empty(), "search: no layers to choose widths for");
  for (const Group& g : groups) {
    QF_REQUIRE(!g.choices.empty(), "search: '", g.name, "' has no candidate left (constraints removed them all)");
    for (const Choice& c : g.choices) {
      QF_REQUIRE(c.costs.size() == dims, "search: '", g.name, "' choice '", c.name, "' has ", c.costs.size(),
                 " costs for ", dims, " budgets");
      QF_REQUIRE(std::isfinite(c.value), "search: '", g.name, "' choice '", c.name, "' has sensitivity ", c.value);
      for (double x : c.costs)
        QF_REQUIRE(std::isfinite(x) && x >= 0, "search: '", g.name, "' choice '", c.name, "' has cost ", x);
    }
  }
}

// The final Pareto states of the DP (budgets enforced), with the per-group state tables for
// reconstructing picks.
struct Frontier {
  std::vector<std::vector<State>> layers;  // layers[i]: states after group i
};

Frontier run_dp(const std::vector<Group>& groups, const std::vector<double>& budgets, const KnapsackOptions& o) {
  const size_t dims = budgets.size();
  check_input(groups, dims);
  // suffix[i][d]: the cheapest total of groups i.. in budget d (to drop states that cannot fit).
  std::vector<std::vector<double>> suffix(groups.size() + 1, std::vector<double>(dims, 0.0));
  for (size_t i = groups.size(); i-- > 0;) {
    for (size_t d = 0; d < dims; ++d) {
      double m = std::numeric_limits<double>::infinity();
      for (const Choice& c : groups[i].choices) m = std::min(m, c.costs[d]);
      suffix[i][d] = suffix[i + 1][d] + m;
    }
  }
  Frontier f;
  std::vector<State> prev{State{std::vector<double>(dims, 0.0), 0.0, -1, -1}};
  for (size_t i = 0; i < groups.size(); ++i) {
    std::vector<State> next;
    next.reserve(prev.size() * groups[i].choices.size());
    for (size_t p = 0; p < prev.size(); ++p) {
      for (size_t c = 0; c < groups[i].choices.size(); ++c) {
        const Choice& ch = groups[i].choices[c];
        State s{prev[p].costs, prev[p].value + ch.value, static_cast<int>(p), static_cast<int>(c)};
        bool fits = true;
        for (size_t d = 0; d < dims && fits; ++d) {
          s.costs[d] += ch.costs[d];
          fits = s.costs[d] + suffix[i + 1][d] <= budgets[d];
        }
        if (fits) next.push_back(std::move(s));
      }
    }
    next = pareto(std::move(next));
    QF_REQUIRE(static_cast<int64_t>(next.size()) <= o.max_states, "search: ", next.size(),
               " Pareto states after '", groups[i].name, "' (limit ", o.max_states,
               "); use fewer candidates, tie more layers, or a coarser latency table");
    f.layers.push_back(std::move(next));
    prev = f.layers.back();
  }
  return f;
}

Assignment reconstruct(const Frontier& f, int index) {
  Assignment a;
  const State& last = f.layers.back()[index];
  a.costs = last.costs;
  a.value = last.value;
  a.picks.assign(f.layers.size(), -1);
  int idx = index;
  for (size_t i = f.layers.size(); i-- > 0;) {
    const State& s = f.layers[i][idx];
    a.picks[i] = s.pick;
    idx = s.parent;
  }
  return a;
}

// Integral costs (bytes, bits) print as integers; others with up to 6 significant digits.
std::string format_cost(double v) {
  std::ostringstream os;
  if (std::abs(v) < 9e15 && v == std::floor(v)) os << static_cast<int64_t>(v);
  else os << v;
  return os.str();
}

}  // namespace

Assignment solve_knapsack(const std::vector<Group>& groups, const std::vector<double>& budgets,
                          const std::vector<std::string>& budget_names, const KnapsackOptions& options) {
  const size_t dims = budgets.size();
  check_input(groups, dims);
  for (size_t d = 0; d < dims; ++d) {
    double smallest = 0;
    for (const Group& g : groups) {
      double m = std::numeric_limits<double>::infinity();
      for (const Choice& c : g.choices) m = std::min(m, c.costs[d]);
      smallest += m;
    }
    const std::string name = d < budget_names.size() ? budget_names[d] : "budget " + std::to_string(d);
    QF_REQUIRE(smallest <= budgets[d], "search: ", name, " ", format_cost(budgets[d]),
               " cannot be met: the smallest reachable is ", format_cost(smallest));
  }
  const Frontier f = run_dp(groups, budgets, options);
  QF_REQUIRE(!f.layers.back().empty(), "search: no assignment meets every budget at once (each can be met alone)");
  int best = 0;
  for (size_t i = 1; i < f.layers.back().size(); ++i)
    if (f.layers.back()[i].value < f.layers.back()[best].value) best = static_cast<int>(i);
  return reconstruct(f, best);
}

std::vector<Assignment> pareto_front(const std::vector<Group>& groups, const std::vector<double>& budgets,
                                     const KnapsackOptions& options) {
  const Frontier f = run_dp(groups, budgets, options);
  std::vector<Assignment> out;
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> order(f.layers.back().size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const State& x = f.layers.back()[a];
    const State& y = f.layers.back()[b];
    return x.costs[0] != y.costs[0] ? x.costs[0] < y.costs[0] : x.value < y.value;
  });
  for (int i : order) {
    const State& s = f.layers.back()[i];
    if (s.value < best) {
      best = s.value;
      out.push_back(reconstruct(f, i));
    }
  }
  return out;
}

}  // namespace qforge::search
