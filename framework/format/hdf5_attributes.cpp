// HDF5 wrappers: objects and their attributes.
#include "framework/format/hdf5.h"
#include "framework/format/hdf5_internal.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "framework/core/error.h"

namespace qforge::io::h5 {

using namespace internal;

std::string Object::where() const {
  const H5I_type_t t = id_.valid() ? H5Iget_type(id_.get()) : H5I_BADID;
  return (file_path_ ? *file_path_ : std::string("?")) + ": " +
         (t == H5I_DATASET ? "dataset '" : "group '") + path_ + "'";
}

std::string Object::child_path(const std::string& name) const {
  return path_ == "/" ? "/" + name : path_ + "/" + name;
}

uint64_t Object::address() const {
  Lock lock;
  H5O_info_t oinfo;
  check(H5Oget_info2(id_.get(), &oinfo, H5O_INFO_BASIC), where(), "cannot read object info");
  return static_cast<uint64_t>(oinfo.addr);
}

bool Object::has_attr(const std::string& name) const {
  Lock lock;
  return check(H5Aexists(id_.get(), name.c_str()), where(), "cannot query attribute '" + name + "'") > 0;
}

std::vector<std::string> Object::attr_names() const {
  Lock lock;
  H5O_info_t oinfo;
  check(H5Oget_info2(id_.get(), &oinfo, H5O_INFO_NUM_ATTRS), where(), "cannot read object info");
  std::vector<std::string> names;
  for (hsize_t i = 0; i < oinfo.num_attrs; ++i) {
    const ssize_t n = check(H5Aget_name_by_idx(id_.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr,
                                               0, H5P_DEFAULT),
                            where(), "cannot list attributes");
    std::string s(static_cast<size_t>(n), '\0');
    H5Aget_name_by_idx(id_.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, s.data(), s.size() + 1,
                       H5P_DEFAULT);
    names.push_back(std::move(s));
  }
  return names;
}

namespace {
// Creates (replacing) attribute `name` with `type` and `space` and writes `buf` of `mem_type`.
void write_attr(hid_t obj, const std::string& where, const std::string& name, hid_t type, hid_t space,
                hid_t mem_type, const void* buf) {
  if (check(H5Aexists(obj, name.c_str()), where, "cannot query attribute '" + name + "'") > 0) {
    check(H5Adelete(obj, name.c_str()), where, "cannot replace attribute '" + name + "'");
  }
  Id attr(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid()) fail(where, "cannot create attribute '" + name + "'");
  check(H5Awrite(attr.get(), mem_type, buf), where, "cannot write attribute '" + name + "'");
}

Id open_attr(hid_t obj, const std::string& where, const std::string& name) {
  if (H5Aexists(obj, name.c_str()) <= 0) fail(where, "missing attribute '" + name + "'");
  Id attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT));
  if (!attr.valid()) fail(where, "cannot open attribute '" + name + "'");
  return attr;
}
}  // namespace

void Object::set_attr(const std::string& name, const std::string& value) const {
  Lock lock;
  // Fixed-length (not variable-length) strings live inside the checksummed object header; a
  // variable-length string would sit in the unchecksummed global heap.
  Id type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), value.size() + 1);
  H5Tset_strpad(type.get(), H5T_STR_NULLTERM);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  Id space(H5Screate(H5S_SCALAR));
  write_attr(id_.get(), where(), name, type.get(), space.get(), type.get(), value.c_str());
}

void Object::set_attr(const std::string& name, int64_t value) const {
  Lock lock;
  Id space(H5Screate(H5S_SCALAR));
  write_attr(id_.get(), where(), name, H5T_STD_I64LE, space.get(), H5T_NATIVE_INT64, &value);
}

void Object::set_attr(const std::string& name, double value) const {
  Lock lock;
  Id space(H5Screate(H5S_SCALAR));
  write_attr(id_.get(), where(), name, H5T_IEEE_F64LE, space.get(), H5T_NATIVE_DOUBLE, &value);
}

void Object::set_attr(const std::string& name, const std::vector<int64_t>& value) const {
  Lock lock;
  const hsize_t n = value.size();
  // An empty list (the shape of a 0-dim tensor) is a null dataspace: no elements at all.
  Id space(n == 0 ? H5Screate(H5S_NULL) : H5Screate_simple(1, &n, nullptr));
  const int64_t none = 0;  // HDF5 wants a buffer even for zero elements
  write_attr(id_.get(), where(), name, H5T_STD_I64LE, space.get(), H5T_NATIVE_INT64,
             value.empty() ? &none : value.data());
}

std::string Object::attr_string(const std::string& name) const {
  Lock lock;
  Id attr = open_attr(id_.get(), where(), name);
  Id type(H5Aget_type(attr.get()));
  if (H5Tget_class(type.get()) != H5T_STRING) {
    fail(where(), "attribute '" + name + "' is not a string");
  }
  Id space(H5Aget_space(attr.get()));
  if (H5Sget_simple_extent_npoints(space.get()) != 1) {
    fail(where(), "attribute '" + name + "' is not a single string");
  }
  if (H5Tis_variable_str(type.get()) > 0) {
    Id mem = string_type();
    char* p = nullptr;
    check(H5Aread(attr.get(), mem.get(), &p), where(), "cannot read attribute '" + name + "'");
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  // Fixed-length strings: read the bytes, stop at the first NUL.
  const size_t size = H5Tget_size(type.get());
  std::string s(size + 1, '\0');
  check(H5Aread(attr.get(), type.get(), s.data()), where(), "cannot read attribute '" + name + "'");
  s.resize(std::strlen(s.c_str()));
  return s;
}

int64_t Object::attr_int(const std::string& name) const {
  Lock lock;
  Id attr = open_attr(id_.get(), where(), name);
  Id type(H5Aget_type(attr.get()));
  Id space(H5Aget_space(attr.get()));
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Sget_simple_extent_npoints(space.get()) != 1) {
    fail(where(), "attribute '" + name + "' is not a single integer");
  }
  int64_t v = 0;
  check(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), where(), "cannot read attribute '" + name + "'");
  return v;
}

double Object::attr_double(const std::string& name) const {
  Lock lock;
  Id attr = open_attr(id_.get(), where(), name);
  Id type(H5Aget_type(attr.get()));
  Id space(H5Aget_space(attr.get()));
  const H5T_class_t cls = H5Tget_class(type.get());
  if ((cls != H5T_FLOAT && cls != H5T_INTEGER) || H5Sget_simple_extent_npoints(space.get()) != 1) {
    fail(where(), "attribute '" + name + "' is not a single number");
  }
  double v = 0;
  check(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v), where(), "cannot read attribute '" + name + "'");
  return v;
}

std::vector<int64_t> Object::attr_ints(const std::string& name) const {
  Lock lock;
  Id attr = open_attr(id_.get(), where(), name);
  Id type(H5Aget_type(attr.get()));
  Id space(H5Aget_space(attr.get()));
  if (H5Tget_class(type.get()) != H5T_INTEGER) {
    fail(where(), "attribute '" + name + "' is not an integer array");
  }
  if (H5Sget_simple_extent_type(space.get()) == H5S_NULL) return {};
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  std::vector<int64_t> v(static_cast<size_t>(std::max<hssize_t>(n, 0)));
  if (!v.empty()) {
    check(H5Aread(attr.get(), H5T_NATIVE_INT64, v.data()), where(), "cannot read attribute '" + name + "'");
  }
  return v;
}

std::string Object::attr_to_string(const std::string& name) const {
  Lock lock;
  Id attr = open_attr(id_.get(), where(), name);
  Id type(H5Aget_type(attr.get()));
  Id space(H5Aget_space(attr.get()));
  const H5T_class_t cls = H5Tget_class(type.get());
  const bool scalar = H5Sget_simple_extent_type(space.get()) == H5S_SCALAR;
  if (cls == H5T_STRING) return "\"" + attr_string(name) + "\"";
  if (cls == H5T_INTEGER) {
    if (scalar) return std::to_string(attr_int(name));
    return shape_string(attr_ints(name));
  }
  if (cls == H5T_FLOAT && scalar) {
    std::ostringstream os;
    os.precision(9);
    os << attr_double(name);
    return os.str();
  }
  return "<unsupported attribute type>";
}

}  // namespace qforge::io::h5
