// One name table per enum: the names a user writes (recipes, files, the API) and the value each
// stands for, so to_string, *_from_name, the recipe schema's choices and the "did you mean" hint
// all read the same table. Aliases parse but are never printed.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "framework/core/error.h"

namespace qforge {

template <class E>
struct NamedValue {
  E value;
  const char* name;
  bool alias = false;  // accepted when parsing, never printed or offered as a choice
};

// The printed name of `v` ("?" for a value the table lacks).
template <class E, size_t N>
const char* name_of(const NamedValue<E> (&table)[N], E v) {
  for (const NamedValue<E>& e : table)
    if (!e.alias && e.value == v) return e.name;
  return "?";
}

// The canonical names, in table order (the recipe schema's choices).
template <class E, size_t N>
std::vector<std::string> names_of(const NamedValue<E> (&table)[N]) {
  std::vector<std::string> out;
  for (const NamedValue<E>& e : table)
    if (!e.alias) out.emplace_back(e.name);
  return out;
}

// The value named `name`; otherwise qforge::Error "<what_prefix>unknown <what> 'x' (did you mean
// 'y'?); valid: a, b, c".
template <class E, size_t N>
E value_of(const NamedValue<E> (&table)[N], const std::string& name, const char* what,
           const char* what_prefix = "") {
  for (const NamedValue<E>& e : table)
    if (name == e.name) return e.value;
  const std::vector<std::string> names = names_of(table);
  const std::string hint = closest_match(name, names);
  std::string valid;
  for (const std::string& n : names) valid += (valid.empty() ? "" : ", ") + n;
  throw Error(detail::str_cat(what_prefix, "unknown ", what, " '", name, "'",
                              hint.empty() ? std::string() : " (did you mean '" + hint + "'?)", "; valid: ", valid));
}

}  // namespace qforge
