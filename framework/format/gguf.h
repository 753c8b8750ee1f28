// GGUF (version 3): the single-file model format of ggml / llama.cpp, written and read by qforge's
// own code from the specification (ggml docs/gguf.md). Layout, little-endian:
//   "GGUF", uint32 version 3, uint64 tensor count, uint64 metadata count,
//   metadata: {string key, uint32 value type, value} (string = uint64 length + bytes; array =
//             uint32 element type + uint64 count + elements),
//   tensor infos: {string name, uint32 n_dims, uint64 ne[n_dims] (ne[0] = innermost), uint32
//             ggml type, uint64 offset into the data section (a multiple of the alignment)},
//   zero padding to general.alignment (default 32), the data section (each tensor padded likewise).
// The block encodings of the tensor types live in gguf_blocks.h.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace qforge::io {

// gguf_metadata_value_type.
enum class GgufValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6, kBool = 7,
  kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};

// ggml_type values qforge writes and reads (the rest of ggml's table is refused by name).
enum class GgmlType : uint32_t { kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ8_0 = 8, kQ4_K = 12, kQ6_K = 14 };

inline constexpr uint32_t kGgufVersion = 3;
inline constexpr uint64_t kGgufDefaultAlignment = 32;

// One metadata value. Scalars keep their GGUF type; an array holds values of one element type
// (nested arrays allowed, as the specification allows them).
struct GgufValue {
  GgufValueType type = GgufValueType::kUint32;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<GgufValue>> value;
  GgufValueType element_type = GgufValueType::kUint32;  // arrays only

  static GgufValue u8(uint8_t v) { return {GgufValueType::kUint8, uint64_t{v}}; }
  static GgufValue i8(int8_t v) { return {GgufValueType::kInt8, int64_t{v}}; }
  static GgufValue u16(uint16_t v) { return {GgufValueType::kUint16, uint64_t{v}}; }
  static GgufValue i16(int16_t v) { return {GgufValueType::kInt16, int64_t{v}}; }
  static GgufValue u32(uint32_t v) { return {GgufValueType::kUint32, uint64_t{v}}; }
  static GgufValue i32(int32_t v) { return {GgufValueType::kInt32, int64_t{v}}; }
  static GgufValue u64(uint64_t v) { return {GgufValueType::kUint64, v}; }
  static GgufValue i64(int64_t v) { return {GgufValueType::kInt64, v}; }
  static GgufValue f32(float v) { return {GgufValueType::kFloat32, double{v}}; }
  static GgufValue f64(double v) { return {GgufValueType::kFloat64, v}; }
  static GgufValue boolean(bool v) { return {GgufValueType::kBool, v}; }
  static GgufValue str(std::string v) { return {GgufValueType::kString, std::move(v)}; }
  static GgufValue array(GgufValueType element, std::vector<GgufValue> items);

  // Typed reads; throw qforge::Error naming `key` when the value has another type.
  uint64_t as_uint(const std::string& key) const;  // any unsigned integer type
  int64_t as_int(const std::string& key) const;    // any integer type that fits
  double as_float(const std::string& key) const;   // float32 / float64
  const std::string& as_string(const std::string& key) const;
  const std::vector<GgufValue>& as_array(const std::string& key) const;
  bool operator==(const GgufValue& o) const;
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<uint64_t> ne;   // ggml order: ne[0] is the innermost (row) length
  std::vector<uint8_t> data;  // the encoded bytes (gguf_blocks.h), ggml_nbytes(type, ne) of them
};

struct GgufFile {
  std::vector<std::pair<std::string, GgufValue>> metadata;  // in file order, keys unique
  std::vector<GgufTensor> tensors;                          // in file order, names unique
  uint64_t alignment() const;  // general.alignment (uint32) or 32
  const GgufValue* find(const std::string& key) const;
  const GgufValue& at(const std::string& key) const;  // throws naming the key when absent
  const GgufTensor* tensor(const std::string& name) const;
};

// Bytes of a tensor of `type` with shape `ne`; throws when ne[0] is not a multiple of the block.
uint64_t ggml_nbytes(GgmlType type, const std::vector<uint64_t>& ne, const std::string& who);
const char* ggml_type_name(GgmlType type);
// Elements per block of `type` (1 for F32 / F16, 32 for Q8_0 / Q4_0, 256 for Q4_K / Q6_K).
uint64_t ggml_block_elements(GgmlType type);
// The type of a name, any case ("q8_0", "F16"); throws naming the types qforge writes.
GgmlType ggml_type_named(const std::string& name);

// The file's bytes. Throws qforge::Error for duplicate keys or names, a tensor whose data size
// disagrees with its type and shape, or an alignment that is not a positive multiple of 8.
std::vector<uint8_t> serialize_gguf(const GgufFile& file);
// Writes through an AtomicFile: a failed write leaves the previous file at `path` intact.
void write_gguf(const std::string& path, const GgufFile& file);

// Parses a whole file held in memory. Every length, count and offset is checked against the
// bytes there before it is used: a truncated or crafted file gives a qforge::Error naming
// `source` and what is wrong, never a read out of bounds or a huge allocation.
GgufFile parse_gguf(const std::vector<uint8_t>& bytes, const std::string& source);
GgufFile read_gguf(const std::string& path);

}  // namespace qforge::io
