// onnx_fixture_tool DIR: writes, for each fixture model (tests/onnx/onnx_fixtures.h), DIR/NAME.onnx,
// its inputs and qforge's frozen output as raw little-endian files, and DIR/manifest.json listing
// them, for the consumers in onnx_consumers_test.sh (python3-onnx, ONNX Runtime).
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "framework/onnx/export.h"
#include "tests/onnx/onnx_fixtures.h"

namespace fs = std::filesystem;

namespace {

nlohmann::json write_tensor(const fs::path& dir, const std::string& file, const std::string& name, const at::Tensor& t_in) {
  const at::Tensor t = t_in.contiguous();
  std::ofstream f(dir / file, std::ios::binary);
  f.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * t.element_size()));
  if (!f) throw std::runtime_error("cannot write " + (dir / file).string());
  return {{"name", name}, {"file", file}, {"shape", t.sizes().vec()},
          {"type", t.scalar_type() == at::kLong ? "int64" : "float32"}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: onnx_fixture_tool DIR\n");
    return 2;
  }
  try {
    const fs::path dir = argv[1];
    fs::create_directories(dir);
    at::manual_seed(0);
    nlohmann::json manifest = {{"models", nlohmann::json::array()}};
    for (auto& f : qforge::onnx_testing::all_fixtures()) {
      const qforge::onnx_export::ExportInfo info = qforge::onnx_export::export_onnx(*f.model, (dir / (f.name + ".onnx")).string());
      nlohmann::json inputs = nlohmann::json::array();
      for (const auto& in : f.inputs) inputs.push_back(write_tensor(dir, f.name + "." + in.name + ".bin", in.name, in.value));
      const at::Tensor y = f.forward(f.inputs);
      const double frozen_vs_fake_quant =
          f.fake_quant_output.defined() ? (y - f.fake_quant_output).abs().max().item<double>() : 0.0;
      // How activations are quantized (check_ort_fusion.py asserts fusion for static ones only).
      std::string activations = "none";
      for (const auto& l : info.layers) {
        if (l.form.find("QDQ dynamic per-token") != std::string::npos) activations = "dynamic_per_token";
        else if (l.form.find("QDQ static") != std::string::npos && activations == "none") activations = "static";
      }
      manifest["models"].push_back({{"name", f.name}, {"file", f.name + ".onnx"}, {"inputs", inputs}, {"activations", activations},
                                    {"expected", write_tensor(dir, f.name + ".expected.bin", info.outputs.at(0), y)},
                                    {"frozen_vs_fake_quant", frozen_vs_fake_quant},
                                    {"quantize_linear", info.quantize_linear}, {"dequantize_linear", info.dequantize_linear}});
      std::printf("%-5s %s: %lld nodes, %lld QuantizeLinear, %lld DequantizeLinear, %lld bytes\n", f.name.c_str(),
                  info.model_type.c_str(), static_cast<long long>(info.nodes), static_cast<long long>(info.quantize_linear),
                  static_cast<long long>(info.dequantize_linear), static_cast<long long>(info.file_bytes));
    }
    std::ofstream(dir / "manifest.json") << manifest.dump(2) << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "onnx_fixture_tool: %s\n", e.what());
    return 1;
  }
  return 0;
}
