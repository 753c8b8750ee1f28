// ONNX export of a frozen qforge model: QuantizeLinear / DequantizeLinear pairs around the float
// ops, opset 17, written with libonnx's protobuf classes and checked with its checker and shape
// inference before the file replaces anything (docs/onnx.md).
//
//   qforge::onnx_export::export_onnx(model, "model.onnx");
//
// The graph is the model's forward written out op by op, so the models qforge ships are
// exportable (SmallCnn, Mlp, BertForSequenceClassification, Gpt2LMHeadModel); anything else is a
// clear error naming its type. Layers with no QDQ form at opset 17 (4-bit and 2-bit codes,
// per-group scales, fp8) are errors naming the layer.
#pragma once

#include <torch/nn/module.h>

#include <string>
#include <vector>

namespace qforge::onnx_export {

// How one layer was written.
struct LayerForm {
  std::string name;  // module path
  std::string type;  // qforge layer type
  std::string form;  // e.g. "DequantizeLinear int8 per_channel(axis=1) weight; QDQ static int8 per_tensor input"
};

struct ExportInfo {
  std::string path;
  std::string model_type;
  int64_t opset = 0;
  std::vector<std::string> inputs, outputs;
  int64_t nodes = 0;
  int64_t quantize_linear = 0, dequantize_linear = 0;
  // Layer outputs given their consumer's QuantizeLinear -> DequantizeLinear (Graph::requantize_layer_outputs).
  int64_t requantized_outputs = 0;
  int64_t initializer_bytes = 0;
  int64_t file_bytes = 0;
  std::vector<LayerForm> layers;
};

// True when this build has libonnx (Debian's libonnx-dev and libprotobuf-dev at configure time).
bool available();
// Throws qforge::Error naming the missing packages unless available().
void require_available();

// Throws qforge::Error, before anything is computed, when `model` cannot be exported as it is
// quantized (its type has no graph, or a layer's scheme has no QDQ form). Works on a model that
// is quantized but not frozen yet, so a recipe fails at its start, not after training.
void check_exportable(const torch::nn::Module& model);

// Writes `model` (frozen, or float) to `path` through a crash-safe replacement. The model must be
// in eval mode semantics (dropout is not written). Throws qforge::Error naming the layer or path.
ExportInfo export_onnx(const torch::nn::Module& model, const std::string& path);

}  // namespace qforge::onnx_export
