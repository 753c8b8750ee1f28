// HDF5 wrappers: the lock, errors, type mapping, identifiers and files. With hdf5_attributes.cpp,
// hdf5_dataset.cpp and hdf5_group.cpp the only files in qforge that call the HDF5 C API.
#include "framework/format/hdf5.h"
#include "framework/format/hdf5_internal.h"

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
#include "framework/format/input_file.h"

namespace qforge::io::h5 {

static_assert(std::is_same_v<hid_t, int64_t>, "qforge needs HDF5 >= 1.10 (64-bit hid_t)");
static_assert(H5_VERSION_GE(1, 10, 5), "qforge needs HDF5 >= 1.10.5 (H5Dget_num_chunks)");

using namespace internal;

namespace {

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

Id make_float16_type() {
  Id t(H5Tcopy(H5T_IEEE_F32LE));
  // IEEE binary16: sign bit 15, exponent at bit 10 (5 bits), mantissa at bit 0 (10 bits).
  if (!t.valid() || H5Tset_fields(t.get(), 15, 10, 5, 0, 10) < 0 || H5Tset_size(t.get(), 2) < 0 ||
      H5Tset_ebias(t.get(), 15) < 0) {
    fail("float16 type", "cannot build the IEEE half type");
  }
  return t;
}

}  // namespace

namespace internal {

std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex m;
  return m;
}

Lock::Lock() {
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

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

void set_compact_storage(hid_t plist, const std::string& where) {
  check(H5Pset_link_phase_change(plist, kMaxCompact, kMaxCompact - 1), where, "cannot keep links compact");
  check(H5Pset_attr_phase_change(plist, kMaxCompact, kMaxCompact - 1), where, "cannot keep attributes compact");
}

Id string_type() {
  Id t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  return t;
}

}  // namespace internal

namespace {

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
  require_regular_file(path, "framework/io: HDF5 file");
  Lock lock;
  {
    std::ifstream probe(path, std::ios::binary);
    QF_REQUIRE(probe.good(), "framework/io: ", path, ": cannot open file (missing or unreadable)");
  }
  check_layout(path);
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
