// Fuzzes data::read_idx_u8 (the Fashion-MNIST reader) on arbitrary bytes. zlib reads gzip
// members and, transparently, plain bytes, so both layers are reached. Any input must read or
// throw; never crash, hang or leak. Seeds: tiny gzip and plain IDX files (tests/fuzz/corpus/idx).
#include <cstdint>
#include <exception>

#include "framework/data/fashion_mnist.h"
#include "tests/fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qforge;
  static const std::string path = (fuzz::scratch_dir() / "images-idx3-ubyte.gz").string();
  fuzz::write_file(path, data, size);
  try {
    (void)data::read_idx_u8(path);
  } catch (const std::exception&) {
  }
  return 0;
}
