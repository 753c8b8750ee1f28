// Error helpers: invariant failure reporting and "did you mean" suggestions.
#include "framework/core/error.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace qforge {
namespace detail {

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "qforge internal error at %s:%d: QF_CHECK(%s) failed %s\n", file, line, cond,
               msg.c_str());
  std::abort();
}

}  // namespace detail

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
}  // namespace

std::string closest_match(const std::string& key, const std::initializer_list<const char*>& candidates) {
  return closest_match(key, std::vector<std::string>(candidates.begin(), candidates.end()));
}

std::string closest_match(const std::string& key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(3, key.size() / 2) + 1;  // farther than this is no hint
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(key, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

}  // namespace qforge
