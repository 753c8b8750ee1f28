// HDF5 wrappers: the only file in qforge that calls the HDF5 C API.
#include "framework/format/hdf5.h"

#include <ATen/ATen.h>
#include <hdf5.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <type_traits>

#include "framework/core/error.h"

namespace qforge::io::h5 {

static_assert(std::is_same_v<hid_t, int64_t>, "qforge needs HDF5 >= 1.10 (64-bit hid_t)");
static_assert(H5_VERSION_GE(1, 10, 5), "qforge needs HDF5 >= 1.10.5 (H5Dget_num_chunks)");

namespace {

// Non-empty datasets are split into chunks of at most this many bytes (Fletcher-32 per chunk).
constexpr int64_t kMaxChunkBytes = int64_t{1} << 20;
constexpr const char* kTorchDtypeAttr = "torch_dtype";

// HDF5 may be built without thread safety; one lock serialises every call qforge makes.
std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex m;
  return m;
}

// Holds the lock and silences HDF5's automatic error printing (a per-thread setting in
// thread-safe builds, so it is done once per thread).
struct Lock {
  std::lock_guard<std::recursive_mutex> guard{hdf5_mutex()};
  Lock() {
    thread_local bool silenced = false;
    if (!silenced) {
      H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
      silenced = true;
    }
  }
};

// A file whose close failed (a full disk) stays half torn down in HDF5's tables, and HDF5's own
// shutdown at exit would close it again and crash: qforge closes its files itself. H5dont_atexit
// only works before HDF5 initialises, hence at static initialisation, before any HDF5 call.
[[maybe_unused]] const bool kNoAtexitCleanup = [] {
  const bool ok = H5dont_atexit() >= 0;
  if (!ok) std::fprintf(stderr, "qforge: warning: cannot turn off HDF5's clean-up at exit\n");
  return ok;
}();

herr_t collect_error(unsigned n, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  if (e->desc && *e->desc) out->emplace_back(e->desc);
  return 0;
}

// HDF5's own messages from the current error stack (innermost last), then clears it.
std::string hdf5_detail() {
  std::vector<std::string> msgs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &msgs);
  H5Eclear2(H5E_DEFAULT);
  if (msgs.empty()) return {};
  // The innermost message says what actually went wrong ("truncated file: eof = ...").
  std::string s = msgs.back();
  if (msgs.size() > 1 && msgs.front() != s) s = msgs.front() + ": " + s;
  std::replace(s.begin(), s.end(), '\n', ' ');  // HDF5's write errors embed a ctime() line break
  return " (HDF5: " + s + ")";
}

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw Error("framework/io: " + where + ": " + what + hdf5_detail());
}

// Checks an HDF5 return value (negative means failure).
template <typename T>
T check(T r, const std::string& where, const std::string& what) {
  if (r < 0) fail(where, what);
  return r;
}

std::string shape_string(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

void require_name(const std::string& name, const std::string& where) {
  QF_REQUIRE(!name.empty() && name != "." && name.find('/') == std::string::npos,
             "framework/io: ", where, ": invalid object name '", name,
             "' (must be non-empty, not '.', without '/')");
}

Id make_float16_type() {
  Id t(H5Tcopy(H5T_IEEE_F32LE));
  // IEEE binary16: sign bit 15, exponent at bit 10 (5 bits), mantissa at bit 0 (10 bits).
  if (!t.valid() || H5Tset_fields(t.get(), 15, 10, 5, 0, 10) < 0 || H5Tset_size(t.get(), 2) < 0 ||
      H5Tset_ebias(t.get(), 15) < 0) {
    fail("float16 type", "cannot build the IEEE half type");
  }
  return t;
}

// File (little-endian, fixed) type for a stored dtype; the memory type is the native twin.
Id file_type(at::ScalarType st) {
  switch (st) {
    case at::kFloat: return Id(H5Tcopy(H5T_IEEE_F32LE));
    case at::kDouble: return Id(H5Tcopy(H5T_IEEE_F64LE));
    case at::kHalf: return make_float16_type();
    case at::kChar: return Id(H5Tcopy(H5T_STD_I8LE));
    case at::kByte: return Id(H5Tcopy(H5T_STD_U8LE));
    case at::kShort: return Id(H5Tcopy(H5T_STD_I16LE));
    case at::kInt: return Id(H5Tcopy(H5T_STD_I32LE));
    case at::kLong: return Id(H5Tcopy(H5T_STD_I64LE));
    default: break;
  }
  throw Error(detail::str_cat("framework/io: no HDF5 type for dtype ", st));
}

Id memory_type(at::ScalarType st) {
  switch (st) {
    case at::kFloat: return Id(H5Tcopy(H5T_NATIVE_FLOAT));
    case at::kDouble: return Id(H5Tcopy(H5T_NATIVE_DOUBLE));
    case at::kHalf: return make_float16_type();
    case at::kChar: return Id(H5Tcopy(H5T_NATIVE_INT8));
    case at::kByte: return Id(H5Tcopy(H5T_NATIVE_UINT8));
    case at::kShort: return Id(H5Tcopy(H5T_NATIVE_INT16));
    case at::kInt: return Id(H5Tcopy(H5T_NATIVE_INT32));
    case at::kLong: return Id(H5Tcopy(H5T_NATIVE_INT64));
    default: break;
  }
  throw Error(detail::str_cat("framework/io: no HDF5 type for dtype ", st));
}

// The at:: dtype a stored HDF5 type reads into, or throws naming the dataset.
at::ScalarType dtype_of(hid_t type, const std::string& where) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) {
    if (size == 2) return at::kHalf;
    if (size == 4) return at::kFloat;
    if (size == 8) return at::kDouble;
  } else if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    if (size == 1) return is_signed ? at::kChar : at::kByte;
    if (size == 2 && is_signed) return at::kShort;
    if (size == 4 && is_signed) return at::kInt;
    if (size == 8 && is_signed) return at::kLong;
    // Unsigned wider integers are read into the next signed type when they fit.
    if (size == 2) return at::kInt;
    if (size == 4) return at::kLong;
  } else if (cls == H5T_ENUM && size == 1) {
    return at::kByte;  // h5py's bool (an 8-bit enum {FALSE, TRUE})
  }
  fail(where, detail::str_cat("unsupported element type (HDF5 class ", static_cast<int>(cls),
                              ", ", size, " bytes)"));
}

std::vector<int64_t> dataspace_dims(hid_t space, const std::string& where) {
  const int rank = check(H5Sget_simple_extent_ndims(space), where, "cannot read the dataspace rank");
  std::vector<hsize_t> dims(rank);
  if (rank > 0) check(H5Sget_simple_extent_dims(space, dims.data(), nullptr), where, "cannot read dims");
  return std::vector<int64_t>(dims.begin(), dims.end());
}

Id simple_space(const std::vector<int64_t>& shape) {
  if (shape.empty()) return Id(H5Screate(H5S_SCALAR));
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return Id(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
}

// Links and attributes stay in the (checksummed) object header instead of moving to the
// unchecksummed fractal heap of "dense" storage once a group has more than 8 of them.
constexpr unsigned kMaxCompact = 65535;
void set_compact_storage(hid_t plist, const std::string& where) {
  check(H5Pset_link_phase_change(plist, kMaxCompact, kMaxCompact - 1), where, "cannot keep links compact");
  check(H5Pset_attr_phase_change(plist, kMaxCompact, kMaxCompact - 1), where, "cannot keep attributes compact");
}

// File path -> why an object of that file failed to close (a dataset's close writes its chunk
// cache, so the data may be lost); File::close reports it instead of claiming success.
std::map<std::string, std::string>& failed_closes() {
  static std::map<std::string, std::string> m;
  return m;
}

std::string name_of(hid_t id, ssize_t (*get)(hid_t, char*, size_t)) {
  const ssize_t n = get(id, nullptr, 0);
  if (n <= 0) return {};
  std::string s(static_cast<size_t>(n), '\0');
  get(id, s.data(), s.size() + 1);
  return s;
}

// Closes `id` with the H5*close call of its type. A group, dataset or attribute that fails to
// close is recorded in failed_closes() (a dataset's close writes its chunk cache). An id that is
// no longer registered (File::close closed it already) is left alone.
void close_object(hid_t id) {
  const H5I_type_t type = H5Iget_type(id);
  if (type == H5I_BADID) return;
  const bool in_file = type == H5I_GROUP || type == H5I_DATASET || type == H5I_ATTR;
  const std::string file = in_file ? name_of(id, H5Fget_name) : std::string();
  const std::string dataset = type == H5I_DATASET ? name_of(id, H5Iget_name) : std::string();
  herr_t r = 0;
  switch (type) {
    case H5I_FILE: r = H5Fclose(id); break;
    case H5I_GROUP: r = H5Gclose(id); break;
    case H5I_DATASET: r = H5Dclose(id); break;
    case H5I_DATASPACE: r = H5Sclose(id); break;
    case H5I_DATATYPE: r = H5Tclose(id); break;
    case H5I_ATTR: r = H5Aclose(id); break;
    case H5I_GENPROP_LST: r = H5Pclose(id); break;
    default: H5Idec_ref(id); break;
  }
  if (r < 0 && !file.empty() && !failed_closes().count(file)) {
    const std::string what = dataset.empty() ? "cannot close an object" : "cannot write dataset '" + dataset + "'";
    failed_closes()[file] = what + " when closing it (its data is not in the file)" + hdf5_detail();
  }
}

// Closes the datasets, groups and attributes of a strongly closed `file` still open, each by its
// own close call: H5Fclose would leave a child whose close failed registered, and the Id still
// owning it would then touch freed memory. Files opened for reading close weakly (their open
// objects keep them open) and are left alone.
void close_open_objects(hid_t file) {
  H5F_close_degree_t degree = H5F_CLOSE_DEFAULT;
  {
    Id fapl(H5Fget_access_plist(file));
    if (!fapl.valid() || H5Pget_fclose_degree(fapl.get(), &degree) < 0) degree = H5F_CLOSE_DEFAULT;
  }
  H5Eclear2(H5E_DEFAULT);
  if (degree != H5F_CLOSE_STRONG) return;
  const unsigned types = H5F_OBJ_LOCAL | H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_ATTR;
  const ssize_t n = H5Fget_obj_count(file, types);
  if (n <= 0) return;
  std::vector<hid_t> ids(static_cast<size_t>(n));
  const ssize_t got = H5Fget_obj_ids(file, types, ids.size(), ids.data());
  for (ssize_t i = 0; i < got; ++i) close_object(ids[static_cast<size_t>(i)]);
  H5Eclear2(H5E_DEFAULT);
}

Id string_type() {
  Id t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  return t;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Id

Id& Id::operator=(Id&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    o.id_ = -1;
  }
  return *this;
}

void Id::reset() {
  if (id_ < 0) return;
  Lock lock;
  close_object(id_);
  H5Eclear2(H5E_DEFAULT);
  id_ = -1;
}

// ---------------------------------------------------------------------------------------------
// Object: attributes

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

// ---------------------------------------------------------------------------------------------
// Dataset

namespace {
at::ScalarType logical_dtype(const std::string& torch_dtype, const std::string& where) {
  if (torch_dtype == "bool") return at::kBool;
  if (torch_dtype == "bfloat16") return at::kBFloat16;
  fail(where, "unknown torch_dtype '" + torch_dtype + "'");
}
}  // namespace

DatasetInfo Dataset::info() const {
  Lock lock;
  DatasetInfo inf = stored_info();
  if (has_attr(kTorchDtypeAttr)) inf.dtype = logical_dtype(attr_string(kTorchDtypeAttr), where());
  return inf;
}

DatasetInfo Dataset::stored_info() const {
  Lock lock;
  DatasetInfo info;
  Id space(H5Dget_space(id_.get()));
  if (!space.valid()) fail(where(), "cannot read the dataspace");
  info.shape = dataspace_dims(space.get(), where());
  Id type(H5Dget_type(id_.get()));
  if (!type.valid()) fail(where(), "cannot read the element type");
  info.dtype = dtype_of(type.get(), where());
  return info;
}

namespace {
// Declared sizes are checked against what the file stores before anything is allocated: an
// element count that overflows, or a shape far larger than the dataset's storage (a few bytes on
// disk declaring gigabytes, read back as fill values), is refused. Compression filters may
// legitimately expand data (deflate at most ~1032:1); small datasets are always read.
constexpr uint64_t kAlwaysReadableBytes = uint64_t{1} << 20;
constexpr uint64_t kMaxCompressionRatio = 1100;

void check_declared_size(hid_t dataset, const DatasetInfo& inf, const std::string& where) {
  uint64_t count = 1;
  for (int64_t d : inf.shape) {
    if (d < 0 || (d > 0 && count > (uint64_t{1} << 48) / static_cast<uint64_t>(d)))
      fail(where, "declares shape " + shape_string(inf.shape) + ": more than 2^48 elements");
    count *= static_cast<uint64_t>(d);
  }
  const uint64_t bytes = count * static_cast<uint64_t>(c10::elementSize(inf.dtype));
  if (bytes <= kAlwaysReadableBytes) return;
  const uint64_t stored = H5Dget_storage_size(dataset);
  Id dcpl(H5Dget_create_plist(dataset));
  bool compressed = false;
  const int nfilters = dcpl.valid() ? H5Pget_nfilters(dcpl.get()) : 0;
  for (int i = 0; i < nfilters; ++i) {
    unsigned flags = 0;
    size_t nelmts = 0;
    unsigned int cd_values[1];
    const H5Z_filter_t f = H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &nelmts, cd_values, 0,
                                          nullptr, nullptr);
    if (f != H5Z_FILTER_FLETCHER32) compressed = true;
  }
  const uint64_t limit = compressed ? stored * kMaxCompressionRatio : stored;
  if (bytes > limit)
    fail(where, detail::str_cat("declares shape ", shape_string(inf.shape), " (", bytes, " bytes) but the file stores ",
                                stored, " bytes for it", compressed ? " (compressed)" : "",
                                ": truncated or corrupted file"));
}

// A dataset with elements but without all of its storage was never completely written (a save
// that failed on a full disk): HDF5 would read it back as fill values, zeros that look like data.
void check_storage_written(hid_t dataset, const DatasetInfo& inf, const std::string& where) {
  // A null dataspace has no shape and no elements (its rank 0 would otherwise read as a scalar).
  Id file_space(H5Dget_space(dataset));
  if (!file_space.valid()) fail(where, "cannot read the dataspace");
  if (H5Sget_simple_extent_type(file_space.get()) == H5S_NULL)
    fail(where, "has no stored data (never written, or created without data)");
  uint64_t count = 1;
  for (int64_t d : inf.shape) count *= static_cast<uint64_t>(d);
  if (count == 0) return;
  Id dcpl(H5Dget_create_plist(dataset));
  if (!dcpl.valid()) fail(where, "cannot read the creation properties");
  const char* unwritten = ": never completely written (a save that failed, e.g. on a full disk)";
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_CHUNKED) {
    std::vector<hsize_t> chunk(inf.shape.size());
    check(H5Pget_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), where, "cannot read the chunk shape");
    uint64_t expected = 1;
    for (size_t i = 0; i < chunk.size(); ++i)
      expected *= (static_cast<uint64_t>(inf.shape[i]) + chunk[i] - 1) / chunk[i];
    hsize_t stored = 0;
    // HDF5 >= 1.10.5; 1.10 does not take H5S_ALL for the space.
    check(H5Dget_num_chunks(dataset, file_space.get(), &stored), where, "cannot count the stored chunks");
    if (stored < expected) fail(where, detail::str_cat("stores ", stored, " of its ", expected, " chunks", unwritten));
  } else if (layout == H5D_CONTIGUOUS) {
    Id type(H5Dget_type(dataset));
    if (!type.valid()) fail(where, "cannot read the element type");
    const uint64_t bytes = count * H5Tget_size(type.get());
    const uint64_t stored = H5Dget_storage_size(dataset);
    if (stored < bytes) fail(where, detail::str_cat("stores ", stored, " of its ", bytes, " bytes", unwritten));
  }
}
}  // namespace

at::Tensor Dataset::read() const {
  Lock lock;
  const DatasetInfo inf = stored_info();
  check_declared_size(id_.get(), inf, where());
  check_storage_written(id_.get(), inf, where());
  at::Tensor t = at::empty(inf.shape, at::TensorOptions().dtype(inf.dtype));
  if (t.numel() > 0) {
    Id mem = memory_type(inf.dtype);
    check(H5Dread(id_.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()), where(),
          "cannot read data (truncated or corrupted file?)");
  }
  if (has_attr(kTorchDtypeAttr)) {
    const at::ScalarType d = logical_dtype(attr_string(kTorchDtypeAttr), where());
    return d == at::kBool ? t.ne(0) : t.to(d);
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Group

ObjectType Group::child_type(const std::string& name) const {
  Lock lock;
  require_name(name, where());
  const htri_t exists = H5Lexists(id_.get(), name.c_str(), H5P_DEFAULT);
  check(exists, where(), "cannot look up '" + name + "'");
  if (exists == 0) return ObjectType::kNone;
  H5O_info_t oinfo;
  check(H5Oget_info_by_name2(id_.get(), name.c_str(), &oinfo, H5O_INFO_BASIC, H5P_DEFAULT), where(),
        "cannot read object info of '" + name + "'");
  if (oinfo.type == H5O_TYPE_GROUP) return ObjectType::kGroup;
  if (oinfo.type == H5O_TYPE_DATASET) return ObjectType::kDataset;
  return ObjectType::kOther;
}

namespace {
herr_t collect_link(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> Group::children() const {
  Lock lock;
  std::vector<std::string> names;
  hsize_t idx = 0;
  check(H5Literate(id_.get(), H5_INDEX_NAME, H5_ITER_INC, &idx, collect_link, &names), where(),
        "cannot list children");
  std::sort(names.begin(), names.end());
  return names;
}

Group Group::create_group(const std::string& name) const {
  Lock lock;
  require_name(name, where());
  Id gcpl(H5Pcreate(H5P_GROUP_CREATE));
  // No timestamps: the same content gives the same bytes (fixtures, diffs).
  H5Pset_obj_track_times(gcpl.get(), false);
  set_compact_storage(gcpl.get(), where());
  Id g(H5Gcreate2(id_.get(), name.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT));
  if (!g.valid()) fail(where(), "cannot create group '" + name + "'");
  return Group(std::move(g), child_path(name), file_path_);
}

void Group::link_hard(const std::string& name, const Object& target) const {
  Lock lock;
  require_name(name, where());
  check(H5Lcreate_hard(target.id_.get(), ".", id_.get(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT), where(),
        "cannot link '" + name + "' to " + target.path());
}

Group Group::open_group(const std::string& name) const {
  Lock lock;
  const ObjectType t = child_type(name);
  if (t == ObjectType::kNone) fail(where(), "missing group '" + child_path(name) + "'");
  if (t != ObjectType::kGroup) fail(where(), "'" + child_path(name) + "' is not a group");
  Id g(H5Gopen2(id_.get(), name.c_str(), H5P_DEFAULT));
  if (!g.valid()) fail(where(), "cannot open group '" + child_path(name) + "'");
  return Group(std::move(g), child_path(name), file_path_);
}

Dataset Group::open_dataset(const std::string& name) const {
  Lock lock;
  const ObjectType t = child_type(name);
  if (t == ObjectType::kNone) fail(where(), "missing dataset '" + child_path(name) + "'");
  if (t != ObjectType::kDataset) fail(where(), "'" + child_path(name) + "' is not a dataset");
  Id d(H5Dopen2(id_.get(), name.c_str(), H5P_DEFAULT));
  if (!d.valid()) fail(where(), "cannot open dataset '" + child_path(name) + "'");
  return Dataset(std::move(d), child_path(name), file_path_);
}

Dataset Group::write_tensor(const std::string& name, const at::Tensor& tensor) const {
  QF_REQUIRE(tensor.defined(), "framework/io: ", where(), ": undefined tensor for dataset '",
             child_path(name), "'");
  at::Tensor t = tensor.detach().cpu();
  std::string torch_dtype;
  if (t.scalar_type() == at::kBool) {
    torch_dtype = "bool";
    t = t.to(at::kByte);
  } else if (t.scalar_type() == at::kBFloat16) {
    torch_dtype = "bfloat16";
    t = t.to(at::kFloat);  // exact: every bfloat16 is a float32
  }
  t = t.contiguous();
  Lock lock;
  require_name(name, where());
  const std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  Id ftype = file_type(t.scalar_type());
  Id mtype = memory_type(t.scalar_type());
  Id space = simple_space(shape);
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_obj_track_times(dcpl.get(), false);
  check(H5Pset_attr_phase_change(dcpl.get(), kMaxCompact, kMaxCompact - 1), where(),
        "cannot keep attributes compact");
  if (!shape.empty() && t.numel() > 0) {
    // Chunks of whole trailing rows, halving the leading dimensions until a chunk is small.
    std::vector<hsize_t> chunk(shape.begin(), shape.end());
    auto chunk_bytes = [&] {
      int64_t b = t.element_size();
      for (hsize_t c : chunk) b *= static_cast<int64_t>(c);
      return b;
    };
    for (size_t d = 0; d < chunk.size() && chunk_bytes() > kMaxChunkBytes; ++d) {
      while (chunk[d] > 1 && chunk_bytes() > kMaxChunkBytes) chunk[d] = (chunk[d] + 1) / 2;
    }
    check(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), where(),
          "cannot set chunking for '" + name + "'");
    check(H5Pset_fletcher32(dcpl.get()), where(), "cannot enable Fletcher-32 for '" + name + "'");
  }
  Id d(H5Dcreate2(id_.get(), name.c_str(), ftype.get(), space.get(), H5P_DEFAULT, dcpl.get(),
                  H5P_DEFAULT));
  if (!d.valid()) fail(where(), "cannot create dataset '" + child_path(name) + "'");
  if (t.numel() > 0) {
    check(H5Dwrite(d.get(), mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()), where(),
          "cannot write dataset '" + child_path(name) + "'");
  }
  Dataset ds(std::move(d), child_path(name), file_path_);
  if (!torch_dtype.empty()) ds.set_attr(kTorchDtypeAttr, torch_dtype);
  return ds;
}

void Group::visit(const std::function<void(const std::string&, ObjectType, int)>& fn) const {
  std::set<uint64_t> seen{address()};
  std::function<void(const Group&, const std::string&, int)> walk = [&](const Group& g,
                                                                        const std::string& prefix,
                                                                        int depth) {
    for (const std::string& name : g.children()) {
      const std::string rel = prefix.empty() ? name : prefix + "/" + name;
      const ObjectType t = g.child_type(name);
      fn(rel, t, depth);
      if (t != ObjectType::kGroup) continue;
      const Group child = g.open_group(name);
      if (seen.insert(child.address()).second) walk(child, rel, depth + 1);
    }
  };
  walk(*this, "", 0);
}

// ---------------------------------------------------------------------------------------------
// File

File File::create(const std::string& path) {
  Lock lock;
  File f;
  f.path_ = std::make_shared<const std::string>(path);
  Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  // HDF5 1.10 formats: every metadata block (superblock, object headers, chunk indexes) carries a
  // checksum, so corruption is reported instead of misread. Readable by HDF5 >= 1.10.
  check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110), path, "cannot set format bounds");
  // H5Fclose closes the file's open objects and the file itself at once, so close() sees every
  // write that fails, not only the first object's.
  check(H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG), path, "cannot set the close degree");
  failed_closes().erase(path);
  Id fcpl(H5Pcreate(H5P_FILE_CREATE));
  H5Pset_obj_track_times(fcpl.get(), false);
  set_compact_storage(fcpl.get(), path);  // the root group's links and attributes
  f.id_ = Id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()));
  if (!f.id_.valid()) fail(path, "cannot create HDF5 file");
  return f;
}

File File::open(const std::string& path) {
  Lock lock;
  {
    std::ifstream probe(path, std::ios::binary);
    QF_REQUIRE(probe.good(), "framework/io: ", path, ": cannot open file (missing or unreadable)");
  }
  QF_REQUIRE(is_hdf5_file(path), "framework/io: ", path,
             ": not an HDF5 file (no HDF5 signature at the start)");
  File f;
  f.path_ = std::make_shared<const std::string>(path);
  f.id_ = Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.id_.valid()) fail(path, "cannot open HDF5 file (truncated or corrupted?)");
  return f;
}

File::~File() {
  if (!path_) return;
  Lock lock;
  if (id_.valid()) {
    close_open_objects(id_.get());
    id_.reset();
  }
  failed_closes().erase(*path_);
}

Group File::root() const {
  Lock lock;
  QF_REQUIRE(id_.valid(), "framework/io: file is closed");
  Id g(H5Gopen2(id_.get(), "/", H5P_DEFAULT));
  if (!g.valid()) fail(*path_, "cannot open the root group");
  return Group(std::move(g), "/", path_);
}

void File::close() {
  if (!id_.valid()) return;
  Lock lock;
  // The file is closed even when the flush fails: left open, HDF5 would retry the flush later.
  const bool flushed = H5Fflush(id_.get(), H5F_SCOPE_GLOBAL) >= 0;
  const std::string flush_detail = flushed ? std::string() : hdf5_detail();
  close_open_objects(id_.get());
  // Ownership moves to H5Fclose, whose failure must be reported, not swallowed by Id::reset.
  const bool closed = H5Fclose(id_.release()) >= 0;
  const std::string close_detail = closed ? std::string() : hdf5_detail();
  const auto lost = failed_closes().find(*path_);
  const std::string lost_what = lost == failed_closes().end() ? std::string() : lost->second;
  if (lost != failed_closes().end()) failed_closes().erase(lost);
  if (!lost_what.empty()) throw Error("framework/io: " + *path_ + ": " + lost_what);
  if (!flushed) throw Error("framework/io: " + *path_ + ": cannot flush" + flush_detail);
  if (!closed) throw Error("framework/io: " + *path_ + ": cannot close" + close_detail);
}

bool is_hdf5_file(const std::string& path) {
  Lock lock;
  return H5Fis_hdf5(path.c_str()) > 0;
}

}  // namespace qforge::io::h5
