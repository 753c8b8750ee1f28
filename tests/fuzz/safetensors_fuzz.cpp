// Fuzzes io::parse_safetensors (the reader behind read_safetensors) on arbitrary bytes, with and
// without the float32 conversion. Any input must parse or throw; never crash, hang or leak.
// Seeds: tests/fuzz/corpus/safetensors, written by tests/fuzz/make_seeds.py in the layout
// serialize_safetensors writes.
#include <cstdint>
#include <exception>
#include <vector>

#include "framework/format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qforge;
  const std::vector<uint8_t> bytes(data, data + size);
  for (const bool to_float32 : {true, false}) {
    try {
      io::SafetensorsReadOptions options;
      options.to_float32 = to_float32;
      (void)io::parse_safetensors(bytes, "fuzz input", options);
    } catch (const std::exception&) {
    }
  }
  return 0;
}
