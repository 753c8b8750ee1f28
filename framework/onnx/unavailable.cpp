// ONNX export in a build without libonnx: every entry point says which packages are missing.
#include "framework/core/error.h"
#include "framework/onnx/export.h"

namespace qforge::onnx_export {

namespace {

[[noreturn]] void missing() {
  throw Error(
      "onnx export: this qforge was built without libonnx; install Debian's libonnx-dev and libprotobuf-dev "
      "(./scripts/setup does) and reconfigure the build");
}

}  // namespace

bool available() { return false; }
void require_available() { missing(); }
void check_exportable(const torch::nn::Module&) { missing(); }
ExportInfo export_onnx(const torch::nn::Module&, const std::string&) { missing(); }

}  // namespace qforge::onnx_export
