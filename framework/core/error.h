// Errors in qforge: `qforge::Error` at API and file boundaries, `QF_CHECK` for internal invariants.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace qforge {

// Thrown for bad user input: the message names the module path, key, shapes and what was expected.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Levenshtein-closest candidate to `key` (for "did you mean" hints); empty when none is close.
std::string closest_match(const std::string& key, const std::initializer_list<const char*>& candidates);
std::string closest_match(const std::string& key, const std::vector<std::string>& candidates);

}  // namespace qforge

// Throws qforge::Error with the concatenated message when `cond` is false.
#define QF_REQUIRE(cond, ...)                                            \
  do {                                                                   \
    if (!(cond)) throw ::qforge::Error(::qforge::detail::str_cat(__VA_ARGS__)); \
  } while (0)

// Internal invariant: aborts with file:line. Never for user input.
#define QF_CHECK(cond, ...)                                                          \
  do {                                                                               \
    if (!(cond))                                                                     \
      ::qforge::detail::check_failed(__FILE__, __LINE__, #cond,                      \
                                     ::qforge::detail::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
