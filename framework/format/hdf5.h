// HDF5 access for qforge's dumps and checkpoints: RAII owners of HDF5 identifiers and the few
// operations the file formats need (groups, tensor datasets, scalar/string/array attributes,
// listing). The HDF5 C API stays inside hdf5*.cpp; every failure becomes a qforge::Error naming
// the file and the object path, with HDF5's own innermost message appended. HDF5's automatic
// error printing is silenced. Calls are serialised by one process-wide lock, so a background
// save (checkpoint.h) may run while other threads read.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace qforge::io::h5 {

// Owns one HDF5 identifier (hid_t, an int64_t since HDF5 1.10) and closes it with the matching
// H5*close call. Move-only.
class Id {
 public:
  Id() = default;
  explicit Id(int64_t id) : id_(id) {}
  ~Id() { reset(); }
  Id(Id&& o) noexcept : id_(o.id_) { o.id_ = -1; }
  Id& operator=(Id&& o) noexcept;
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;

  int64_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();
  // Gives up ownership without closing.
  int64_t release() {
    const int64_t id = id_;
    id_ = -1;
    return id;
  }

 private:
  int64_t id_ = -1;
};

enum class ObjectType { kNone, kGroup, kDataset, kOther };

// Shape and element type of a dataset, read from metadata only.
struct DatasetInfo {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
};

// Something that carries attributes: a group or a dataset.
class Object {
  friend class Group;  // link_hard() needs its target's identifier

 public:
  // Full path inside the file ("/parameters/fc1/weight") and the file's path, for messages.
  const std::string& path() const { return path_; }
  const std::string& file_path() const { return *file_path_; }
  bool valid() const { return id_.valid(); }
  // The object header's address in the file: equal for every hard link to one object (walks use
  // it to visit each object once, so a link cycle cannot recurse forever).
  uint64_t address() const;

  bool has_attr(const std::string& name) const;
  std::vector<std::string> attr_names() const;
  // Writers replace an existing attribute of the same name.
  void set_attr(const std::string& name, const std::string& value) const;
  void set_attr(const std::string& name, const char* value) const { set_attr(name, std::string(value)); }
  void set_attr(const std::string& name, int64_t value) const;
  void set_attr(const std::string& name, int value) const { set_attr(name, static_cast<int64_t>(value)); }
  void set_attr(const std::string& name, bool value) const { set_attr(name, static_cast<int64_t>(value)); }
  void set_attr(const std::string& name, double value) const;
  void set_attr(const std::string& name, const std::vector<int64_t>& value) const;
  // Readers throw naming the object and attribute when it is missing or of another type.
  std::string attr_string(const std::string& name) const;
  int64_t attr_int(const std::string& name) const;
  double attr_double(const std::string& name) const;
  std::vector<int64_t> attr_ints(const std::string& name) const;
  // Printable value of any attribute (strings quoted), for qdump.
  std::string attr_to_string(const std::string& name) const;

 protected:
  Object() = default;
  Object(Id id, std::string path, std::shared_ptr<const std::string> file_path)
      : id_(std::move(id)), path_(std::move(path)), file_path_(std::move(file_path)) {}
  // "file.h5: group '/a/b'" for error messages.
  std::string where() const;
  std::string child_path(const std::string& name) const;

  Id id_;
  std::string path_;
  std::shared_ptr<const std::string> file_path_;
};

class Dataset : public Object {
 public:
  Dataset() = default;
  // Shape and dtype as read() returns them (bool / bfloat16 per the torch_dtype attribute).
  DatasetInfo info() const;
  // Shape and dtype as stored in the file.
  DatasetInfo stored_info() const;
  // Reads the whole dataset into a new CPU tensor of the stored dtype (bool and bfloat16 come back
  // as written, see Group::write_tensor).
  at::Tensor read() const;

 private:
  friend class Group;
  using Object::Object;
};

class Group : public Object {
 public:
  Group() = default;

  ObjectType child_type(const std::string& name) const;
  bool has(const std::string& name) const { return child_type(name) != ObjectType::kNone; }
  // Names of the direct children, sorted.
  std::vector<std::string> children() const;

  Group create_group(const std::string& name) const;
  // A second hard link `name` in this group to `target` (same file). Files qforge writes never
  // hold one; tests make them to check that readers and walks survive link cycles.
  void link_hard(const std::string& name, const Object& target) const;
  Group open_group(const std::string& name) const;
  Dataset open_dataset(const std::string& name) const;

  // Writes a CPU copy of `t` as dataset `name`. float32/float64/float16 and int8/uint8/int16/
  // int32/int64 map to the HDF5 types of the same width; bool is stored as uint8 and bfloat16 as
  // float32, each with attribute torch_dtype naming the original. Non-empty arrays are chunked
  // with the Fletcher-32 checksum filter, so corrupted data is detected on read.
  Dataset write_tensor(const std::string& name, const at::Tensor& t) const;
  at::Tensor read_tensor(const std::string& name) const { return open_dataset(name).read(); }

  // Depth-first walk below this group, children in name order: callback(path relative to this
  // group, type, depth). A group reached again through another hard link is reported but not
  // descended into again.
  void visit(const std::function<void(const std::string&, ObjectType, int)>& fn) const;

 private:
  friend class File;
  using Object::Object;
};

class File {
 public:
  // Creates (truncating) a file for writing.
  static File create(const std::string& path);
  // Opens an existing file read-only; throws naming the path when it is missing, not a regular
  // file, truncated or not HDF5, or when its layout is not one qforge writes (checked before HDF5
  // parses it: superblock version 2 or 3 with a valid checksum, 8-byte offsets and lengths, base
  // address 0, a version 2 root object header).
  static File open(const std::string& path);

  File() = default;
  File(File&&) = default;
  File& operator=(File&&) = default;
  ~File();

  Group root() const;
  const std::string& path() const { return *path_; }
  bool is_open() const { return id_.valid(); }
  // Flushes and closes, throwing on failure (the destructor closes silently).
  void close();

 private:
  Id id_;
  std::shared_ptr<const std::string> path_;
};

// True when `path` starts with the HDF5 signature (cheap check before opening).
bool is_hdf5_file(const std::string& path);

// Runs `fn` (a reader of a file from elsewhere, `what` naming it) in a forked child process and
// returns its result. The HDF5 library trusts the files it parses: a crafted one can crash it.
// In the child such a crash (SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL) ends the child only, and
// becomes a qforge::Error here naming `what` and the signal; an exception `fn` throws comes back
// as a qforge::Error with its message (`library` names what crashed: "the HDF5 library" unless the
// reader is another one's). A child still running after `timeout` is killed (an
// error); one killed by SIGKILL is reported as such (out of memory?); one ended by SIGPIPE,
// SIGINT, SIGTERM or SIGHUP (a closed output pipe, the user) ends this process by the same
// signal. Without memory to fork, `fn` runs here (with a note on stderr). When
// reads_in_process(), runs `fn` directly.
int run_isolated(const std::string& what, const std::function<int()>& fn,
                 std::chrono::milliseconds timeout = std::chrono::minutes(10),
                 const std::string& library = "the HDF5 library");

// True inside run_isolated's child (no second child), and in fuzz builds
// (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION): there a crash in the library must stay a crash.
bool reads_in_process();

// What identifies a file's contents without reading them: device, inode, size, modification time.
struct FileStamp {
  uint64_t dev = 0, ino = 0, size = 0;
  int64_t mtime_ns = 0;
  bool exists = false;
  bool operator==(const FileStamp& o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns && exists == o.exists;
  }
};
FileStamp file_stamp(const std::string& path);
// Throws naming `path` when its stamp is no longer `before` (read_untrusted's check).
void require_unchanged(const std::string& path, const FileStamp& before);

// `read()` of a file from elsewhere: first in run_isolated's child (a crash of the library is an
// error), then here for the result. A file that changed between the two reads (another stamp) is
// refused: the child vouched for other bytes. When reads_in_process(), reads once, here.
template <class Read>
auto read_untrusted(const std::string& path, Read&& read) {
  if (reads_in_process()) return read();
  const FileStamp before = file_stamp(path);
  run_isolated(path, [&] {
    (void)read();
    return 0;
  });
  auto result = read();
  require_unchanged(path, before);
  return result;
}

}  // namespace qforge::io::h5
