#include "framework/format/gguf.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <set>

#include "framework/core/error.h"
#include "framework/format/atomic_file.h"
#include "framework/format/input_file.h"

namespace qforge::io {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
// Nesting deeper than this is refused so a crafted file cannot exhaust the stack.
constexpr int kMaxArrayDepth = 8;

struct TypeInfo {
  GgmlType type;
  const char* name;
  uint64_t block;  // elements per block
  uint64_t bytes;  // bytes per block
};
// ggml's block sizes: F16 2 bytes; Q8_0 = fp16 scale + 32 int8; Q4_0 = fp16 scale + 16 bytes of nibbles;
// Q4_K = 256 four-bit values, 8 six-bit sub-block scales and mins, fp16 d and dmin; Q6_K = 256
// six-bit values, 16 int8 sub-block scales and an fp16 super-block scale.
constexpr TypeInfo kTypes[] = {
    {GgmlType::kF32, "F32", 1, 4},
    {GgmlType::kF16, "F16", 1, 2},
    {GgmlType::kQ4_0, "Q4_0", 32, 18},
    {GgmlType::kQ8_0, "Q8_0", 32, 34},
    {GgmlType::kQ4_K, "Q4_K", 256, 144},  // block_q4_K: fp16 d, fp16 dmin, scales[12], qs[128]
    {GgmlType::kQ6_K, "Q6_K", 256, 210},  // block_q6_K: ql[128], qh[64], int8 scales[16], fp16 d
};

const TypeInfo* find_type(uint32_t t) {
  for (const TypeInfo& i : kTypes)
    if (static_cast<uint32_t>(i.type) == t) return &i;
  return nullptr;
}

size_t scalar_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16: case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32: case GgufValueType::kInt32: case GgufValueType::kFloat32: return 4;
    case GgufValueType::kUint64: case GgufValueType::kInt64: case GgufValueType::kFloat64: return 8;
    default: return 0;
  }
}

bool is_unsigned(GgufValueType t) {
  return t == GgufValueType::kUint8 || t == GgufValueType::kUint16 || t == GgufValueType::kUint32 ||
         t == GgufValueType::kUint64;
}
bool is_signed(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 || t == GgufValueType::kInt32 ||
         t == GgufValueType::kInt64;
}
bool is_float(GgufValueType t) { return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64; }

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

class Writer {
 public:
  std::vector<uint8_t> out;
  template <typename T>
  void pod(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    out.insert(out.end(), s.begin(), s.end());
  }
  void pad(uint64_t alignment) { out.resize(round_up(out.size(), alignment), 0); }
  void value(const GgufValue& v, const std::string& key);
};

void Writer::value(const GgufValue& v, const std::string& key) {
  switch (v.type) {
    case GgufValueType::kUint8: pod<uint8_t>(static_cast<uint8_t>(v.as_uint(key))); break;
    case GgufValueType::kInt8: pod<int8_t>(static_cast<int8_t>(v.as_int(key))); break;
    case GgufValueType::kUint16: pod<uint16_t>(static_cast<uint16_t>(v.as_uint(key))); break;
    case GgufValueType::kInt16: pod<int16_t>(static_cast<int16_t>(v.as_int(key))); break;
    case GgufValueType::kUint32: pod<uint32_t>(static_cast<uint32_t>(v.as_uint(key))); break;
    case GgufValueType::kInt32: pod<int32_t>(static_cast<int32_t>(v.as_int(key))); break;
    case GgufValueType::kUint64: pod<uint64_t>(v.as_uint(key)); break;
    case GgufValueType::kInt64: pod<int64_t>(v.as_int(key)); break;
    case GgufValueType::kFloat32: pod<float>(static_cast<float>(v.as_float(key))); break;
    case GgufValueType::kFloat64: pod<double>(v.as_float(key)); break;
    case GgufValueType::kBool: pod<uint8_t>(std::get<bool>(v.value) ? 1 : 0); break;
    case GgufValueType::kString: str(v.as_string(key)); break;
    case GgufValueType::kArray: {
      const auto& items = v.as_array(key);
      pod<uint32_t>(static_cast<uint32_t>(v.element_type));
      pod<uint64_t>(items.size());
      for (const GgufValue& item : items) {
        QF_REQUIRE(item.type == v.element_type, "gguf: array '", key, "' mixes element types");
        value(item, key);
      }
      break;
    }
    default: QF_REQUIRE(false, "gguf: metadata '", key, "' has unknown type ", static_cast<uint32_t>(v.type));
  }
}

// Bounds-checked reading of a byte buffer; every failure names the source and the field.
class Reader {
 public:
  Reader(const std::vector<uint8_t>& b, const std::string& source) : b_(b), source_(source) {}
  size_t pos() const { return pos_; }
  void need(uint64_t n, const std::string& what) const {
    QF_REQUIRE(n <= b_.size() - pos_, "gguf: ", source_, " is truncated: ", what, " needs ", n, " bytes at offset ",
               pos_, ", the file has ", b_.size() - pos_, " left");
  }
  template <typename T>
  T pod(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str(const std::string& what) {
    const uint64_t n = pod<uint64_t>(what + " length");
    need(n, what);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  GgufValue value(GgufValueType t, const std::string& key, int depth);
  const std::string& source() const { return source_; }

 private:
  const std::vector<uint8_t>& b_;
  std::string source_;
  size_t pos_ = 0;
};

GgufValue Reader::value(GgufValueType t, const std::string& key, int depth) {
  const std::string what = "metadata '" + key + "'";
  switch (t) {
    case GgufValueType::kUint8: return GgufValue::u8(pod<uint8_t>(what));
    case GgufValueType::kInt8: return GgufValue::i8(pod<int8_t>(what));
    case GgufValueType::kUint16: return GgufValue::u16(pod<uint16_t>(what));
    case GgufValueType::kInt16: return GgufValue::i16(pod<int16_t>(what));
    case GgufValueType::kUint32: return GgufValue::u32(pod<uint32_t>(what));
    case GgufValueType::kInt32: return GgufValue::i32(pod<int32_t>(what));
    case GgufValueType::kUint64: return GgufValue::u64(pod<uint64_t>(what));
    case GgufValueType::kInt64: return GgufValue::i64(pod<int64_t>(what));
    case GgufValueType::kFloat32: return GgufValue::f32(pod<float>(what));
    case GgufValueType::kFloat64: return GgufValue::f64(pod<double>(what));
    case GgufValueType::kBool: {
      const uint8_t v = pod<uint8_t>(what);
      QF_REQUIRE(v <= 1, "gguf: ", source_, ": ", what, " is a bool of value ", int{v}, " (0 or 1 expected)");
      return GgufValue::boolean(v == 1);
    }
    case GgufValueType::kString: return GgufValue::str(str(what));
    case GgufValueType::kArray: {
      QF_REQUIRE(depth < kMaxArrayDepth, "gguf: ", source_, ": ", what, " nests arrays deeper than ", kMaxArrayDepth);
      const auto element = static_cast<GgufValueType>(pod<uint32_t>(what + " element type"));
      const uint64_t n = pod<uint64_t>(what + " element count");
      // Every element takes at least one byte (a string 8): a count past the bytes left is a lie.
      const size_t least = element == GgufValueType::kString || element == GgufValueType::kArray ? 8
                                                                                                  : scalar_bytes(element);
      QF_REQUIRE(least > 0, "gguf: ", source_, ": ", what, " has unknown element type ", static_cast<uint32_t>(element));
      need(n <= UINT64_MAX / least ? n * least : UINT64_MAX, what + " elements");
      std::vector<GgufValue> items;
      items.reserve(n);
      for (uint64_t i = 0; i < n; ++i) items.push_back(value(element, key, depth + 1));
      return GgufValue::array(element, std::move(items));
    }
    default:
      QF_REQUIRE(false, "gguf: ", source_, ": ", what, " has unknown value type ", static_cast<uint32_t>(t));
  }
  return {};
}

// The tensors' byte ranges [offset, offset + size) are disjoint: a sweep in offset order (size 0
// first at one offset), O(n log n) so a header of many tensors cannot stall the check.
void require_disjoint(const std::vector<GgufTensor>& tensors, const std::vector<uint64_t>& offsets,
                      const std::string& source) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::make_pair(offsets[a], tensors[a].data.size()) < std::make_pair(offsets[b], tensors[b].data.size());
  });
  size_t last = order.empty() ? 0 : order[0];  // the tensor reaching furthest so far
  for (size_t k = 1; k < order.size(); ++k) {
    const size_t i = order[k];
    const uint64_t end = offsets[last] + tensors[last].data.size();
    QF_REQUIRE(offsets[i] >= end, "gguf: ", source, ": tensors '", tensors[last].name, "' and '", tensors[i].name,
               "' overlap");
    if (offsets[i] + tensors[i].data.size() >= end) last = i;
  }
}

}  // namespace

GgufValue GgufValue::array(GgufValueType element, std::vector<GgufValue> items) {
  GgufValue v{GgufValueType::kArray, std::move(items)};
  v.element_type = element;
  return v;
}

uint64_t GgufValue::as_uint(const std::string& key) const {
  QF_REQUIRE(is_unsigned(type), "gguf: metadata '", key, "' is not an unsigned integer (type ",
             static_cast<uint32_t>(type), ")");
  return std::get<uint64_t>(value);
}

int64_t GgufValue::as_int(const std::string& key) const {
  if (is_signed(type)) return std::get<int64_t>(value);
  const uint64_t u = as_uint(key);
  QF_REQUIRE(u <= static_cast<uint64_t>(INT64_MAX), "gguf: metadata '", key, "' = ", u, " does not fit int64");
  return static_cast<int64_t>(u);
}

double GgufValue::as_float(const std::string& key) const {
  QF_REQUIRE(is_float(type), "gguf: metadata '", key, "' is not a float (type ", static_cast<uint32_t>(type), ")");
  return std::get<double>(value);
}

const std::string& GgufValue::as_string(const std::string& key) const {
  QF_REQUIRE(type == GgufValueType::kString, "gguf: metadata '", key, "' is not a string");
  return std::get<std::string>(value);
}

const std::vector<GgufValue>& GgufValue::as_array(const std::string& key) const {
  QF_REQUIRE(type == GgufValueType::kArray, "gguf: metadata '", key, "' is not an array");
  return std::get<std::vector<GgufValue>>(value);
}

bool GgufValue::operator==(const GgufValue& o) const {
  return type == o.type && value == o.value && (type != GgufValueType::kArray || element_type == o.element_type);
}

uint64_t GgufFile::alignment() const {
  const GgufValue* a = find("general.alignment");
  return a ? a->as_uint("general.alignment") : kGgufDefaultAlignment;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  for (const auto& [k, v] : metadata)
    if (k == key) return &v;
  return nullptr;
}

const GgufValue& GgufFile::at(const std::string& key) const {
  const GgufValue* v = find(key);
  QF_REQUIRE(v, "gguf: metadata '", key, "' is missing");
  return *v;
}

const GgufTensor* GgufFile::tensor(const std::string& name) const {
  for (const GgufTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const char* ggml_type_name(GgmlType type) {
  const TypeInfo* i = find_type(static_cast<uint32_t>(type));
  return i ? i->name : "unknown";
}

uint64_t ggml_block_elements(GgmlType type) {
  const TypeInfo* i = find_type(static_cast<uint32_t>(type));
  QF_REQUIRE(i, "gguf: ggml type ", static_cast<uint32_t>(type), " is not one qforge reads or writes");
  return i->block;
}

GgmlType ggml_type_named(const std::string& name) {
  std::string upper = name;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const TypeInfo& i : kTypes)
    if (upper == i.name) return i.type;
  QF_REQUIRE(false, "gguf: no ggml type '", name, "' (F32, F16, Q8_0, Q4_0, Q4_K and Q6_K are written)");
  return GgmlType::kF32;
}

uint64_t ggml_nbytes(GgmlType type, const std::vector<uint64_t>& ne, const std::string& who) {
  const TypeInfo* info = find_type(static_cast<uint32_t>(type));
  QF_REQUIRE(info, who, ": ggml type ", static_cast<uint32_t>(type),
             " is not one qforge reads or writes (F32, F16, Q8_0, Q4_0, Q4_K, Q6_K)");
  QF_REQUIRE(!ne.empty(), who, ": a tensor needs at least one dimension");
  QF_REQUIRE(ne[0] % info->block == 0, who, ": ", info->name, " needs rows (ne[0] = ", ne[0], ") in multiples of ",
             info->block);
  uint64_t blocks = ne[0] / info->block;
  for (size_t d = 1; d < ne.size(); ++d) {
    QF_REQUIRE(ne[d] == 0 || blocks <= (UINT64_MAX / info->bytes) / ne[d], who, ": tensor size overflows");
    blocks *= ne[d];
  }
  return blocks * info->bytes;
}

std::vector<uint8_t> serialize_gguf(const GgufFile& file) {
  const uint64_t alignment = file.alignment();
  QF_REQUIRE(alignment > 0 && alignment % 8 == 0, "gguf: general.alignment must be a positive multiple of 8, got ",
             alignment);
  Writer w;
  w.pod<uint32_t>(kGgufMagic);
  w.pod<uint32_t>(kGgufVersion);
  w.pod<uint64_t>(file.tensors.size());
  w.pod<uint64_t>(file.metadata.size());
  std::set<std::string> keys;
  for (const auto& [key, v] : file.metadata) {
    QF_REQUIRE(keys.insert(key).second, "gguf: metadata key '", key, "' appears twice");
    w.str(key);
    w.pod<uint32_t>(static_cast<uint32_t>(v.type));
    w.value(v, key);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const GgufTensor& t : file.tensors) {
    QF_REQUIRE(names.insert(t.name).second, "gguf: tensor '", t.name, "' appears twice");
    const uint64_t n = ggml_nbytes(t.type, t.ne, "gguf: tensor '" + t.name + "'");
    QF_REQUIRE(t.data.size() == n, "gguf: tensor '", t.name, "' holds ", t.data.size(), " bytes, ",
               ggml_type_name(t.type), " of its shape takes ", n);
    w.str(t.name);
    w.pod<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) w.pod<uint64_t>(d);
    w.pod<uint32_t>(static_cast<uint32_t>(t.type));
    w.pod<uint64_t>(offset);
    offset = round_up(offset + n, alignment);
  }
  w.pad(alignment);
  for (const GgufTensor& t : file.tensors) {
    w.out.insert(w.out.end(), t.data.begin(), t.data.end());
    w.pad(alignment);
  }
  return std::move(w.out);
}

void write_gguf(const std::string& path, const GgufFile& file) {
  const std::vector<uint8_t> bytes = serialize_gguf(file);
  write_text_atomically(path, std::string(bytes.begin(), bytes.end()));
}

GgufFile parse_gguf(const std::vector<uint8_t>& bytes, const std::string& source) {
  Reader r(bytes, source);
  QF_REQUIRE(bytes.size() >= 4 && r.pod<uint32_t>("magic") == kGgufMagic, "gguf: ", source,
             " is not a GGUF file (no 'GGUF' magic)");
  const uint32_t version = r.pod<uint32_t>("version");
  QF_REQUIRE(version == kGgufVersion, "gguf: ", source, " is GGUF version ", version, ", qforge reads version 3");
  const uint64_t n_tensors = r.pod<uint64_t>("tensor count");
  const uint64_t n_kv = r.pod<uint64_t>("metadata count");
  // A key takes at least 12 bytes, a tensor info at least 24: counts past the file are refused early.
  r.need(n_kv <= UINT64_MAX / 12 ? n_kv * 12 : UINT64_MAX, "the metadata count " + std::to_string(n_kv));
  r.need(n_tensors <= UINT64_MAX / 24 ? n_tensors * 24 : UINT64_MAX, "the tensor count " + std::to_string(n_tensors));
  GgufFile file;
  std::set<std::string> keys;
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = r.str("metadata key");
    QF_REQUIRE(keys.insert(key).second, "gguf: ", source, ": metadata key '", key, "' appears twice");
    const auto type = static_cast<GgufValueType>(r.pod<uint32_t>("metadata '" + key + "' type"));
    GgufValue v = r.value(type, key, 0);
    file.metadata.emplace_back(std::move(key), std::move(v));
  }
  const uint64_t alignment = file.alignment();
  // A power of two as llama.cpp requires, bounded so the data section's start cannot wrap around.
  QF_REQUIRE(alignment >= 8 && alignment <= (uint64_t{1} << 16) && (alignment & (alignment - 1)) == 0, "gguf: ", source,
             ": general.alignment ", alignment, " is not a power of two from 8 to 65536");
  std::vector<uint64_t> offsets;
  std::set<std::string> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = r.str("tensor name");
    QF_REQUIRE(names.insert(t.name).second, "gguf: ", source, ": tensor '", t.name, "' appears twice");
    const uint32_t n_dims = r.pod<uint32_t>("tensor '" + t.name + "' dimension count");
    QF_REQUIRE(n_dims >= 1 && n_dims <= 4, "gguf: ", source, ": tensor '", t.name, "' has ", n_dims,
               " dimensions (1 to 4 expected)");
    for (uint32_t d = 0; d < n_dims; ++d) t.ne.push_back(r.pod<uint64_t>("tensor '" + t.name + "' shape"));
    t.type = static_cast<GgmlType>(r.pod<uint32_t>("tensor '" + t.name + "' type"));
    offsets.push_back(r.pod<uint64_t>("tensor '" + t.name + "' offset"));
    QF_REQUIRE(offsets.back() % alignment == 0, "gguf: ", source, ": tensor '", t.name, "' offset ", offsets.back(),
               " is not a multiple of the alignment ", alignment);
    file.tensors.push_back(std::move(t));
  }
  const uint64_t data_start = round_up(r.pos(), alignment);
  QF_REQUIRE(data_start <= bytes.size() || file.tensors.empty(), "gguf: ", source,
             " is truncated: the data section starts past the end of the file");
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    GgufTensor& t = file.tensors[i];
    const uint64_t n = ggml_nbytes(t.type, t.ne, "gguf: " + source + ": tensor '" + t.name + "'");
    const uint64_t left = bytes.size() - data_start;
    QF_REQUIRE(offsets[i] <= left && n <= left - offsets[i], "gguf: ", source, " is truncated: tensor '", t.name,
               "' needs bytes [", offsets[i], ", ", offsets[i] + n, ") of a data section of ", left);
    const auto* p = bytes.data() + data_start + offsets[i];
    t.data.assign(p, p + n);
  }
  require_disjoint(file.tensors, offsets, source);
  return file;
}

GgufFile read_gguf(const std::string& path) {
  return parse_gguf(read_regular_file(path, "gguf: file"), path);
}

}  // namespace qforge::io
