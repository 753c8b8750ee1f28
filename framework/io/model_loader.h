// The model-file loader of load_model (model_io.h): plans every change with every check, then
// applies them, so a failed load leaves the model as it was. The plan walks the file and the model
// (model_load.cpp); the frozen weights and quantizer states it restores come from model_load_state.cpp.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "framework/io/checkpoint.h"
#include "framework/io/model_file.h"
#include "framework/io/model_io.h"
#include "framework/nn/rpq.h"

namespace qforge::io::model_load {

using model_file::LayerMeta;
using model_file::ModelMeta;
using model_file::PointMeta;

struct Staged {
  at::Tensor target;
  at::Tensor value;
};

struct PointPlan {
  std::string point;
  QuantizerImpl::Role role = QuantizerImpl::Role::kWeight;
  QuantizerConfig config;
  QParams qparams;  // static qparams to set (calibrated activations)
  bool init_lsq = false;
  std::vector<int64_t> init_shape;  // input shape for the LSQ initialisation pass
  std::map<std::string, at::Tensor> values;  // tensor name inside the quantizer -> value
};

struct LayerPlan {
  std::string path;
  QuantizableLayer* layer = nullptr;
  const LayerMeta* meta = nullptr;
  bool attach = false;
  bool freeze = false;
  QuantizedTensor frozen;
  std::vector<PointPlan> points;
};

class Loader {
 public:
  Loader(torch::nn::Module& model, const std::string& path, const LoadModelOptions& o);
  LoadReport run();

 private:
  std::string file() const { return reader_.path(); }
  std::string where(Section s, const std::string& key) const;
  std::string layer_where(const std::string& path) const;
  bool selected(const std::string& key) const;
  // Whether the layer at `path` is in the load: every layer without a prefix, else those under it.
  bool layer_selected(const std::string& path) const;

  // ---- plan: the file walk (model_load.cpp) ----
  // True when the file has `key`; otherwise throws (strict) or records it as missing.
  bool require(Section s, const std::string& key);
  // A float entry read and checked against `target` (shape; dtype: floats convert).
  at::Tensor read_like(Section s, const std::string& key, const at::Tensor& target, bool dequant);
  void stage_plain(Section s, const std::string& key, const at::Tensor& target);
  void plan();
  void plan_unused_entries();
  void plan_rpq();
  void plan_kv_cache();
  void plan_frozen_rpq(const std::string& path, nn::RPQLayer& layer);
  void plan_optional_buffers(const std::string& path, QuantizableLayer& layer);
  void plan_layer(const std::string& path, QuantizableLayer& layer);
  void plan_dequantized_layer(const std::string& path, QuantizableLayer& layer, const LayerMeta* m,
                              bool saved_quantized);
  void plan_float_layer(const std::string& path, QuantizableLayer& layer);
  void plan_quantized_layer(const std::string& path, QuantizableLayer& layer, const LayerMeta& m);
  std::vector<int64_t> stage_layer_tensors(LayerPlan& lp);

  // ---- plan: frozen weights and quantizer states (model_load_state.cpp) ----
  void consume_quantizer_entries(const std::string& path);
  QuantizedTensor build_frozen(const std::string& path, const LayerMeta& m, const at::Tensor& target);
  // Scratch quantizer of the saved point with the file's tensors: the expected names, shapes and
  // dtypes, and (for dequantize) the fake-quant it computes.
  Quantizer build_point(const std::string& path, const std::string& point, const PointMeta& pm,
                        ActivationMode mode, const std::vector<int64_t>& weight_shape, PointPlan& plan,
                        const Quantizer& existing);
  Quantizer scratch_quantizer(const std::string& path, const std::string& point, const PointMeta& pm,
                              ActivationMode mode);
  void restore_fixed_grid(const std::string& qprefix, const PointMeta& pm, ActivationMode mode,
                          const std::vector<int64_t>& weight_shape, PointPlan& plan, Quantizer& q);
  void restore_codebook(const std::string& qprefix, const PointMeta& pm, const std::vector<int64_t>& weight_shape,
                        PointPlan& plan, Quantizer& q);
  void init_scratch_lsq(const std::string& path, const PointMeta& pm, const std::vector<int64_t>& weight_shape,
                        PointPlan& plan, Quantizer& q);
  std::set<std::string> read_point_tensors(const std::string& qprefix, const PointMeta& pm,
                                           const torch::nn::Module& ref, bool keep_existing, PointPlan& plan);
  void check_existing_state(const std::string& qprefix, const Quantizer& existing, const std::set<std::string>& names);

  // ---- optimizer ----
  struct OptStaged {
    at::Tensor param;
    std::map<std::string, at::Tensor> values;
  };
  void plan_optimizer();
  void apply_optimizer();

  // ---- mutation: everything above passed ----
  void apply();
  std::vector<std::pair<KvCacheModel*, KvCacheScheme>> kv_cache_;  // the file's cache schemes, checked
  void apply_points(LayerPlan& lp);

  torch::nn::Module& model_;
  CheckpointReader reader_;
  LoadModelOptions opts_;
  ModelMeta meta_;
  std::set<std::pair<Section, std::string>> consumed_;
  std::vector<Staged> staged_;
  struct Created {
    QuantizableLayer* layer;
    std::string name;
    at::Tensor value;
  };
  std::vector<Created> created_;
  std::vector<LayerPlan> plans_;
  std::vector<std::pair<std::string, nn::RPQLayer*>> rpq_freeze_;  // saved frozen: frozen after the load
  std::vector<std::pair<size_t, double>> lrs_;
  std::vector<OptStaged> opt_staged_;
  LoadReport report_;
};

// The layer's own tensors (weight, bias, ...), not its quantizers'.
std::vector<std::pair<std::string, at::Tensor>> own_tensors(const torch::nn::Module& m, bool buffers);

}  // namespace qforge::io::model_load
