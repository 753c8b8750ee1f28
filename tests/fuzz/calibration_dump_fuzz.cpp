// Fuzzes io::load_calibration_dump on arbitrary HDF5 bytes, then does what qdump and qtrain do with
// a loaded dump: rebuild each observer, compute its qparams, and merge the dump with itself.
// Any input must load or throw; never crash, hang or leak.
// Seeds: tests/fixtures/{calibration,checkpoint}_v1.h5 (tests/fuzz/corpus/calibration_dump).
#include <cstdint>
#include <exception>
#include <memory>

#include "framework/io/calibration_dump.h"
#include "tests/fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qforge;
  static const std::string path = (fuzz::scratch_dir() / "calibration.h5").string();
  fuzz::write_file(path, data, size);
  io::CalibrationDump dump;
  try {
    dump = io::load_calibration_dump(path);
  } catch (const std::exception&) {
    return 0;
  }
  for (const auto& [module, points] : dump) {
    for (const auto& [point, entry] : points) {
      try {
        const std::unique_ptr<Observer> observer = entry.make_observer();
        (void)observer->qparams(entry.spec);
      } catch (const std::exception&) {
      }
    }
  }
  try {
    (void)io::merge_calibration_dumps({dump, dump});
  } catch (const std::exception&) {
  }
  return 0;
}
