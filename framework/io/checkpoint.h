// Checkpoints: named float tensors, quantized weights, buffers, optimizer state, the training
// step and the recipe, in one HDF5 file readable without qforge. Layer-independent: entries are
// keyed like named_parameters() ("encoder.layer.3.weight"); groups mirror module paths.
//   /                               format="qforge.checkpoint", format_version=1, qforge_version,
//                                   step, recipe, optimizer_kind
//   /parameters/<module>/<name>     float dataset, or a quantized group (data, scale, zero_point)
//   /buffers/<module>/<name>        same
//   /optimizer/<key>                optimizer state tensors
// Saves are crash-safe (AtomicFile); save_checkpoint_async writes a snapshot on a background
// thread. Reads are lazy: CheckpointReader reads metadata up front and a dataset only when asked.
// Full layout and the dequantization formula: docs/formats.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "framework/api/quantized_tensor.h"

namespace qforge::io {

struct CheckpointData {
  std::map<std::string, at::Tensor> parameters;       // float (or any dtype) parameters
  std::map<std::string, QuantizedTensor> quantized;   // quantized parameters (keys disjoint)
  std::map<std::string, at::Tensor> buffers;
  std::map<std::string, at::Tensor> optimizer;        // optimizer state, flat keys
  std::string optimizer_kind;                         // e.g. "adam"; empty when none
  int64_t step = 0;
  std::string recipe;                                 // recipe text (YAML) used; may be empty
};

// Deep CPU copy of every tensor: what save_checkpoint_async writes.
CheckpointData snapshot(const CheckpointData& data);

// Writes `data` to `path` crash-safely: a process killed at any point leaves the previous file
// intact. Throws qforge::Error naming the entry on bad input (e.g. a key in both parameters and
// quantized, an invalid QuantizedTensor); the old file is then untouched.
void save_checkpoint(const std::string& path, const CheckpointData& data);

namespace h5 {
class Group;
}
// The same, plus `extra(root)` writing further groups into the file before it is committed
// (model_io's /model group), so the whole file is still one crash-safe write.
void save_checkpoint(const std::string& path, const CheckpointData& data,
                     const std::function<void(const h5::Group& root)>& extra);

// One quantized entry (a group with encoding "quantized", docs/formats.md): read and validated,
// errors prefixed with `where`. The one reader of that layout (CheckpointReader and qdump use it).
QuantizedTensor read_quantized_group(const h5::Group& g, const std::string& where);

// A background save. wait() blocks until the file is committed and rethrows the writer's error.
// The destructor waits too (reporting an unobserved error on stderr, never throwing).
class SaveHandle {
 public:
  SaveHandle() = default;
  // A save running as `future`, writing `path` (used in the report of an unobserved error).
  SaveHandle(std::future<void> future, std::string path) : future_(std::move(future)), path_(std::move(path)) {}
  SaveHandle(SaveHandle&&) = default;
  SaveHandle& operator=(SaveHandle&&);
  ~SaveHandle();

  void wait();
  bool done() const;
  bool valid() const { return future_.valid(); }

 private:
  std::future<void> future_;
  std::string path_;
};

// Snapshots `data` (copies every tensor before returning, so training may keep mutating them),
// then writes it on a background thread.
SaveHandle save_checkpoint_async(const std::string& path, const CheckpointData& data);

enum class Section { kParameters, kBuffers, kOptimizer };
const char* to_string(Section s);

// "a.b.c" -> module "a.b", leaf "c"; "c" -> module "", leaf "c".
std::pair<std::string, std::string> split_key(const std::string& key);
// The HDF5 dataset path of `key` in section `s`: "/parameters/a.b/c" (docs/formats.md).
std::string dataset_path(Section s, const std::string& key);

struct ReadOptions {
  // Only keys equal to `prefix` or below it ("encoder.layer.3" selects "encoder.layer.3.weight",
  // not "encoder.layer.30.weight"). Empty: everything. Applies to parameters and buffers.
  std::string prefix;
  bool parameters = true;
  bool buffers = true;
  bool optimizer = true;

  static ReadOptions parameters_only(std::string prefix = {}) {
    ReadOptions o;
    o.prefix = std::move(prefix);
    o.buffers = false;
    o.optimizer = false;
    return o;
  }
};

// What the reader knows about an entry without reading its data.
struct EntryInfo {
  Section section = Section::kParameters;
  std::string key;           // "encoder.layer.3.weight"
  std::string dataset_path;  // "/parameters/encoder.layer.3/weight"
  bool quantized = false;
  std::vector<int64_t> shape;  // float shape (original shape when quantized)
  at::ScalarType dtype = at::kFloat;  // stored dtype; float32 for quantized entries
  std::string qtype;         // quantized entries: qtype name
};

struct LoadOptions : ReadOptions {
  // Every selected file entry must have a target (in addition to every target having an entry).
  bool strict = true;
  // Quantized entries may fill float targets with their dequantized values.
  bool dequantize = false;
};

class CheckpointReader {
 public:
  // Opens `path` and reads its metadata (root attributes, the entry tree, shapes); no tensor data.
  // Throws qforge::Error for missing, foreign, truncated or newer-version files.
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;

  const std::string& path() const;
  int64_t format_version() const;
  const std::string& qforge_version() const;
  int64_t step() const;
  const std::string& recipe() const;
  const std::string& optimizer_kind() const;

  // Entries selected by `options`, in key order per section.
  std::vector<EntryInfo> entries(const ReadOptions& options = {}) const;
  bool contains(const std::string& key, Section section = Section::kParameters) const;
  const EntryInfo& info(const std::string& key, Section section = Section::kParameters) const;

  // Reads one entry. read_tensor throws for quantized entries (naming the qtype) unless
  // `dequantize`; read_quantized throws for float entries.
  at::Tensor read_tensor(const std::string& key, Section section = Section::kParameters,
                         bool dequantize = false) const;
  QuantizedTensor read_quantized(const std::string& key,
                                 Section section = Section::kParameters) const;

  // Reads every selected entry.
  CheckpointData read(const ReadOptions& options = {}) const;

  // Copies entries into `parameters` / `buffers` (e.g. a module's named_parameters() and
  // named_buffers(), keyed the same way), selected by `options` (prefix applies to target keys
  // too). Everything is read and checked first -- missing keys, shapes, dtypes, qtypes -- and only
  // then copied, so on any error the targets are exactly as they were.
  void load_into(const std::map<std::string, at::Tensor>& parameters,
                 const std::map<std::string, at::Tensor>& buffers,
                 const LoadOptions& options = {}) const;

  // Number of datasets whose data this reader has read (lazy-read accounting, for tests).
  int64_t datasets_read() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True when `key` is `prefix` or lies below it at a '.' boundary (empty prefix: always).
bool key_matches_prefix(const std::string& key, const std::string& prefix);

}  // namespace qforge::io
