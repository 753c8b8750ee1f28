// Building an ONNX graph of a frozen qforge model (internal to framework/onnx): a thin layer over
// libonnx's protobuf classes (values are names, initializers come from LibTorch tensors) and the
// QDQ form of each qforge layer. docs/onnx.md has the formulas.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "framework/nn/conv.h"
#include "framework/nn/embedding.h"
#include "framework/nn/layer_norm.h"
#include "framework/nn/linear.h"
#include "framework/nn/matmul.h"
#include "framework/onnx/export.h"

namespace qforge::onnx_export {

// The opset written: the newest this build's libonnx (1.12) knows; LayerNormalization needs 17.
constexpr int64_t kOpset = 17;

using AttrValue = std::variant<int64_t, float, std::vector<int64_t>, std::string, at::Tensor>;
using Attrs = std::vector<std::pair<std::string, AttrValue>>;

class Graph {
 public:
  explicit Graph(const std::string& name);

  // A graph input of element type `elem` (onnx::TensorProto::FLOAT, INT64, ...); a dim is a
  // fixed size or a symbolic name ("batch", "sequence").
  using Dim = std::variant<int64_t, std::string>;
  std::string input(const std::string& name, int32_t elem, const std::vector<Dim>& dims);
  void output(const std::string& value, int32_t elem, const std::vector<Dim>& dims);
  // An initializer holding `t` (float32, int8, uint8, int32 or int64) under a unique name.
  std::string initializer(const std::string& name, const at::Tensor& t);
  std::string scalar_f32(float v);
  std::string ints(const std::vector<int64_t>& v);
  // One node; returns its first output (named `<hint>` made unique).
  std::string node(const std::string& op, const std::vector<std::string>& inputs, const std::string& hint,
                   const Attrs& attrs = {});
  std::vector<std::string> node_n(const std::string& op, const std::vector<std::string>& inputs, const std::string& hint,
                                  int outputs, const Attrs& attrs = {});

  // Gives each Conv / Linear output whose only path to a static per-tensor activation
  // QuantizeLinear runs through ops that commute with that rounding (Relu, MaxPool, Flatten,
  // Reshape, Transpose, Identity, the grid's float Clip) a copy of that QuantizeLinear ->
  // DequantizeLinear right after the layer: the values reaching the QuantizeLinear are the same
  // codes (docs/onnx.md, "ONNX Runtime"), and ONNX Runtime sees DQ -> Conv / Gemm -> Q, the
  // pattern it fuses into QLinearConv / QGemm. Returns how many were added.
  int64_t requantize_layer_outputs();

  int64_t nodes() const { return graph_->node_size(); }
  int64_t count(const std::string& op) const;
  int64_t initializer_bytes() const { return init_bytes_; }
  // Moves the graph into a model with the opset import and producer set.
  onnx::ModelProto finish();

 private:
  std::string unique(const std::string& hint);
  onnx::ModelProto model_;
  onnx::GraphProto* graph_;
  std::map<std::string, int> used_;
  std::map<std::string, std::string> constants_;  // dedup of small constants by content
  int64_t init_bytes_ = 0;
};

// The QDQ form of the qforge layers, one function per layer type, recording how each was written.
class LayerWriter {
 public:
  // names: module path of each qforge layer of the model (quantizable_layers()).
  LayerWriter(Graph& g, std::map<const QuantizableLayer*, std::string> names) : g_(g), names_(std::move(names)) {}

  std::string linear(const nn::LinearImpl& l, const std::string& x);
  std::string conv2d(const nn::Conv2dImpl& l, const std::string& x);
  std::string embedding(const nn::EmbeddingImpl& l, const std::string& ids);
  // The embedding table as a float value [V, D] (dequantized once when frozen; reused).
  std::string embedding_table(const nn::EmbeddingImpl& l);
  std::string layer_norm(const nn::LayerNormImpl& l, const std::string& x);
  // a [..., M, K] x b [..., K, N], both of rank `rank` (the second operand's dynamic per-token
  // scales are per column: it is transposed around its QDQ).
  std::string matmul(const nn::MatMulImpl& l, const std::string& a, const std::string& b, int64_t rank);
  // The activation of BERT / GPT-2 configs ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu").
  std::string activation(const std::string& act, const std::string& x);

  const std::vector<LayerForm>& forms() const { return forms_; }

 private:
  // Quantize-dequantize of an activation as the layer's quantizer does it (static per tensor or
  // per channel, dynamic per token); returns x unchanged when the quantizer is absent or off.
  std::string activation_qdq(const Quantizer& q, const std::string& x, const std::string& who, std::string* form);
  // Its static per-channel form (per-head attention operands): per-axis QDQ on qp.spec.axis.
  std::string activation_qdq_per_channel(const QParams& qp, const std::string& x, const std::string& who,
                                         std::string* form);
  // The layer's bias: int32 codes at scale s_x * s_w (DequantizeLinear, zero point 0) when the
  // input has a static per-tensor int8 grid and the weight int8 codes (the form ONNX Runtime's
  // QLinearConv / QGemm fusions take), else the float bias. axis: the weight scale's axis.
  std::string bias(const QuantizableLayer& l, const at::Tensor& b, const std::string& base, std::string* form);
  // The layer's weight as a float value: DequantizeLinear of the frozen codes, or the float
  // weight. transpose: codes stored transposed ([K, N] for MatMul), the axis moved with them.
  std::string weight(const QuantizableLayer& l, const at::Tensor& float_weight, bool transpose, std::string* form);
  void check_usable(const QuantizableLayer& l) const;
  std::string name(const QuantizableLayer& l) const;

  Graph& g_;
  std::vector<LayerForm> forms_;
  std::map<const QuantizableLayer*, std::string> names_;
  std::map<const QuantizableLayer*, std::string> tables_;
};

// Why `l`, as quantized, has no QDQ form at the opset written ("" when it has one).
std::string qdq_problem(const QuantizableLayer& l);

// The graph of each model qforge ships (framework/onnx/models.cpp); nullptr-free dispatch in export.cpp.
struct ModelGraph {
  std::string model_type;
  std::vector<std::string> inputs, outputs;
};
bool write_model_graph(const torch::nn::Module& model, Graph& g, LayerWriter& w, ModelGraph* out);
// Model-level reasons the graph cannot be written ("" when none), one "\n  ..." line each.
std::string model_problems(const torch::nn::Module& model);
// The type name write_model_graph writes `model` as, or nullptr when it has no graph.
const char* model_type(const torch::nn::Module& model);
// The model types write_model_graph knows, for error messages.
const char* exportable_models();

}  // namespace qforge::onnx_export
