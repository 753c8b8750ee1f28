// Identity of qforge's HDF5 files: the `format` and `format_version` root attributes every dump
// and checkpoint carries, and the qforge version string written beside them (docs/formats.md).
#pragma once

#include <cstdint>
#include <string>

namespace qforge::io {

inline constexpr const char* kCheckpointFormat = "qforge.checkpoint";
inline constexpr const char* kCalibrationFormat = "qforge.calibration";
// Bump when a layout changes; readers keep accepting every older version (tests/fixtures/).
inline constexpr int64_t kCheckpointFormatVersion = 1;  // its /model group has its own version (model_file.cpp)
// Version 2: observer attributes only for the kinds that read them (version 1 wrote all).
inline constexpr int64_t kCalibrationFormatVersion = 2;

// The qforge version (CMake project version) recorded in files.
const char* qforge_version();

namespace h5 {
class Group;
}

// Writes `format`, `format_version` and `qforge_version` on `root`.
void write_format(const h5::Group& root, const char* format, int64_t version);
// Checks a file's root attributes: throws qforge::Error naming the file when `format` is missing
// (a foreign HDF5 file), names another qforge format, or `format_version` is newer than
// `max_version` or < 1. Returns the file's format_version.
int64_t check_format(const h5::Group& root, const char* format, int64_t max_version);

}  // namespace qforge::io
