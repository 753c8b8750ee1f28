// ONNX export: graph, checker, shape inference, crash-safe write.
#include "framework/onnx/export.h"

#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>

#include <filesystem>
#include <fstream>

#include "framework/core/error.h"
#include "framework/format/atomic_file.h"
#include "framework/onnx/graph.h"

namespace qforge::onnx_export {

bool available() { return true; }
void require_available() {}

namespace {

std::string type_name(const torch::nn::Module& model) {
  const std::string n = model.name();
  return n.empty() ? std::string("an unnamed module") : n;
}

}  // namespace

void check_exportable(const torch::nn::Module& model) {
  QF_REQUIRE(model_type(model), "onnx export: no ONNX graph for model type ", type_name(model),
             "; the exporter writes the forward of ", exportable_models());
  // Every layer without a QDQ form at once, so one edit of the recipe's rules fixes them all.
  std::string problems;
  int n = 0;
  for (const auto& [name, layer] : quantizable_layers(model)) {
    const std::string problem = qdq_problem(*layer);
    if (problem.empty()) continue;
    ++n;
    problems += detail::str_cat("\n  ", name, " (", layer->layer_type(), "): ", problem);
  }
  QF_REQUIRE(n == 0, "onnx export: ", n, n == 1 ? " layer has" : " layers have", " no QDQ form at opset ", kOpset, ":",
             problems);
  const std::string model_level = model_problems(model);
  QF_REQUIRE(model_level.empty(), "onnx export: the ", model_type(model), " graph cannot be written:", model_level);
}

ExportInfo export_onnx(const torch::nn::Module& model, const std::string& path) {
  check_exportable(model);
  std::map<const QuantizableLayer*, std::string> names;
  for (const auto& [name, layer] : quantizable_layers(model)) names[layer] = name;
  Graph g("qforge");
  LayerWriter w(g, names);
  ModelGraph mg;
  write_model_graph(model, g, w, &mg);
  const int64_t requantized = g.requantize_layer_outputs();
  ExportInfo info;
  info.path = path;
  info.model_type = mg.model_type;
  info.opset = kOpset;
  info.inputs = mg.inputs;
  info.outputs = mg.outputs;
  info.nodes = g.nodes();
  info.quantize_linear = g.count("QuantizeLinear");
  info.dequantize_linear = g.count("DequantizeLinear");
  info.initializer_bytes = g.initializer_bytes();
  info.layers = w.forms();
  info.requantized_outputs = requantized;
  // protobuf refuses messages of 2 GiB and more; ONNX's external-data files are not written.
  QF_REQUIRE(info.initializer_bytes < (int64_t{2} << 30) - (int64_t{64} << 20), "onnx export: ", info.initializer_bytes,
             " bytes of initializers exceed protobuf's 2 GiB message limit (external data is not written)");
  onnx::ModelProto proto = g.finish();

  // The consumers' own checks, before anything is written: the checker (full) and strict shape
  // inference on a copy, so an exporter bug is an error here and not a file that fails to load.
  try {
    onnx::checker::check_model(proto);
    onnx::ModelProto inferred = proto;
    onnx::ShapeInferenceOptions opts;
    opts.check_type = true;
    opts.error_mode = 1;
    opts.enable_data_propagation = true;
    onnx::shape_inference::InferShapes(inferred, onnx::OpSchemaRegistry::Instance(), opts);
  } catch (const std::exception& e) {
    throw Error(detail::str_cat("onnx export: the ", info.model_type, " graph fails ONNX's checks (a qforge bug): ", e.what()));
  }

  std::string bytes;
  QF_REQUIRE(proto.SerializeToString(&bytes), "onnx export: protobuf could not serialise the model");
  io::AtomicFile file(path);
  {
    std::ofstream f(file.temp_path(), std::ios::binary | std::ios::trunc);
    QF_REQUIRE(f, "onnx export: cannot write ", path, " (", file.temp_path(), ")");
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    QF_REQUIRE(f, "onnx export: writing ", path, " failed (disk full?)");
  }
  file.commit();
  info.file_bytes = static_cast<int64_t>(bytes.size());
  return info;
}

}  // namespace qforge::onnx_export
