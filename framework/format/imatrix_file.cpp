// llama.cpp's imatrix files: the GGUF layout through qforge's GGUF container, the legacy .dat
// layout byte by byte.
#include "framework/format/imatrix_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "framework/core/error.h"
#include "framework/format/atomic_file.h"
#include "framework/format/input_file.h"

namespace qforge::io {

namespace {

constexpr const char* kSumSq = ".in_sum2";
constexpr const char* kSum = ".in_sum";
constexpr const char* kCounts = ".counts";
constexpr uint32_t kGgufMagicLe = 0x46554747;  // "GGUF"

GgufTensor f32_tensor(const std::string& name, const std::vector<double>& v, std::vector<uint64_t> ne) {
  GgufTensor t;
  t.name = name;
  t.type = GgmlType::kF32;
  t.ne = std::move(ne);
  t.data.resize(v.size() * sizeof(float));
  for (size_t i = 0; i < v.size(); ++i) {
    const auto f = static_cast<float>(v[i]);
    std::memcpy(t.data.data() + i * sizeof(float), &f, sizeof f);
  }
  return t;
}

std::vector<double> f32_values(const GgufTensor& t, const std::string& source) {
  QF_REQUIRE(t.type == GgmlType::kF32, "imatrix: ", source, ": tensor '", t.name, "' is ", ggml_type_name(t.type),
             ", expected F32");
  std::vector<double> v(t.data.size() / sizeof(float));
  for (size_t i = 0; i < v.size(); ++i) {
    float f;
    std::memcpy(&f, t.data.data() + i * sizeof(float), sizeof f);
    v[i] = f;
  }
  return v;
}

bool strip_suffix(std::string& s, const std::string& suffix) {
  if (s.size() <= suffix.size() || s.compare(s.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
  s.resize(s.size() - suffix.size());
  return true;
}

void check_tensor(const ImatrixTensor& t) {
  QF_REQUIRE(!t.name.empty() && !t.sum_sq.empty(), "imatrix: an entry needs a name and values");
  QF_REQUIRE(t.sum.empty() || t.sum.size() == t.sum_sq.size(), "imatrix: ", t.name, ": Σx has ", t.sum.size(),
             " values, Σx² ", t.sum_sq.size());
  QF_REQUIRE(t.count > 0, "imatrix: ", t.name, ": row count must be > 0, got ", t.count);
  for (double v : t.sum_sq) QF_REQUIRE(std::isfinite(v) && v >= 0, "imatrix: ", t.name, ": Σx² holds ", v);
}

std::vector<const ImatrixTensor*> sorted(const ImatrixFile& f) {
  std::vector<const ImatrixTensor*> out;
  for (const ImatrixTensor& t : f.tensors) {
    check_tensor(t);
    out.push_back(&t);
  }
  std::sort(out.begin(), out.end(), [](const auto* a, const auto* b) { return a->name < b->name; });
  for (size_t i = 1; i < out.size(); ++i)
    QF_REQUIRE(out[i]->name != out[i - 1]->name, "imatrix: tensor '", out[i]->name, "' appears twice");
  return out;
}

// Little-endian reads of the legacy layout, each checked against the bytes left.
class DatReader {
 public:
  DatReader(const std::vector<uint8_t>& b, const std::string& source) : b_(b), source_(source) {}
  int32_t i32(const char* what) {
    need(sizeof(int32_t), what);
    int32_t v;
    std::memcpy(&v, b_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string bytes(int32_t n, const char* what) {
    QF_REQUIRE(n >= 0, "imatrix: ", source_, ": negative length ", n, " for ", what);
    need(static_cast<size_t>(n), what);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  std::vector<double> floats(int32_t n, const char* what) {
    QF_REQUIRE(n > 0, "imatrix: ", source_, ": ", what, " count must be > 0, got ", n);
    need(static_cast<size_t>(n) * sizeof(float), what);
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) {
      float f;
      std::memcpy(&f, b_.data() + pos_, sizeof f);
      pos_ += sizeof f;
      x = f;
    }
    return v;
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  void need(size_t n, const char* what) const {
    QF_REQUIRE(b_.size() - pos_ >= n, "imatrix: ", source_, " is truncated (", what, " at byte ", pos_, " needs ", n,
               " bytes, ", b_.size() - pos_, " left)");
  }
  const std::vector<uint8_t>& b_;
  const std::string& source_;
  size_t pos_ = 0;
};

void put_i32(std::vector<uint8_t>& out, int64_t v, const char* what) {
  QF_REQUIRE(v >= 0 && v <= INT32_MAX, "imatrix: ", what, " ", v, " does not fit the legacy layout's int32");
  const auto x = static_cast<int32_t>(v);
  const auto* p = reinterpret_cast<const uint8_t*>(&x);
  out.insert(out.end(), p, p + sizeof x);
}

}  // namespace

GgufFile imatrix_gguf(const ImatrixFile& f) {
  QF_REQUIRE(f.chunk_size > 0, "imatrix: chunk_size must be > 0, got ", f.chunk_size);
  GgufFile g;
  std::vector<GgufValue> datasets;
  for (const std::string& d : f.datasets) datasets.push_back(GgufValue::str(d));
  g.metadata.emplace_back("general.type", GgufValue::str("imatrix"));
  g.metadata.emplace_back("imatrix.datasets", GgufValue::array(GgufValueType::kString, std::move(datasets)));
  g.metadata.emplace_back("imatrix.chunk_count", GgufValue::u32(static_cast<uint32_t>(f.chunk_count)));
  g.metadata.emplace_back("imatrix.chunk_size", GgufValue::u32(static_cast<uint32_t>(f.chunk_size)));
  for (const ImatrixTensor* t : sorted(f)) {
    const uint64_t k = t->sum_sq.size();
    g.tensors.push_back(f32_tensor(t->name + kSumSq, t->sum_sq, {k, 1}));
    g.tensors.push_back(f32_tensor(t->name + kCounts, {static_cast<double>(t->count)}, {1, 1}));
    if (!t->sum.empty()) g.tensors.push_back(f32_tensor(t->name + kSum, t->sum, {k, 1}));
  }
  return g;
}

ImatrixFile imatrix_from_gguf(const GgufFile& g, const std::string& source) {
  const GgufValue* type = g.find("general.type");
  QF_REQUIRE(type && type->type == GgufValueType::kString && type->as_string("general.type") == "imatrix", "imatrix: ",
             source, " is a GGUF file but not an imatrix (general.type is not 'imatrix')");
  ImatrixFile f;
  if (const GgufValue* v = g.find("imatrix.chunk_size")) f.chunk_size = static_cast<int64_t>(v->as_uint("imatrix.chunk_size"));
  if (const GgufValue* v = g.find("imatrix.chunk_count")) f.chunk_count = static_cast<int64_t>(v->as_uint("imatrix.chunk_count"));
  if (const GgufValue* v = g.find("imatrix.datasets"))
    for (const GgufValue& d : v->as_array("imatrix.datasets")) f.datasets.push_back(d.as_string("imatrix.datasets"));
  std::map<std::string, ImatrixTensor> by_name;
  for (const GgufTensor& t : g.tensors) {
    std::string name = t.name;
    if (strip_suffix(name, kSumSq)) by_name[name].sum_sq = f32_values(t, source);
    else if (strip_suffix(name, kCounts)) {
      const std::vector<double> c = f32_values(t, source);
      QF_REQUIRE(c.size() == 1, "imatrix: ", source, ": '", t.name, "' holds ", c.size(),
                 " counts (per-expert counts are not read)");
      by_name[name].count = std::llround(c[0]);
    } else if (strip_suffix(name, kSum)) {
      by_name[name].sum = f32_values(t, source);
    }
  }
  for (auto& [name, t] : by_name) {
    t.name = name;
    QF_REQUIRE(!t.sum_sq.empty() && t.count > 0, "imatrix: ", source, ": '", name, "' lacks its ",
               t.sum_sq.empty() ? kSumSq : kCounts, " tensor");
    check_tensor(t);
    f.tensors.push_back(std::move(t));
  }
  return f;
}

std::vector<uint8_t> serialize_imatrix_dat(const ImatrixFile& f) {
  QF_REQUIRE(f.chunk_size > 0, "imatrix: chunk_size must be > 0, got ", f.chunk_size);
  const std::vector<const ImatrixTensor*> tensors = sorted(f);
  std::vector<uint8_t> out;
  put_i32(out, static_cast<int64_t>(tensors.size()), "entry count");
  for (const ImatrixTensor* t : tensors) {
    put_i32(out, static_cast<int64_t>(t->name.size()), "name length");
    out.insert(out.end(), t->name.begin(), t->name.end());
    const int64_t ncall = (t->count + f.chunk_size - 1) / f.chunk_size;
    put_i32(out, ncall, "ncall");
    put_i32(out, static_cast<int64_t>(t->sum_sq.size()), "value count");
    for (double v : t->sum_sq) {
      const auto x = static_cast<float>(v / static_cast<double>(t->count) * static_cast<double>(ncall));
      const auto* p = reinterpret_cast<const uint8_t*>(&x);
      out.insert(out.end(), p, p + sizeof x);
    }
  }
  put_i32(out, f.chunk_count, "chunk count");
  const std::string dataset = f.datasets.empty() ? std::string() : f.datasets.back();
  put_i32(out, static_cast<int64_t>(dataset.size()), "dataset length");
  out.insert(out.end(), dataset.begin(), dataset.end());
  return out;
}

ImatrixFile parse_imatrix_dat(const std::vector<uint8_t>& bytes, const std::string& source) {
  DatReader r(bytes, source);
  const int32_t n = r.i32("entry count");
  QF_REQUIRE(n > 0, "imatrix: ", source, " is not an imatrix file (entry count ", n, ")");
  ImatrixFile f;
  for (int32_t i = 0; i < n; ++i) {
    ImatrixTensor t;
    t.name = r.bytes(r.i32("name length"), "name");
    const int32_t ncall = r.i32("ncall");
    QF_REQUIRE(ncall > 0, "imatrix: ", source, ": '", t.name, "' has ncall ", ncall);
    t.sum_sq = r.floats(r.i32("value count"), "values");
    // As llama.cpp reads it back: Σx² = value · chunk_size over ncall · chunk_size rows.
    for (double& v : t.sum_sq) v *= static_cast<double>(f.chunk_size);
    t.count = static_cast<int64_t>(ncall) * f.chunk_size;
    check_tensor(t);
    f.tensors.push_back(std::move(t));
  }
  if (!r.done()) f.chunk_count = r.i32("chunk count");
  if (!r.done()) f.datasets.push_back(r.bytes(r.i32("dataset length"), "dataset name"));
  QF_REQUIRE(r.done(), "imatrix: ", source, " has trailing bytes after the dataset name");
  return f;
}

void write_imatrix(const std::string& path, const ImatrixFile& f) {
  const bool dat = path.size() >= 4 && path.compare(path.size() - 4, 4, ".dat") == 0;
  if (!dat) return write_gguf(path, imatrix_gguf(f));
  const std::vector<uint8_t> bytes = serialize_imatrix_dat(f);
  write_text_atomically(path, std::string(bytes.begin(), bytes.end()));
}

ImatrixFile read_imatrix(const std::string& path) {
  const std::vector<uint8_t> bytes = read_regular_file(path, "imatrix: file");
  uint32_t magic = 0;
  if (bytes.size() >= 4) std::memcpy(&magic, bytes.data(), 4);
  if (magic == kGgufMagicLe) return imatrix_from_gguf(parse_gguf(bytes, path), path);
  return parse_imatrix_dat(bytes, path);
}

}  // namespace qforge::io
