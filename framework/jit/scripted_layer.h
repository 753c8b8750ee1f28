// ScriptedLayer: the TorchScript custom class torch.classes.qforge.Layer. A rewritten TorchScript
// graph calls qforge::linear / linear_left / conv1d / conv2d / embedding / matmul (registered with LibTorch's
// operator registry) with one of these; it holds a qforge layer (framework/nn) whose quantizers,
// fake-quant, freeze and integer kernels run the call. Pickled into a saved TorchScript file as the layer's
// model checkpoint (framework/io), so the file runs wherever libqforge is loaded.
#pragma once

#include <torch/custom_class.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "framework/nn/quantizable.h"

namespace qforge::jit {

// Persisted in saved TorchScript files: never renumber.
// kMatMul: a product of two activations (attention's q @ k^T and att @ v), a qforge::nn::MatMul
// with a quantizer on each operand and no weight.
enum class LayerKind : uint8_t { kLinear = 0, kConv1d = 1, kConv2d = 2, kEmbedding = 3, kMatMul = 4 };
const char* to_string(LayerKind k);  // "Linear", "Conv1d", "Conv2d", "Embedding", "MatMul"

// The options of the torch.nn layer a graph call stands for (convolutions: per spatial dimension).
// Format of the pickled layer state (LayerSpec::to_ints' first value); newer formats are refused.
// Format 2 adds weight_transposed (one value after the options); format 3 adds the kind MatMul
// (written only for MatMul layers, so files without them stay readable by format-2 readers).
inline constexpr int64_t kLayerStateVersion = 3;
// Largest in/out features or channels, kernel size and weight element count a pickled layer may declare.
inline constexpr int64_t kMaxLayerWidth = int64_t{1} << 24;
inline constexpr int64_t kMaxLayerKernel = int64_t{1} << 12;
inline constexpr int64_t kMaxLayerWeight = int64_t{1} << 31;

struct LayerSpec {
  LayerKind kind = LayerKind::kLinear;
  // in_features / out_features, in_channels / out_channels, or num_embeddings / embedding_dim
  // (MatMul: both 0, it has no weight)
  int64_t in = 0, out = 0;
  std::vector<int64_t> kernel, stride, padding, dilation;
  int64_t groups = 1;
  bool bias = false;
  int64_t padding_idx = -1;  // Embedding: the row whose gradient stays zero (-1: none)
  // Linear: the module's attribute holds the weight as [in, out] (x @ W, GPT-2's Conv1D); the layer
  // holds its transpose, a view of the same storage.
  bool weight_transposed = false;

  // Flat form for the pickled state, kLayerStateVersion first, and back: from_ints throws
  // qforge::Error on a malformed list, a newer format, or options no torch.nn layer accepts.
  std::vector<int64_t> to_ints() const;
  static LayerSpec from_ints(const std::vector<int64_t>& v);
  // Shape of the torch.nn layer's weight: [out, in], [out, in / groups, kernel...] or [in, out]
  // (Embedding: one row per index); empty for a MatMul.
  std::vector<int64_t> weight_shape() const;
};

// Where the layer's float tensors live in the TorchScript module: the module path owning them and
// the attribute names ("weight"; bias empty when the call has none). A MatMul has neither: owner is
// the module whose forward makes the product, weight and bias are empty.
struct TensorHome {
  std::string owner;
  std::string weight;
  std::string bias;
};

class ScriptedLayer : public torch::CustomClassHolder {
 public:
  // A float qforge layer of `spec` at module path `path` whose weight and bias are `weight` and
  // `bias` themselves (the same tensors, so training the TorchScript module's parameters trains
  // it); undefined `weight`: the layer's own freshly initialised ones.
  ScriptedLayer(std::string path, const LayerSpec& spec, TensorHome home, const at::Tensor& weight,
                const at::Tensor& bias);

  // The qforge layer's forward: float, fake-quant, calibrating or frozen, as its state says.
  at::Tensor forward(const at::Tensor& x);
  // A MatMul's forward on its two operands (throws for other kinds).
  at::Tensor forward(const at::Tensor& a, const at::Tensor& b);

  const std::string& path() const { return path_; }
  const LayerSpec& spec() const { return spec_; }
  const TensorHome& home() const { return home_; }
  // The qforge layer (a qforge::nn::LinearImpl / Conv1dImpl / Conv2dImpl / EmbeddingImpl / MatMulImpl).
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  QuantizableLayer& layer() const { return *layer_; }
  // The layer's float weight and bias tensors (undefined once freeze() released them).
  at::Tensor weight() const;
  at::Tensor bias() const;
  // The weight and bias as the layer computes with them: float, fake-quantized (through the weight
  // quantizer, whose STE carries gradients), or dequantized from the packed weight once frozen; a
  // Linear's pre_quant_scale multiplies the weight's columns.
  at::Tensor effective_weight();
  at::Tensor effective_bias() const;

  // Pickled state: {path, owner, weight attribute, bias attribute}, the spec, and the bytes of a
  // model checkpoint (io::save_model) of the layer mounted at its path.
  using State = std::tuple<std::vector<std::string>, std::vector<int64_t>, at::Tensor>;
  State state() const;
  static c10::intrusive_ptr<ScriptedLayer> from_state(State state);

 private:
  std::string path_;
  LayerSpec spec_;
  TensorHome home_;
  std::shared_ptr<torch::nn::Module> module_;
  QuantizableLayer* layer_ = nullptr;
  std::function<at::Tensor(const at::Tensor&)> forward_;
};

// The TorchScript type of ScriptedLayer (registers the qforge ops and class on first use).
c10::ClassTypePtr scripted_layer_type();
// The op a kind's calls become: "qforge::linear", "qforge::conv1d", "qforge::conv2d", "qforge::embedding",
// "qforge::matmul".
const char* op_name(LayerKind k);

// `path` itself when no proper prefix of it is in `layers` (qforge layer paths), else the first
// such prefix followed by the rest joined with '_': a qforge layer holds no children, so a tensor or
// product of the module whose layer has the module's path goes beside it ("attn.temperature" ->
// "attn_temperature" when "attn" is a layer).
std::string outside_layers(const std::string& path, const std::set<std::string>& layers);

// The module at dotted `path` in `root` ("" is root), creating empty modules where none is yet;
// throws qforge::Error when the path passes through, or ends at, a qforge layer.
torch::nn::Module& module_at(torch::nn::Module& root, const std::string& path);

// Registers `module` in `root` at the dotted `path`, creating empty parent modules as needed
// ("features.0": a child "features" holding "0"). Throws qforge::Error when the path is taken.
void mount(torch::nn::Module& root, const std::string& path, std::shared_ptr<torch::nn::Module> module);

}  // namespace qforge::jit
