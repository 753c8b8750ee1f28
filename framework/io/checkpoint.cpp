// Checkpoints: HDF5 layout, crash-safe and background saves, lazy and partial reads.
#include "framework/io/checkpoint.h"

#include <ATen/ATen.h>

#include <atomic>
#include <cstdio>

#include "framework/core/error.h"
#include "framework/format/atomic_file.h"
#include "framework/io/format.h"
#include "framework/format/hdf5.h"

namespace qforge::io {

namespace {

constexpr const char* kParametersGroup = "parameters";
constexpr const char* kBuffersGroup = "buffers";
constexpr const char* kOptimizerGroup = "optimizer";
// Attribute marking a group as one quantized tensor (not a module group).
constexpr const char* kEncodingAttr = "encoding";
constexpr const char* kEncodingQuantized = "quantized";

const char* group_name(Section s) {
  switch (s) {
    case Section::kParameters: return kParametersGroup;
    case Section::kBuffers: return kBuffersGroup;
    case Section::kOptimizer: return kOptimizerGroup;
  }
  return "?";
}

std::string dataset_path(Section s, const std::string& module, const std::string& leaf) {
  return std::string("/") + group_name(s) + "/" + (module.empty() ? "" : module + "/") + leaf;
}

void require_key(const std::string& key, Section s) {
  const auto [module, leaf] = split_key(key);
  QF_REQUIRE(!key.empty() && !leaf.empty() && key.find('/') == std::string::npos &&
                 key.front() != '.' && (s == Section::kOptimizer || key.find("..") == std::string::npos),
             "framework/io: checkpoint: invalid ", to_string(s), " key '", key,
             "' (non-empty, dot-separated names, no '/')");
}

void write_quantized(const h5::Group& parent, const std::string& name, const QuantizedTensor& q) {
  const QType& qt = q.qtype();
  const h5::Group g = parent.create_group(name);
  g.set_attr(kEncodingAttr, kEncodingQuantized);
  g.set_attr("qtype", qt.name);
  g.set_attr("bits", qt.bits);
  g.set_attr("signed", qt.is_signed);
  g.set_attr("quant_min", qt.quant_min);
  g.set_attr("quant_max", qt.quant_max);
  g.set_attr("granularity", to_string(q.spec.granularity));
  g.set_attr("axis", q.spec.axis);
  g.set_attr("group_size", q.spec.group_size);
  g.set_attr("shape", q.shape);
  g.set_attr("packing", q.packing());
  g.write_tensor("data", q.data);
  if (qt.is_codebook()) {
    g.write_tensor("codebook", q.codebook);  // float16 levels; no scale or zero point
    return;
  }
  if (qt.is_microscaling()) {
    g.write_tensor("scale", q.scale);  // uint8 E8M0 / E4M3 codes per block; no zero point
    if (q.tensor_scale.defined()) g.write_tensor("tensor_scale", q.tensor_scale);
    return;
  }
  g.write_tensor("scale", q.scale);
  g.write_tensor("zero_point", q.zero_point);
}

// Writes one section of named entries, creating one group per module path.
void write_section(const h5::Group& root, Section s, const std::map<std::string, at::Tensor>& tensors,
                   const std::map<std::string, QuantizedTensor>* quantized) {
  const h5::Group sg = root.create_group(group_name(s));
  std::map<std::string, h5::Group> modules;
  std::map<std::string, std::string> root_leaves;  // leaf -> key, to catch module/leaf clashes
  auto parent_of = [&](const std::string& key) -> const h5::Group& {
    const auto [module, leaf] = split_key(key);
    if (module.empty()) {
      QF_REQUIRE(!modules.count(leaf), "framework/io: checkpoint: key '", key,
                 "' clashes with module group '", leaf, "'");
      root_leaves[leaf] = key;
      return sg;
    }
    QF_REQUIRE(!root_leaves.count(module), "framework/io: checkpoint: module path '", module,
               "' clashes with entry '", root_leaves[module], "'");
    auto it = modules.find(module);
    if (it == modules.end()) it = modules.emplace(module, sg.create_group(module)).first;
    return it->second;
  };
  // Root-level leaves first so the clash check sees them before module groups are made.
  auto by_depth = [](const auto& m) {
    std::vector<std::string> keys;
    for (const auto& kv : m) keys.push_back(kv.first);
    std::stable_partition(keys.begin(), keys.end(),
                          [](const std::string& k) { return k.find('.') == std::string::npos; });
    return keys;
  };
  if (s == Section::kOptimizer) {
    for (const auto& [key, t] : tensors) sg.write_tensor(key, t);
    return;
  }
  for (const std::string& key : by_depth(tensors)) {
    parent_of(key).write_tensor(split_key(key).second, tensors.at(key));
  }
  if (quantized) {
    for (const std::string& key : by_depth(*quantized)) {
      write_quantized(parent_of(key), split_key(key).second, quantized->at(key));
    }
  }
}

void validate(const CheckpointData& d) {
  auto check_tensors = [](const std::map<std::string, at::Tensor>& m, Section s) {
    for (const auto& [key, t] : m) {
      require_key(key, s);
      QF_REQUIRE(t.defined(), "framework/io: checkpoint: ", to_string(s), " '", key,
                 "' is an undefined tensor");
    }
  };
  check_tensors(d.parameters, Section::kParameters);
  check_tensors(d.buffers, Section::kBuffers);
  check_tensors(d.optimizer, Section::kOptimizer);
  for (const auto& [key, q] : d.quantized) {
    require_key(key, Section::kParameters);
    QF_REQUIRE(!d.parameters.count(key), "framework/io: checkpoint: '", key,
               "' is both a float and a quantized parameter");
    const std::string who = "framework/io: checkpoint: quantized parameter '" + key + "'";
    QF_REQUIRE(q.qtype().is_integer() || q.qtype().is_codebook() || q.qtype().is_microscaling(), who, ": qtype ",
               q.qtype().name,
               " cannot be stored as packed integers (float8 weights are stored as uint8 codes)");
    q.validate(who);
  }
}

}  // namespace

std::pair<std::string, std::string> split_key(const std::string& key) {
  const size_t dot = key.rfind('.');
  if (dot == std::string::npos) return {"", key};
  return {key.substr(0, dot), key.substr(dot + 1)};
}

std::string dataset_path(Section s, const std::string& key) {
  const auto [module, leaf] = split_key(key);
  return dataset_path(s, module, leaf);
}

const char* to_string(Section s) {
  switch (s) {
    case Section::kParameters: return "parameter";
    case Section::kBuffers: return "buffer";
    case Section::kOptimizer: return "optimizer state";
  }
  return "?";
}

bool key_matches_prefix(const std::string& key, const std::string& prefix) {
  if (prefix.empty()) return true;
  if (key.size() < prefix.size() || key.compare(0, prefix.size(), prefix) != 0) return false;
  return key.size() == prefix.size() || key[prefix.size()] == '.';
}

CheckpointData snapshot(const CheckpointData& data) {
  auto copy = [](const at::Tensor& t) {
    // clone() after cpu(): a CPU tensor must be copied too, as training keeps mutating it.
    return t.defined() ? t.detach().cpu().clone(at::MemoryFormat::Contiguous) : t;
  };
  auto copy_map = [&](const std::map<std::string, at::Tensor>& m) {
    std::map<std::string, at::Tensor> out;
    for (const auto& [k, t] : m) out.emplace(k, copy(t));
    return out;
  };
  CheckpointData s;
  s.parameters = copy_map(data.parameters);
  s.buffers = copy_map(data.buffers);
  s.optimizer = copy_map(data.optimizer);
  for (const auto& [k, q] : data.quantized) {
    QuantizedTensor c = q;
    c.data = copy(q.data);
    c.scale = copy(q.scale);
    c.zero_point = copy(q.zero_point);
    c.codebook = copy(q.codebook);
    c.tensor_scale = copy(q.tensor_scale);
    s.quantized.emplace(k, std::move(c));
  }
  s.optimizer_kind = data.optimizer_kind;
  s.step = data.step;
  s.recipe = data.recipe;
  return s;
}

void save_checkpoint(const std::string& path, const CheckpointData& data) { save_checkpoint(path, data, nullptr); }

void save_checkpoint(const std::string& path, const CheckpointData& data,
                     const std::function<void(const h5::Group& root)>& extra) {
  validate(data);
  AtomicFile out(path);
  {
    h5::File f = h5::File::create(out.temp_path());
    const h5::Group root = f.root();
    write_format(root, kCheckpointFormat, kCheckpointFormatVersion);
    root.set_attr("step", data.step);
    root.set_attr("recipe", data.recipe);
    root.set_attr("optimizer_kind", data.optimizer_kind);
    write_section(root, Section::kParameters, data.parameters, &data.quantized);
    write_section(root, Section::kBuffers, data.buffers, nullptr);
    write_section(root, Section::kOptimizer, data.optimizer, nullptr);
    if (extra) extra(root);
    f.close();
  }
  out.commit();
}

// ---------------------------------------------------------------------------------------------
// Background saves

SaveHandle& SaveHandle::operator=(SaveHandle&& o) {
  if (this != &o) {
    if (future_.valid()) wait();
    future_ = std::move(o.future_);
    path_ = std::move(o.path_);
  }
  return *this;
}

SaveHandle::~SaveHandle() {
  if (!future_.valid()) return;
  try {
    future_.get();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qforge: background save to '%s' failed (never waited on): %s\n",
                 path_.c_str(), e.what());
  }
}

void SaveHandle::wait() {
  if (future_.valid()) future_.get();
}

bool SaveHandle::done() const {
  return !future_.valid() ||
         future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

SaveHandle save_checkpoint_async(const std::string& path, const CheckpointData& data) {
  validate(data);  // bad input fails here, in the caller's thread
  return SaveHandle(std::async(std::launch::async, [path, snap = snapshot(data)] { save_checkpoint(path, snap); }),
                    path);
}

// ---------------------------------------------------------------------------------------------
// Reader

struct CheckpointReader::Impl {
  h5::File file;
  h5::Group root;
  int64_t format_version = 0;
  std::string qforge_version, recipe, optimizer_kind;
  int64_t step = 0;
  struct Entry {
    EntryInfo info;
    std::string module, leaf;
  };
  std::map<std::pair<Section, std::string>, Entry> index;
  mutable std::atomic<int64_t> reads{0};

  std::string where(const Entry& e) const {
    return "framework/io: " + file.path() + ": dataset '" + e.info.dataset_path + "'";
  }

  const Entry& find(const std::string& key, Section s) const {
    auto it = index.find({s, key});
    if (it != index.end()) return it->second;
    const auto [module, leaf] = split_key(key);
    throw Error("framework/io: " + file.path() + ": no " + to_string(s) + " '" + key +
                "' (missing dataset '" + dataset_path(s, module, leaf) + "')");
  }

  h5::Group parent(const Entry& e) const {
    h5::Group sg = root.open_group(group_name(e.info.section));
    if (e.module.empty()) return sg;
    return sg.open_group(e.module);
  }

  void add(Section s, const h5::Group& parent, const std::string& module, const std::string& leaf) {
    Entry e;
    e.module = module;
    e.leaf = leaf;
    e.info.section = s;
    e.info.key = module.empty() ? leaf : module + "." + leaf;
    e.info.dataset_path = dataset_path(s, module, leaf);
    if (parent.child_type(leaf) == h5::ObjectType::kDataset) {
      const h5::DatasetInfo di = parent.open_dataset(leaf).info();
      e.info.shape = di.shape;
      e.info.dtype = di.dtype;
    } else {
      const h5::Group g = parent.open_group(leaf);
      e.info.quantized = true;
      e.info.shape = g.attr_ints("shape");
      e.info.qtype = g.attr_string("qtype");
    }
    index[{s, e.info.key}] = std::move(e);
  }

  void build_index() {
    for (Section s : {Section::kParameters, Section::kBuffers, Section::kOptimizer}) {
      if (!root.has(group_name(s))) continue;
      const h5::Group sg = root.open_group(group_name(s));
      for (const std::string& name : sg.children()) {
        const h5::ObjectType t = sg.child_type(name);
        if (t == h5::ObjectType::kDataset || s == Section::kOptimizer) {
          add(s, sg, "", name);
          continue;
        }
        const h5::Group g = sg.open_group(name);
        if (g.has_attr(kEncodingAttr)) {
          add(s, sg, "", name);
          continue;
        }
        for (const std::string& leaf : g.children()) add(s, g, name, leaf);
      }
    }
  }

  QuantizedTensor read_quantized(const Entry& e) const {
    QF_REQUIRE(e.info.quantized, where(e), ": is a float tensor (", e.info.dtype,
               "), not a quantized one");
    const h5::Group g = parent(e).open_group(e.leaf);
    const std::string enc = g.attr_string(kEncodingAttr);
    QF_REQUIRE(enc == kEncodingQuantized, where(e), ": unknown encoding '", enc, "'");
    const QuantizedTensor q = read_quantized_group(g, where(e));
    reads += 3;
    return q;
  }

  at::Tensor read_tensor(const Entry& e, bool dequant) const {
    if (e.info.quantized) {
      QF_REQUIRE(dequant, where(e), ": is quantized (", e.info.qtype,
                 "); read it with read_quantized or ask for dequantization");
      return read_quantized(e).dequantize();
    }
    at::Tensor t = parent(e).read_tensor(e.leaf);
    ++reads;
    return t;
  }
};

CheckpointReader::CheckpointReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->file = h5::File::open(path);
  impl_->root = impl_->file.root();
  const h5::Group& root = impl_->root;
  impl_->format_version = check_format(root, kCheckpointFormat, kCheckpointFormatVersion);
  impl_->qforge_version = root.has_attr("qforge_version") ? root.attr_string("qforge_version") : "";
  impl_->step = root.attr_int("step");
  impl_->recipe = root.attr_string("recipe");
  impl_->optimizer_kind = root.attr_string("optimizer_kind");
  impl_->build_index();
}

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;

const std::string& CheckpointReader::path() const { return impl_->file.path(); }
int64_t CheckpointReader::format_version() const { return impl_->format_version; }
const std::string& CheckpointReader::qforge_version() const { return impl_->qforge_version; }
int64_t CheckpointReader::step() const { return impl_->step; }
const std::string& CheckpointReader::recipe() const { return impl_->recipe; }
const std::string& CheckpointReader::optimizer_kind() const { return impl_->optimizer_kind; }
QuantizedTensor read_quantized_group(const h5::Group& g, const std::string& where) {
  QuantizedTensor q;
  try {
    q.spec.qtype = qtype_from_name(g.attr_string("qtype"));
    q.spec.granularity = granularity_from_name(g.attr_string("granularity"));
  } catch (const Error& err) {
    if (std::string(err.what()).find(where) != std::string::npos) throw;
    throw Error(where + ": " + err.what());
  }
  QF_REQUIRE(q.spec.qtype.is_integer() || q.spec.qtype.is_codebook() || q.spec.qtype.is_microscaling(), where,
             ": qtype ", q.spec.qtype.name, " is not an integer, codebook or microscaling grid");
  QF_REQUIRE(g.attr_int("bits") == q.spec.qtype.bits, where, ": attribute bits ", g.attr_int("bits"),
             " disagrees with qtype ", q.spec.qtype.name);
  const std::string packing = g.attr_string("packing");
  q.spec.axis = g.attr_int("axis");
  q.spec.group_size = g.attr_int("group_size");
  q.shape = g.attr_ints("shape");
  QF_REQUIRE(packing == q.packing(), where, ": packing '", packing, "' is not valid for ", q.spec.qtype.name,
             " (expected '", q.packing(), "')");
  q.data = g.read_tensor("data");
  if (q.spec.qtype.is_codebook()) {
    q.codebook = g.read_tensor("codebook");
  } else if (q.spec.qtype.is_microscaling()) {
    q.scale = g.read_tensor("scale");
    QF_REQUIRE(q.spec.qtype != qnvfp4 || g.has("tensor_scale"), where, ": nvfp4 entry without its tensor_scale dataset");
    if (g.has("tensor_scale")) q.tensor_scale = g.read_tensor("tensor_scale");
  } else {
    q.scale = g.read_tensor("scale");
    q.zero_point = g.read_tensor("zero_point");
  }
  q.validate(where);
  return q;
}

int64_t CheckpointReader::datasets_read() const { return impl_->reads; }

namespace {
bool selected(const EntryInfo& e, const ReadOptions& o) {
  switch (e.section) {
    case Section::kParameters: return o.parameters && key_matches_prefix(e.key, o.prefix);
    case Section::kBuffers: return o.buffers && key_matches_prefix(e.key, o.prefix);
    case Section::kOptimizer: return o.optimizer;
  }
  return false;
}
}  // namespace

std::vector<EntryInfo> CheckpointReader::entries(const ReadOptions& options) const {
  std::vector<EntryInfo> out;
  for (const auto& [k, e] : impl_->index) {
    if (selected(e.info, options)) out.push_back(e.info);
  }
  return out;
}

bool CheckpointReader::contains(const std::string& key, Section section) const {
  return impl_->index.count({section, key}) > 0;
}

const EntryInfo& CheckpointReader::info(const std::string& key, Section section) const {
  return impl_->find(key, section).info;
}

at::Tensor CheckpointReader::read_tensor(const std::string& key, Section section,
                                         bool dequant) const {
  return impl_->read_tensor(impl_->find(key, section), dequant);
}

QuantizedTensor CheckpointReader::read_quantized(const std::string& key, Section section) const {
  return impl_->read_quantized(impl_->find(key, section));
}

CheckpointData CheckpointReader::read(const ReadOptions& options) const {
  CheckpointData d;
  d.step = impl_->step;
  d.recipe = impl_->recipe;
  d.optimizer_kind = impl_->optimizer_kind;
  for (const auto& [k, e] : impl_->index) {
    if (!selected(e.info, options)) continue;
    switch (e.info.section) {
      case Section::kParameters:
        if (e.info.quantized) d.quantized[e.info.key] = impl_->read_quantized(e);
        else d.parameters[e.info.key] = impl_->read_tensor(e, false);
        break;
      case Section::kBuffers:
        if (e.info.quantized) d.quantized[e.info.key] = impl_->read_quantized(e);
        else d.buffers[e.info.key] = impl_->read_tensor(e, false);
        break;
      case Section::kOptimizer: d.optimizer[e.info.key] = impl_->read_tensor(e, false); break;
    }
  }
  return d;
}

void CheckpointReader::load_into(const std::map<std::string, at::Tensor>& parameters,
                                 const std::map<std::string, at::Tensor>& buffers,
                                 const LoadOptions& options) const {
  std::vector<std::pair<at::Tensor, at::Tensor>> staged;  // (target, value)
  auto stage = [&](const std::map<std::string, at::Tensor>& targets, Section s) {
    for (const auto& [key, target] : targets) {
      if (!key_matches_prefix(key, options.prefix)) continue;
      const Impl::Entry& e = impl_->find(key, s);
      QF_REQUIRE(target.defined(), impl_->where(e), ": target tensor is undefined");
      QF_REQUIRE(e.info.shape == target.sizes().vec(), impl_->where(e), " has shape ",
                 at::IntArrayRef(e.info.shape), ", model expects ", target.sizes());
      at::Tensor v = impl_->read_tensor(e, options.dequantize);
      const bool both_float = at::isFloatingType(v.scalar_type()) &&
                              at::isFloatingType(target.scalar_type());
      QF_REQUIRE(both_float || v.scalar_type() == target.scalar_type(), impl_->where(e), " has dtype ",
                 v.scalar_type(), ", model expects ", target.scalar_type());
      staged.emplace_back(target, v);
    }
    if (!options.strict) return;
    for (const auto& [k, e] : impl_->index) {
      if (k.first != s || !key_matches_prefix(e.info.key, options.prefix)) continue;
      QF_REQUIRE(targets.count(e.info.key), impl_->where(e), ": the checkpoint's ", to_string(s),
                 " '", e.info.key, "' has no counterpart in the model (strict load)");
    }
  };
  if (options.parameters) stage(parameters, Section::kParameters);
  if (options.buffers) stage(buffers, Section::kBuffers);
  // Everything is read and checked: now the copies, which cannot fail on shape or dtype.
  at::NoGradGuard no_grad;
  for (auto& [target, value] : staged) target.copy_(value);
}

}  // namespace qforge::io
