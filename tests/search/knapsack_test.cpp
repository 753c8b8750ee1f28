// The knapsack solver against brute force on random small instances (one and two budgets,
// feasible and infeasible), its error for budgets no assignment meets, and the Pareto front.
#include "framework/search/knapsack.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "framework/core/error.h"

namespace qforge::search {
namespace {

struct Brute {
  bool feasible = false;
  double value = std::numeric_limits<double>::infinity();
};

Brute brute_force(const std::vector<Group>& groups, const std::vector<double>& budgets) {
  Brute best;
  std::vector<int> idx(groups.size(), 0);
  while (true) {
    std::vector<double> cost(budgets.size(), 0.0);
    double value = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      const Choice& c = groups[g].choices[idx[g]];
      value += c.value;
      for (size_t d = 0; d < budgets.size(); ++d) cost[d] += c.costs[d];
    }
    bool fits = true;
    for (size_t d = 0; d < budgets.size(); ++d) fits = fits && cost[d] <= budgets[d];
    if (fits && value < best.value) {
      best.feasible = true;
      best.value = value;
    }
    size_t g = 0;
    while (g < groups.size() && ++idx[g] == static_cast<int>(groups[g].choices.size())) idx[g++] = 0;
    if (g == groups.size()) break;
  }
  return best;
}

std::vector<Group> random_instance(std::mt19937& rng, size_t dims) {
  std::uniform_int_distribution<int> n_groups(1, 6), n_choices(1, 4), cost(0, 40);
  std::uniform_real_distribution<double> value(0.0, 10.0);
  std::vector<Group> groups(n_groups(rng));
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].name = "layer" + std::to_string(g);
    const int n = n_choices(rng);
    for (int c = 0; c < n; ++c) {
      Choice ch{"c" + std::to_string(c), {}, value(rng)};
      for (size_t d = 0; d < dims; ++d) ch.costs.push_back(cost(rng));
      groups[g].choices.push_back(ch);
    }
  }
  return groups;
}

TEST(Knapsack, MatchesBruteForceOnRandomInstancesWithOneAndTwoBudgets) {
  std::mt19937 rng(7);
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const size_t dims = trial % 3 == 0 ? 2 : 1;
    const std::vector<Group> groups = random_instance(rng, dims);
    std::vector<double> budgets;
    std::uniform_int_distribution<int> b(0, 40 * static_cast<int>(groups.size()));
    for (size_t d = 0; d < dims; ++d) budgets.push_back(b(rng));
    const Brute want = brute_force(groups, budgets);
    try {
      const Assignment got = solve_knapsack(groups, budgets, {"size", "latency"});
      ASSERT_TRUE(want.feasible) << "trial " << trial << ": solver found an assignment brute force did not";
      EXPECT_NEAR(got.value, want.value, 1e-9) << "trial " << trial;
      // The picks add up to the reported totals and fit.
      std::vector<double> cost(dims, 0.0);
      double value = 0;
      for (size_t g = 0; g < groups.size(); ++g) {
        value += groups[g].choices[got.picks[g]].value;
        for (size_t d = 0; d < dims; ++d) cost[d] += groups[g].choices[got.picks[g]].costs[d];
      }
      EXPECT_NEAR(value, got.value, 1e-9);
      for (size_t d = 0; d < dims; ++d) {
        EXPECT_EQ(cost[d], got.costs[d]);
        EXPECT_LE(cost[d], budgets[d]);
      }
      ++feasible;
    } catch (const Error& e) {
      EXPECT_FALSE(want.feasible) << "trial " << trial << ": " << e.what();
      ++infeasible;
    }
  }
  EXPECT_GT(feasible, 100);  // both outcomes were exercised
  EXPECT_GT(infeasible, 50);
}

TEST(Knapsack, InfeasibleBudgetNamesTheSmallestReachable) {
  const std::vector<Group> groups{{"fc1", {{"qint8", {100}, 1.0}, {"qint4", {60}, 3.0}}},
                                  {"fc2", {{"qint8", {50}, 1.0}, {"qint2", {20}, 9.0}}}};
  try {
    solve_knapsack(groups, {79}, {"size budget (bytes)"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("size budget (bytes) 79 cannot be met: the smallest reachable is 80"),
              std::string::npos)
        << e.what();
  }
  const Assignment a = solve_knapsack(groups, {80}, {"size"});
  EXPECT_EQ(a.picks, (std::vector<int>{1, 1}));
  const Assignment b = solve_knapsack(groups, {130}, {"size"});
  EXPECT_EQ(b.picks, (std::vector<int>{1, 0}));  // 60 + 50, value 4 beats 100 + 20 (value 10)
}

TEST(Knapsack, ParetoFrontIsMonotoneAndEndsAtTheUnconstrainedOptimum) {
  std::mt19937 rng(3);
  const std::vector<Group> groups = random_instance(rng, 1);
  const std::vector<Assignment> front = pareto_front(groups, {std::numeric_limits<double>::infinity()});
  ASSERT_FALSE(front.empty());
  for (size_t i = 1; i < front.size(); ++i) {
    EXPECT_GT(front[i].costs[0], front[i - 1].costs[0]);
    EXPECT_LT(front[i].value, front[i - 1].value);
  }
  const Brute best = brute_force(groups, {std::numeric_limits<double>::infinity()});
  EXPECT_NEAR(front.back().value, best.value, 1e-9);
  // Every point is the optimum at its own cost.
  for (const Assignment& p : front)
    EXPECT_NEAR(solve_knapsack(groups, {p.costs[0]}, {"size"}).value, p.value, 1e-9);
}

TEST(Knapsack, RejectsGroupsWithoutChoicesAndNonFiniteNumbers) {
  EXPECT_THROW(solve_knapsack({{"fc1", {}}}, {10}, {"size"}), Error);
  EXPECT_THROW(solve_knapsack({{"fc1", {{"a", {1}, std::nan("")}}}}, {10}, {"size"}), Error);
  EXPECT_THROW(solve_knapsack({{"fc1", {{"a", {1, 2}, 0.0}}}}, {10}, {"size"}), Error);
}

}  // namespace
}  // namespace qforge::search
