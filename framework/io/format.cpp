// Root attributes that identify qforge files.
#include "framework/io/format.h"

#include "framework/core/error.h"
#include "framework/format/hdf5.h"

#ifndef QFORGE_VERSION
#define QFORGE_VERSION "unknown"
#endif

namespace qforge::io {

const char* qforge_version() { return QFORGE_VERSION; }

void write_format(const h5::Group& root, const char* format, int64_t version) {
  root.set_attr("format", format);
  root.set_attr("format_version", version);
  root.set_attr("qforge_version", qforge_version());
}

int64_t check_format(const h5::Group& root, const char* format, int64_t max_version) {
  QF_REQUIRE(root.has_attr("format"), "framework/io: ", root.file_path(), ": not a ", format,
             " file (an HDF5 file without qforge's 'format' attribute)");
  const std::string found = root.attr_string("format");
  QF_REQUIRE(found == format, "framework/io: ", root.file_path(), ": is a '", found,
             "' file, expected '", format, "'");
  QF_REQUIRE(root.has_attr("format_version"), "framework/io: ", root.file_path(),
             ": missing attribute 'format_version'");
  const int64_t v = root.attr_int("format_version");
  QF_REQUIRE(v >= 1, "framework/io: ", root.file_path(), ": invalid format_version ", v);
  QF_REQUIRE(v <= max_version, "framework/io: ", root.file_path(), ": ", format,
             " format_version ", v, " was written by a newer qforge",
             root.has_attr("qforge_version") ? " (" + root.attr_string("qforge_version") + ")" : "",
             "; this build (", qforge_version(), ") reads format_version <= ", max_version);
  return v;
}

}  // namespace qforge::io
