// qtype registry and name lookup.
#include "framework/core/qtype.h"

#include "framework/core/error.h"

namespace qforge {

const std::vector<QType>& all_qtypes() {
  static const std::vector<QType> kAll{qint8, quint8, qint4, quint4, qint3, qint2, qfloat8_e4m3fn, qfloat8_e5m2,
                                       qkmeans4, qkmeans3, qkmeans2, qmxfp4, qnvfp4};
  return kAll;
}

QType qtype_from_name(std::string_view name) {
  struct Alias {
    const char* alias;
    const QType* qtype;
  };
  static const Alias kAliases[] = {
      {"int8", &qint8},         {"uint8", &quint8},          {"int4", &qint4},
      {"uint4", &quint4},       {"int3", &qint3},            {"int2", &qint2},            {"fp8_e4m3", &qfloat8_e4m3fn},
      {"fp8_e4m3fn", &qfloat8_e4m3fn}, {"float8_e4m3fn", &qfloat8_e4m3fn}, {"fp8_e5m2", &qfloat8_e5m2},
      {"float8_e5m2", &qfloat8_e5m2}, {"fp8", &qfloat8_e4m3fn}, {"kmeans4", &qkmeans4},
      {"kmeans3", &qkmeans3},         {"kmeans2", &qkmeans2}, {"mx_fp4", &qmxfp4},
      {"nv_fp4", &qnvfp4}};
  for (const QType& q : all_qtypes())
    if (name == q.name) return q;
  for (const Alias& a : kAliases)
    if (name == a.alias) return *a.qtype;
  const std::string hint = closest_match(std::string(name),
                                         {"qint8", "quint8", "qint4", "quint4", "qint3", "qint2",
                                          "qfloat8_e4m3fn", "qfloat8_e5m2", "int8", "uint8", "int4",
                                          "uint4", "int3", "int2", "fp8_e4m3", "fp8_e5m2", "qkmeans4", "qkmeans3",
                                          "qkmeans2", "kmeans4", "kmeans3", "kmeans2", "mxfp4", "nvfp4"});
  throw Error(detail::str_cat("unknown qtype '", name, "'",
                              hint.empty() ? std::string() : " (did you mean '" + hint + "'?)",
                              "; valid: qint8, quint8, qint4, quint4, qint3, qint2, qfloat8_e4m3fn, qfloat8_e5m2, qkmeans4, "
                              "qkmeans3, qkmeans2, mxfp4, nvfp4"));
}

}  // namespace qforge
