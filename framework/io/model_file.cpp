// The model checkpoint's shared internals (model_file.h): keys, the /model group, optimizer
// state naming, and collecting what a model save writes.
#include "framework/io/model_file.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>

#include "framework/core/error.h"
#include "framework/io/format.h"
#include "framework/format/hdf5.h"
#include "framework/io/quantizer_attrs.h"
#include "framework/nn/rpq.h"

namespace qforge::io::model_file {

using detail::str_cat;

// ---------------------------------------------------------------------------------------------
// Keys and layers

std::string join(const std::string& module, const std::string& name) {
  return module.empty() ? name : module + "." + name;
}

std::map<std::string, at::Tensor> to_map(const torch::OrderedDict<std::string, at::Tensor>& d) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : d) out.emplace(item.key(), item.value());
  return out;
}

std::string child_of(const std::string& point) { return point + "_quantizer"; }

bool lsq_initialised(const QuantizerImpl& q) {
  return q.config().lsq && q.named_parameters(/*recurse=*/false).contains("scale");
}

// ---------------------------------------------------------------------------------------------
// /model: each quantized layer's scheme (docs/formats.md, "Model group")

constexpr const char* kModelGroup = "model";
constexpr int64_t kModelFormatVersion = 2;  // 2: observer attributes per kind
// HDF5 has no name for the root module's path "".
constexpr const char* kRootLayerName = "__root__";
// /model attribute: a JSON array of the module paths of RPQ layers saved frozen (absent: none).
constexpr const char* kFrozenRpqAttr = "frozen_rpq_layers";
// /model attribute: a JSON object of module path -> KV-cache scheme (absent: float caches).
constexpr const char* kKvCacheAttr = "kv_cache";

void write_config(const h5::Group& g, const QuantizerConfig& c) {
  write_quantizer_attrs(g, c.observer, c.observer_options, c.spec);
  g.set_attr("lsq", c.lsq);
  // Only when it clips: files without it (and files older than it) read back as 1.
  if (c.clip_ratio != 1.0f) g.set_attr("clip_ratio", static_cast<double>(c.clip_ratio));
}

QuantizerConfig read_config(const h5::Group& g) {
  QuantizerConfig c;
  read_quantizer_attrs(g, &c.observer, &c.observer_options, &c.spec);
  c.lsq = g.attr_int("lsq") != 0;
  if (g.has_attr("clip_ratio")) c.clip_ratio = static_cast<float>(g.attr_double("clip_ratio"));
  return c;
}

void write_model_meta(const h5::Group& root, const ModelMeta& meta) {
  const h5::Group mg = root.create_group(kModelGroup);
  mg.set_attr("model_format_version", kModelFormatVersion);
  if (!meta.frozen_rpq.empty()) mg.set_attr(kFrozenRpqAttr, nlohmann::json(meta.frozen_rpq).dump());
  if (!meta.kv_cache.empty()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [path, scheme] : meta.kv_cache) j[path] = kv_cache_scheme_json(scheme);
    mg.set_attr(kKvCacheAttr, j.dump());
  }
  for (const auto& [path, m] : meta.layers) {
    const h5::Group lg = mg.create_group(path.empty() ? kRootLayerName : path);
    lg.set_attr("layer_type", m.type);
    lg.set_attr("frozen", m.frozen);
    lg.set_attr("weights", m.scheme.weights ? "quantized" : "float");
    lg.set_attr("activations", to_string(m.scheme.activations));
    for (const auto& [point, p] : m.points) {
      const h5::Group pg = lg.create_group(point);
      pg.set_attr("role", p.role == QuantizerImpl::Role::kWeight ? "weight" : "activation");
      pg.set_attr("calibrated", p.calibrated);
      write_config(pg, p.config);
    }
    if (m.float8_scale.defined()) {
      lg.write_tensor("float8_scale", m.float8_scale);
      lg.write_tensor("float8_zero_point", m.float8_zero_point);
    }
  }
}

ModelMeta read_model_meta(const std::string& path) {
  ModelMeta meta;
  const h5::File f = h5::File::open(path);
  const h5::Group root = f.root();
  if (!root.has(kModelGroup)) return meta;  // a plain checkpoint: every layer float
  const h5::Group mg = root.open_group(kModelGroup);
  const int64_t version = mg.attr_int("model_format_version");
  QF_REQUIRE(version >= 1 && version <= kModelFormatVersion, "framework/io: ", path,
             ": group '/model' has model_format_version ", version, "; this qforge reads up to ",
             kModelFormatVersion);
  if (mg.has_attr(kFrozenRpqAttr)) {
    const nlohmann::json j = nlohmann::json::parse(mg.attr_string(kFrozenRpqAttr), nullptr, /*allow_exceptions=*/false);
    QF_REQUIRE(j.is_array() && std::all_of(j.begin(), j.end(), [](const nlohmann::json& e) { return e.is_string(); }),
               "framework/io: ", path, ": group '/model': attribute ", kFrozenRpqAttr,
               " is not a JSON array of module paths");
    meta.frozen_rpq = j.get<std::vector<std::string>>();
  }
  if (mg.has_attr(kKvCacheAttr)) {
    const std::string who = "framework/io: " + path + ": group '/model': attribute " + kKvCacheAttr;
    const nlohmann::json j = nlohmann::json::parse(mg.attr_string(kKvCacheAttr), nullptr, /*allow_exceptions=*/false);
    QF_REQUIRE(j.is_object(), who, " is not a JSON object of module paths");
    for (const auto& [module, scheme] : j.items()) meta.kv_cache[module] = kv_cache_scheme_from_json(scheme, who.c_str());
  }
  for (const std::string& name : mg.children()) {
    const h5::Group lg = mg.open_group(name);
    LayerMeta m;
    try {
      m.type = lg.attr_string("layer_type");
      m.frozen = lg.attr_int("frozen") != 0;
      m.scheme.activations = activation_mode_from_name(lg.attr_string("activations"));
      const bool quantized_weights = lg.attr_string("weights") == "quantized";
      for (const std::string& point : lg.children()) {
        if (lg.child_type(point) != h5::ObjectType::kGroup) continue;
        const h5::Group pg = lg.open_group(point);
        PointMeta p;
        const std::string role = pg.attr_string("role");
        QF_REQUIRE(role == "weight" || role == "activation", "point '", point, "' has role '", role, "'");
        p.role = role == "weight" ? QuantizerImpl::Role::kWeight : QuantizerImpl::Role::kActivation;
        p.calibrated = pg.attr_int("calibrated") != 0;
        p.config = read_config(pg);
        if (p.role == QuantizerImpl::Role::kWeight) m.scheme.weights = p.config;
        else m.scheme.activation = p.config;
        m.points[point] = std::move(p);
      }
      QF_REQUIRE(quantized_weights == m.scheme.weights.has_value(), "attribute weights disagrees with its points");
      if (lg.has("float8_scale")) {
        m.float8_scale = lg.read_tensor("float8_scale");
        m.float8_zero_point = lg.read_tensor("float8_zero_point");
      }
    } catch (const Error& err) {
      const std::string msg = err.what();
      if (msg.find(path) != std::string::npos) throw;
      throw Error("framework/io: " + path + ": group '/model/" + name + "': " + msg);
    }
    meta.layers[name == kRootLayerName ? "" : name] = std::move(m);
  }
  return meta;
}

// ---------------------------------------------------------------------------------------------
// A frozen layer's weight as a checkpoint entry: the same type, detached CPU copies, validated.

QuantizedTensor stored_copy(const QuantizedTensor& fw, const std::string& who) {
  QF_REQUIRE(fw.data.defined(), who, ": frozen weight has no packed storage");
  QuantizedTensor q = fw;
  q.data = fw.data.detach().cpu().contiguous().clone();
  if (fw.codebook.defined()) {
    q.codebook = fw.codebook.detach().cpu().to(at::kHalf).contiguous().clone();
  } else if (fw.qtype().is_microscaling()) {  // scale bytes, nvfp4's tensor scale; no zero point
    q.scale = fw.scale.detach().cpu().contiguous().clone();
    if (fw.tensor_scale.defined()) q.tensor_scale = fw.tensor_scale.detach().cpu().contiguous().clone();
  } else {
    q.scale = fw.scale.detach().cpu().to(at::kFloat).contiguous().clone();
    q.zero_point = fw.zero_point.detach().cpu().to(at::kInt).contiguous().clone();
  }
  q.validate(who);
  return q;
}

// ---------------------------------------------------------------------------------------------
// What a model save writes



std::map<const c10::TensorImpl*, std::string> parameter_names(const torch::nn::Module& model) {
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& p : model.named_parameters(true)) names.emplace(p.value().unsafeGetTensorImpl(), p.key());
  return names;
}

const char* optimizer_kind(const torch::optim::Optimizer& o) {
  if (dynamic_cast<const torch::optim::AdamW*>(&o)) return "adamw";
  if (dynamic_cast<const torch::optim::Adam*>(&o)) return "adam";
  if (dynamic_cast<const torch::optim::SGD*>(&o)) return "sgd";
  return nullptr;
}

// Flat optimizer state keyed by parameter name: "state.<param>.exp_avg", "param_groups.<i>.lr".
void save_optimizer(const torch::optim::Optimizer& o, const torch::nn::Module& model, CheckpointData& d) {
  const char* kind = optimizer_kind(o);
  QF_REQUIRE(kind, "framework/io: save_model: optimizer state of this optimizer type cannot be saved "
             "(Adam, AdamW and SGD are supported)");
  d.optimizer_kind = kind;
  const auto names = parameter_names(model);
  const auto& state = o.state();
  for (size_t gi = 0; gi < o.param_groups().size(); ++gi) {
    const auto& group = o.param_groups()[gi];
    d.optimizer["param_groups." + std::to_string(gi) + ".lr"] =
        at::scalar_tensor(group.options().get_lr(), at::kDouble);
    for (const at::Tensor& p : group.params()) {
      auto nit = names.find(p.unsafeGetTensorImpl());
      QF_REQUIRE(nit != names.end(), "framework/io: save_model: the optimizer holds a parameter of shape ",
                 p.sizes(), " that is not in the model");
      auto sit = state.find(state_key(state, p));
      if (sit == state.end()) continue;  // never stepped
      const std::string k = "state." + nit->second + ".";
      auto put = [&](const char* name, const at::Tensor& t) {
        if (t.defined()) d.optimizer[k + name] = t.detach();
      };
      if (std::string(kind) == "sgd") {
        put("momentum_buffer", static_cast<const torch::optim::SGDParamState&>(*sit->second).momentum_buffer());
      } else if (std::string(kind) == "adam") {
        const auto& s = static_cast<const torch::optim::AdamParamState&>(*sit->second);
        d.optimizer[k + "step"] = at::scalar_tensor(static_cast<int64_t>(s.step()), at::kLong);
        put("exp_avg", s.exp_avg());
        put("exp_avg_sq", s.exp_avg_sq());
        put("max_exp_avg_sq", s.max_exp_avg_sq());
      } else {
        const auto& s = static_cast<const torch::optim::AdamWParamState&>(*sit->second);
        d.optimizer[k + "step"] = at::scalar_tensor(static_cast<int64_t>(s.step()), at::kLong);
        put("exp_avg", s.exp_avg());
        put("exp_avg_sq", s.exp_avg_sq());
        put("max_exp_avg_sq", s.max_exp_avg_sq());
      }
    }
  }
}

ModelFileData collect(const torch::nn::Module& model, const SaveOptions& options) {
  ModelFileData f;
  CheckpointData& d = f.data;
  d.step = options.step;
  d.recipe = options.recipe;
  d.parameters = to_map(model.named_parameters(true));
  d.buffers = to_map(model.named_buffers(true));
  for (const auto& [path, layer] : quantizable_layers(model)) {
    if (!layer->quantized()) continue;
    LayerMeta m;
    m.type = layer->layer_type();
    m.frozen = layer->frozen();
    m.scheme = layer->scheme();
    for (const Quantizer& q : layer->quantizers()) {
      PointMeta p;
      p.role = q->role();
      p.config = q->config();
      p.calibrated = q->calibrated();
      m.points[quantization_point(path, q)] = p;
      // A weight quantizer's scale / zero_point buffers hold something only once its grid is
      // fixed (calibrated); otherwise the grid follows the weight and they are not written.
      if (p.role == QuantizerImpl::Role::kWeight && !p.calibrated) {
        for (const char* b : {"scale", "zero_point"}) d.buffers.erase(join(join(path, child_of("weight")), b));
        // Likewise a codebook before k-means fitted it (an empty parameter).
        d.parameters.erase(join(join(path, child_of("weight")), "codebook"));
      }
    }
    if (m.frozen) {
      const QuantizedTensor fw = layer->frozen_weight();
      const std::string wkey = join(path, "weight");
      if (fw.defined()) {
        d.parameters.erase(wkey);
        const std::string who = "framework/io: save_model: layer '" + path + "'";
        if (fw.spec.qtype.is_float()) {
          // float8 codes: a uint8 dataset of the weight's shape; scale in the layer's /model group.
          QF_REQUIRE(fw.data.defined(), who, ": frozen weight has no packed storage");
          d.parameters[wkey] = fw.data.detach().cpu().to(at::kByte).reshape(fw.shape);
          m.float8_scale = fw.scale.detach().cpu().to(at::kFloat).contiguous();
          m.float8_zero_point = fw.zero_point.detach().cpu().to(at::kInt).contiguous();
        } else {
          d.quantized[wkey] = stored_copy(fw, who);
        }
      }
      const at::Tensor bias = layer->frozen_bias();
      const std::string bkey = join(path, "bias");
      if (bias.defined() && !d.parameters.count(bkey)) d.parameters[bkey] = bias.detach();
    }
    f.meta.layers[path] = std::move(m);
  }
  // Frozen RPQ layers: their packed tensors under the unfrozen layer's keys and sections.
  for (const auto& [path, l] : nn::rpq_layers(model)) {
    if (!l->frozen()) continue;
    d.parameters[join(path, "codebooks")] = l->codebooks();
    d.buffers[join(path, "indices")] = l->indices();
    if (l->has_bias()) d.parameters[join(path, "bias")] = l->packed_weight()->bias();
    f.meta.frozen_rpq.push_back(path);
  }
  if (options.optimizer) save_optimizer(*options.optimizer, model, d);
  for (const auto& [path, m] : kv_cache_models(model))
    if (m->kv_cache_scheme().quantized()) f.meta.kv_cache[path] = m->kv_cache_scheme();
  return f;
}

ModelFileData snapshot_model(const ModelFileData& f) {
  ModelFileData s;
  s.data = snapshot(f.data);
  s.meta = f.meta;
  for (auto& [path, m] : s.meta.layers) {
    if (m.float8_scale.defined()) m.float8_scale = m.float8_scale.clone();
    if (m.float8_zero_point.defined()) m.float8_zero_point = m.float8_zero_point.clone();
  }
  return s;
}

void write_model_file(const std::string& path, const ModelFileData& f) {
  for (const auto& [key, q] : f.data.quantized) {
    QF_REQUIRE(!f.data.parameters.count(key), "framework/io: save_model: '", key,
               "' is both a float and a quantized parameter");
  }
  // The checkpoint layout of checkpoint.cpp, plus the /model group in the same atomic write.
  save_checkpoint(path, f.data, [&](const h5::Group& root) { write_model_meta(root, f.meta); });
}

}  // namespace qforge::io::model_file
