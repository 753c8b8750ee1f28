// safetensors reader/writer (see safetensors.h for the layout).
#include "framework/format/safetensors.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "framework/core/error.h"
#include "framework/format/atomic_file.h"
#include "framework/format/input_file.h"

namespace qforge::io {
namespace {

// The reference implementation refuses headers above 100 MB; so do we (a foreign file's first
// 8 bytes read as a length are usually huge).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr size_t kLengthBytes = 8;
constexpr size_t kHeaderAlign = 8;

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  int64_t bytes;
};
constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble, 8}, {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2},  {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},   {"I32", at::kInt, 4},   {"I16", at::kShort, 2}, {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},    {"BOOL", at::kBool, 1},
};

const DtypeInfo* dtype_by_name(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

const DtypeInfo& dtype_by_type(at::ScalarType t, const std::string& key) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d;
  throw Error(detail::str_cat("safetensors: tensor '", key, "' has dtype ", c10::toString(t),
                              ", which safetensors cannot store"));
}

bool host_is_little_endian() {
  const uint16_t probe = 1;
  uint8_t first;
  std::memcpy(&first, &probe, 1);
  return first == 1;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// One tensor entry of the header, checked against the data section before anything is allocated.
struct Span {
  uint64_t begin, end;
  std::string key;
  std::vector<int64_t> shape;
  at::ScalarType type;
};

// The header's JSON object, after the length field is checked against the file.
nlohmann::json parse_header(const std::vector<uint8_t>& bytes, const std::string& where, uint64_t& header_len) {
  QF_REQUIRE(bytes.size() >= kLengthBytes, where, " is truncated: ", bytes.size(),
             " bytes, fewer than the 8-byte header length");
  header_len = 0;
  for (size_t i = 0; i < kLengthBytes; ++i) header_len |= uint64_t{bytes[i]} << (8 * i);
  QF_REQUIRE(header_len <= kMaxHeaderBytes, where, " declares a ", header_len,
             "-byte header (limit 100 MB): not a safetensors file");
  QF_REQUIRE(header_len <= bytes.size() - kLengthBytes, where, " is truncated or not a safetensors file: the header declares ", header_len,
             " bytes but only ", bytes.size() - kLengthBytes, " follow the length field");
  QF_REQUIRE(header_len >= 2 && bytes[kLengthBytes] == '{', where,
             " does not start with a JSON object header: not a safetensors file");

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + kLengthBytes, bytes.begin() + kLengthBytes + header_len);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + " has a header that is not valid JSON: " + e.what());
  }
  QF_REQUIRE(header.is_object(), where, " header is not a JSON object");
  return header;
}

void read_metadata(const nlohmann::json& entry, const std::string& where, std::map<std::string, std::string>& metadata) {
  QF_REQUIRE(entry.is_object(), where, ": __metadata__ must be an object of strings");
  for (const auto& [mk, mv] : entry.items()) {
    QF_REQUIRE(mv.is_string(), where, ": __metadata__ value '", mk, "' is not a string");
    metadata[mk] = mv.get<std::string>();
  }
}

// A shape of non-negative dimensions whose element count stays far below 2^64 bytes.
std::vector<int64_t> parse_shape(const nlohmann::json& dims, const std::string& t, uint64_t& numel) {
  std::vector<int64_t> shape;
  numel = 1;
  for (const auto& d : dims) {
    QF_REQUIRE(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), t,
               " has a bad dimension ", d.dump());
    const uint64_t v = d.get<uint64_t>();
    QF_REQUIRE(v < (uint64_t{1} << 40) && (v == 0 || numel <= (uint64_t{1} << 40) / v), t,
               " has an implausibly large shape");
    shape.push_back(static_cast<int64_t>(v));
    numel *= v;
  }
  return shape;
}

Span parse_entry(const std::string& key, const nlohmann::json& entry, const std::string& where, uint64_t data_len) {
  const std::string t = where + ": tensor '" + key + "'";
  QF_REQUIRE(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                 entry.contains("data_offsets"),
             t, " needs dtype, shape and data_offsets");
  QF_REQUIRE(entry["dtype"].is_string(), t, " has a non-string dtype");
  const std::string dname = entry["dtype"].get<std::string>();
  const DtypeInfo* dt = dtype_by_name(dname);
  QF_REQUIRE(dt, t, " has unsupported dtype '", dname, "' (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
  QF_REQUIRE(entry["shape"].is_array(), t, " has a non-array shape");
  uint64_t numel = 1;
  std::vector<int64_t> shape = parse_shape(entry["shape"], t, numel);
  const auto& offs = entry["data_offsets"];
  QF_REQUIRE(offs.is_array() && offs.size() == 2 && offs[0].is_number_unsigned() && offs[1].is_number_unsigned(),
             t, " data_offsets must be two non-negative integers");
  const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
  QF_REQUIRE(begin <= end, t, " has data_offsets [", begin, ", ", end, "] with begin > end");
  QF_REQUIRE(end <= data_len, t, " ends at byte ", end, " but the data section holds ", data_len,
             " bytes (file truncated?)");
  const uint64_t expect = numel * static_cast<uint64_t>(dt->bytes);
  QF_REQUIRE(end - begin == expect, t, " spans ", end - begin, " bytes; dtype ", dname, " and shape ",
             shape_str(shape), " need ", expect);
  return {begin, end, key, std::move(shape), dt->type};
}

// Tensors must tile the data section exactly: no overlaps, no gaps, nothing left over.
void check_tiling(std::vector<Span>& spans, const std::string& where, uint64_t data_len) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  for (const auto& s : spans) {
    QF_REQUIRE(s.begin >= pos, where, ": tensor '", s.key, "' [", s.begin, ", ", s.end,
               ") overlaps the previous tensor (which ends at ", pos, ")");
    QF_REQUIRE(s.begin == pos, where, ": gap of ", s.begin - pos, " bytes before tensor '", s.key, "'");
    pos = s.end;
  }
  QF_REQUIRE(pos == data_len, where, ": ", data_len - pos, " trailing bytes after the last tensor");
}

}  // namespace

SafetensorsFile parse_safetensors(const std::vector<uint8_t>& bytes, const std::string& source,
                                  const SafetensorsReadOptions& options) {
  QF_CHECK(host_is_little_endian(), "safetensors: big-endian hosts are not supported");
  const std::string where = "safetensors: " + source;
  uint64_t header_len = 0;
  const nlohmann::json header = parse_header(bytes, where, header_len);
  const uint8_t* data = bytes.data() + kLengthBytes + header_len;
  const uint64_t data_len = bytes.size() - kLengthBytes - header_len;

  SafetensorsFile out;
  // Every entry is checked, and the entries must tile the data section, before anything is
  // allocated: overlapping entries could otherwise declare many times the file's size.
  std::vector<Span> spans;
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") {
      read_metadata(entry, where, out.metadata);
      continue;
    }
    spans.push_back(parse_entry(key, entry, where, data_len));
  }
  check_tiling(spans, where, data_len);
  for (const Span& s : spans) {
    at::Tensor x = at::empty(s.shape, at::TensorOptions().dtype(s.type));
    if (s.end > s.begin) std::memcpy(x.data_ptr(), data + s.begin, s.end - s.begin);
    if (options.to_float32 && (s.type == at::kHalf || s.type == at::kBFloat16 || s.type == at::kDouble))
      x = x.to(at::kFloat);
    out.tensors.emplace(s.key, std::move(x));
  }
  return out;
}

SafetensorsFile read_safetensors(const std::string& path, const SafetensorsReadOptions& options) {
  return parse_safetensors(read_regular_file(path, "safetensors: file"), path, options);
}

std::vector<uint8_t> serialize_safetensors(const std::map<std::string, at::Tensor>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  QF_CHECK(host_is_little_endian());
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> cpu;
  uint64_t offset = 0;
  for (const auto& [key, t] : tensors) {
    QF_REQUIRE(key != "__metadata__", "safetensors: '__metadata__' is reserved and cannot name a tensor");
    QF_REQUIRE(t.defined(), "safetensors: tensor '", key, "' is undefined");
    const DtypeInfo& dt = dtype_by_type(t.scalar_type(), key);
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const uint64_t nbytes = static_cast<uint64_t>(c.numel()) * static_cast<uint64_t>(dt.bytes);
    header[key] = {{"dtype", dt.name}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    cpu.push_back(std::move(c));
  }
  std::string h = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  while ((kLengthBytes + h.size()) % kHeaderAlign) h.push_back(' ');
  std::vector<uint8_t> out(kLengthBytes + h.size() + offset);
  const uint64_t hl = h.size();
  for (size_t i = 0; i < kLengthBytes; ++i) out[i] = static_cast<uint8_t>(hl >> (8 * i));
  std::memcpy(out.data() + kLengthBytes, h.data(), h.size());
  uint8_t* p = out.data() + kLengthBytes + h.size();
  for (const auto& c : cpu) {
    const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
    if (n) std::memcpy(p, c.data_ptr(), n);
    p += n;
  }
  return out;
}

void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::vector<uint8_t> bytes = serialize_safetensors(tensors, metadata);
  AtomicFile out(path);
  {
    std::FILE* f = std::fopen(out.temp_path().c_str(), "wb");
    QF_REQUIRE(f, "safetensors: cannot create '", out.temp_path(), "' for ", path);
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> guard(f, &std::fclose);
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() && std::fflush(f) == 0;
    QF_REQUIRE(ok, "safetensors: writing '", out.temp_path(), "' failed");
  }
  out.commit();
}

}  // namespace qforge::io
