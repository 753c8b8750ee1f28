// The message of the qforge::Error `f` throws ("" when it throws none), for tests that check
// what an error says.
#pragma once

#include <functional>
#include <string>

#include "framework/core/error.h"

namespace qforge::testing {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace qforge::testing
