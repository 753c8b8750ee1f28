// Shared by the HDF5 wrappers (hdf5.cpp, hdf5_attributes.cpp, hdf5_dataset.cpp, hdf5_group.cpp),
// the only files that include this header and HDF5's: the lock, errors and type mapping.
#pragma once

#include <hdf5.h>

#include <mutex>
#include <string>
#include <vector>

#include "framework/format/hdf5.h"

namespace qforge::io::h5::internal {

// Non-empty datasets are split into chunks of at most this many bytes (Fletcher-32 per chunk).
constexpr int64_t kMaxChunkBytes = int64_t{1} << 20;
constexpr const char* kTorchDtypeAttr = "torch_dtype";

// Links and attributes stay in the (checksummed) object header instead of moving to the
// unchecksummed fractal heap of "dense" storage once a group has more than 8 of them.
constexpr unsigned kMaxCompact = 65535;

// HDF5 may be built without thread safety; one lock serialises every call qforge makes.
std::recursive_mutex& hdf5_mutex();

// Holds the lock and silences HDF5's automatic error printing (a per-thread setting in
// thread-safe builds, so it is done once per thread).
struct Lock {
  std::lock_guard<std::recursive_mutex> guard{hdf5_mutex()};
  Lock();
};

// HDF5's own messages from the current error stack (innermost last), then clears it.
std::string hdf5_detail();
[[noreturn]] void fail(const std::string& where, const std::string& what);
std::string shape_string(const std::vector<int64_t>& s);
void require_name(const std::string& name, const std::string& where);

// File (little-endian, fixed) type for a stored dtype; the memory type is the native twin.
Id file_type(at::ScalarType st);
Id memory_type(at::ScalarType st);

// The at:: dtype a stored HDF5 type reads into, or throws naming the dataset.
at::ScalarType dtype_of(hid_t type, const std::string& where);
std::vector<int64_t> dataspace_dims(hid_t space, const std::string& where);
Id simple_space(const std::vector<int64_t>& shape);
void set_compact_storage(hid_t plist, const std::string& where);
Id string_type();

// Refuses (qforge::Error naming `path`) a file whose superblock or root object header is not
// of the layout qforge writes, reading the bytes itself before HDF5 sees the file.
void check_layout(const std::string& path);

// Checks an HDF5 return value (negative means failure).
template <typename T>
T check(T r, const std::string& where, const std::string& what) {
  if (r < 0) fail(where, what);
  return r;
}

}  // namespace qforge::io::h5::internal
