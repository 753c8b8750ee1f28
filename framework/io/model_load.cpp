// Loading qforge models from HDF5 model checkpoints: every check first, then the changes, so a
// failed load leaves the model exactly as it was (model_io.h). This file walks the model and the
// file and applies the plan; model_load_state.cpp restores frozen weights and quantizer states.
#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cstdio>
#include <memory>
#include <set>

#include "framework/core/error.h"
#include "framework/io/checkpoint.h"
#include "framework/io/format.h"
#include "framework/io/model_file.h"
#include "framework/io/model_io.h"
#include "framework/io/model_loader.h"
#include "framework/io/quantizer_attrs.h"

namespace qforge::io {

namespace model_load {

using namespace model_file;
using detail::str_cat;

namespace {

bool same_config(const QuantizerConfig& a, const QuantizerConfig& b) {
  return same_spec(a.spec, b.spec) && a.lsq == b.lsq && a.observer == b.observer &&
         same_options(a.observer_options, b.observer_options, a.observer) && a.clip_ratio == b.clip_ratio;
}

bool same_scheme(const LayerScheme& a, const LayerScheme& b) {
  if (a.weights.has_value() != b.weights.has_value()) return false;
  if (a.weights && !same_config(*a.weights, *b.weights)) return false;
  if (a.activations != b.activations) return false;
  return a.activations == ActivationMode::kNone || same_config(a.activation, b.activation);
}

std::string scheme_string(const LayerScheme& s) {
  std::string out = "weights " + (s.weights ? s.weights->spec.to_string() + (s.weights->lsq ? " lsq" : "") : "float");
  out += ", activations ";
  out += to_string(s.activations);
  if (s.activations != ActivationMode::kNone) out += " " + s.activation.spec.to_string();
  if (s.activation.clip_ratio != 1.0f) out += detail::str_cat(" clip ", s.activation.clip_ratio);
  return out;
}

}  // namespace

Loader::Loader(torch::nn::Module& model, const std::string& path, const LoadModelOptions& o)
    : model_(model), reader_(path), opts_(o) {
  meta_ = read_model_meta(path);
}

LoadReport Loader::run() {
  plan();
  apply();
  report_.step = reader_.step();
  report_.recipe = reader_.recipe();
  return report_;
}

std::string Loader::where(Section s, const std::string& key) const {
  if (reader_.contains(key, s)) return "framework/io: " + file() + ": dataset '" + reader_.info(key, s).dataset_path + "'";
  return "framework/io: " + file() + ": dataset '" + dataset_path(s, key) + "'";
}
std::string Loader::layer_where(const std::string& path) const {
  return "framework/io: " + file() + ": layer '" + (path.empty() ? "(root)" : path) + "'";
}

bool Loader::selected(const std::string& key) const { return key_matches_prefix(key, opts_.prefix); }
bool Loader::layer_selected(const std::string& path) const {
  return opts_.prefix.empty() || (!path.empty() && selected(path));
}

bool Loader::require(Section s, const std::string& key) {
  consumed_.insert({s, key});
  if (reader_.contains(key, s)) return true;
  if (opts_.strict) reader_.info(key, s);  // throws "no parameter 'k' (missing dataset '...')"
  report_.missing_keys.push_back(key);
  return false;
}

at::Tensor Loader::read_like(Section s, const std::string& key, const at::Tensor& target, bool dequant) {
  const EntryInfo& e = reader_.info(key, s);
  QF_REQUIRE(e.shape == target.sizes().vec(), where(s, key), " has shape ", at::IntArrayRef(e.shape),
             ", model expects ", target.sizes());
  QF_REQUIRE(!e.quantized || dequant, where(s, key), " is quantized (", e.qtype,
             "); the model has a float tensor there (load with dequantize=true, or into a model whose layer "
             "is quantized as saved)");
  at::Tensor v = reader_.read_tensor(key, s, dequant);
  const bool both_float = at::isFloatingType(v.scalar_type()) && at::isFloatingType(target.scalar_type());
  QF_REQUIRE(both_float || v.scalar_type() == target.scalar_type(), where(s, key), " has dtype ", v.scalar_type(),
             ", model expects ", target.scalar_type());
  return v;
}

void Loader::stage_plain(Section s, const std::string& key, const at::Tensor& target) {
  if (!require(s, key)) return;
  at::Tensor v = read_like(s, key, target, opts_.dequantize);
  if (!opts_.allow_non_finite && at::isFloatingType(v.scalar_type())) {
    const int64_t bad = v.numel() - at::isfinite(v).sum().item<int64_t>();
    QF_REQUIRE(bad == 0, where(s, key), " holds ", bad, " NaN/inf values (LoadModelOptions::allow_non_finite loads them)");
    if (key.size() >= 11 && key.compare(key.size() - 11, 11, "running_var") == 0) {
      const int64_t negative = at::lt(v, 0).sum().item<int64_t>();
      QF_REQUIRE(negative == 0, where(s, key), " holds ", negative, " negative variances");
    }
  }
  staged_.push_back({target, std::move(v)});
}

void Loader::plan() {
  const auto params = to_map(model_.named_parameters(true));
  const auto buffers = to_map(model_.named_buffers(true));
  std::set<std::string> layer_keys;
  for (const auto& [path, layer] : quantizable_layers(model_)) {
    for (const auto& p : layer->module().named_parameters(true)) layer_keys.insert(join(path, p.key()));
    for (const auto& b : layer->module().named_buffers(true)) layer_keys.insert(join(path, b.key()));
    if (!layer_selected(path)) continue;
    plan_optional_buffers(path, *layer);
    plan_layer(path, *layer);
  }
  plan_rpq();
  plan_kv_cache();
  // Tensors of other modules.
  for (const auto& [key, t] : params)
    if (!layer_keys.count(key) && selected(key)) stage_plain(Section::kParameters, key, t);
  if (!opts_.parameters_only)
    for (const auto& [key, t] : buffers)
      if (!layer_keys.count(key) && selected(key)) stage_plain(Section::kBuffers, key, t);
  // Layers the file describes but the model lacks.
  std::set<std::string> model_layers;
  for (const auto& [path, layer] : quantizable_layers(model_)) model_layers.insert(path);
  for (const auto& [path, m] : meta_.layers) {
    if (model_layers.count(path) || !layer_selected(path)) continue;
    QF_REQUIRE(!opts_.strict, layer_where(path), " (", m.type, ", ", scheme_string(m.scheme),
               ") has no qforge layer at that path in the model (strict load)");
  }
  plan_unused_entries();
  if (opts_.optimizer && !opts_.parameters_only) plan_optimizer();
}

// RPQ layers load their tensors like any module's. A frozen one cannot be loaded into (its tensors
// left the module); those the file saved frozen are frozen once everything loaded (not when
// dequantizing: that load leaves every layer unfrozen), from the file's tensors only.
void Loader::plan_rpq() {
  std::map<std::string, nn::RPQLayer*> in_model;
  for (const auto& [path, l] : nn::rpq_layers(model_)) {
    if (!layer_selected(path)) continue;
    QF_REQUIRE(!l->frozen(), layer_where(path), ": the model's ", l->layer_type(),
               " is frozen; load into a freshly built model");
    in_model[path] = l;
  }
  if (opts_.dequantize) return;
  std::set<std::string> seen;
  for (const std::string& path : meta_.frozen_rpq) {
    if (!layer_selected(path) || !seen.insert(path).second) continue;
    const auto it = in_model.find(path);
    if (it == in_model.end()) {
      QF_REQUIRE(!opts_.strict, layer_where(path), " is a frozen RPQ layer; the model has no RPQ layer there (strict load)");
      continue;
    }
    const at::Device device = it->second->codebooks().device();
    QF_REQUIRE(device.is_cpu(), layer_where(path), " was saved frozen, and frozen RPQ layers run on the CPU; the model's ",
               it->second->layer_type(), " is on ", device, " (load into the model on the CPU)");
    plan_frozen_rpq(path, *it->second);
    rpq_freeze_.emplace_back(path, it->second);
  }
}

// The file's KV-cache schemes, each checked against its module's head_dim before anything changes.
// A selected cache the file does not name is set float (the file's model had a float cache), and
// a dequantizing load sets every selected cache float, as it leaves the layers float.
void Loader::plan_kv_cache() {
  std::map<std::string, KvCacheModel*> in_model;
  for (const auto& [path, m] : kv_cache_models(model_)) in_model[path] = m;
  for (const auto& [path, scheme] : meta_.kv_cache) {
    if (!layer_selected(path) || in_model.count(path)) continue;
    QF_REQUIRE(!opts_.strict, layer_where(path), " has a ", scheme.to_string(),
               " KV cache; the model keeps no KV cache there (strict load)");
  }
  for (const auto& [path, m] : in_model) {
    if (!layer_selected(path)) continue;
    const auto it = meta_.kv_cache.find(path);
    if (opts_.dequantize || it == meta_.kv_cache.end()) {
      kv_cache_.emplace_back(m, KvCacheScheme{});
      continue;
    }
    m->check_kv_cache_scheme(it->second, layer_where(path));
    kv_cache_.emplace_back(m, it->second);
  }
}

// A layer frozen by the load is frozen with the file's codebooks, indices and bias, never its own:
// each must be in the file, and the indices buffer loads even under parameters_only (it is the weight).
void Loader::plan_frozen_rpq(const std::string& path, nn::RPQLayer& layer) {
  std::vector<std::pair<Section, std::string>> keys = {{Section::kParameters, "codebooks"}, {Section::kBuffers, "indices"}};
  if (layer.has_bias()) keys.emplace_back(Section::kParameters, "bias");
  for (const auto& [s, name] : keys) {
    const std::string key = join(path, name);
    QF_REQUIRE(reader_.contains(key, s), layer_where(path), " was saved frozen, and the file has no ", to_string(s), " '",
               key, "' (dataset '", dataset_path(s, key), "'); a frozen ", layer.layer_type(),
               " needs its codebooks, indices and bias from the file");
  }
  if (opts_.parameters_only) stage_plain(Section::kBuffers, join(path, "indices"), layer.indices());
}

// File entries nobody asked for.
void Loader::plan_unused_entries() {
  ReadOptions ro;
  ro.prefix = opts_.prefix;
  ro.buffers = !opts_.parameters_only;
  ro.optimizer = false;
  for (const EntryInfo& e : reader_.entries(ro)) {
    if (consumed_.count({e.section, e.key})) continue;
    QF_REQUIRE(!opts_.strict, "framework/io: ", file(), ": dataset '", e.dataset_path, "': the checkpoint's ",
               to_string(e.section), " '", e.key, "' has no counterpart in the model (strict load)");
    report_.unexpected_keys.push_back(e.key);
  }
}

// Buffers the file holds that the model's layer creates only when set (SmoothQuant's
// pre_quant_scale): created in apply(); those the layer has already load like any buffer.
void Loader::plan_optional_buffers(const std::string& path, QuantizableLayer& layer) {
  if (opts_.parameters_only) return;
  const auto have = layer.module().named_buffers(false);
  for (const std::string& name : layer.optional_buffers()) {
    const std::string key = join(path, name);
    if (have.contains(name) || !reader_.contains(key, Section::kBuffers)) continue;
    consumed_.insert({Section::kBuffers, key});
    const at::Tensor v = reader_.read_tensor(key, Section::kBuffers);
    try {
      layer.check_optional_buffer(name, v);
    } catch (const Error& err) {
      throw Error(where(Section::kBuffers, key) + ": " + err.what());
    }
    created_.push_back({&layer, name, v});
  }
}

void Loader::plan_layer(const std::string& path, QuantizableLayer& layer) {
  auto mit = meta_.layers.find(path);
  const LayerMeta* m = mit == meta_.layers.end() ? nullptr : &mit->second;
  const bool saved_quantized = m && (m->scheme.weights || m->scheme.activations != ActivationMode::kNone);
  QF_REQUIRE(!layer.frozen(), layer_where(path),
             ": the model's layer is frozen; load into a freshly built (float) model or one in fake-quant state");
  if (saved_quantized && layer.layer_type() != m->type) {
    throw Error(str_cat(layer_where(path), " is a ", m->type, " in the checkpoint, a ", layer.layer_type(),
                        " in the model"));
  }
  if (opts_.dequantize) {
    plan_dequantized_layer(path, layer, m, saved_quantized);
    return;
  }
  if (!saved_quantized) {
    plan_float_layer(path, layer);
    return;
  }
  plan_quantized_layer(path, layer, *m);
}

// dequantize=true: a float layer gets the saved layer's weight as its fake-quant (or frozen) form computes it.
void Loader::plan_dequantized_layer(const std::string& path, QuantizableLayer& layer, const LayerMeta* m,
                                    bool saved_quantized) {
  QF_REQUIRE(!layer.quantized(), layer_where(path),
             ": dequantize=true loads into float layers; the model's layer is quantized (",
             scheme_string(layer.scheme()), ")");
  for (bool buffers : {false, true}) {
    if (buffers && opts_.parameters_only) continue;
    const Section s = buffers ? Section::kBuffers : Section::kParameters;
    for (const auto& [name, t] : own_tensors(layer.module(), buffers)) {
      const std::string key = join(path, name);
      if (buffers || !saved_quantized || name != "weight" || !m->scheme.weights) {
        stage_plain(s, key, t);
        continue;
      }
      if (!require(s, key)) continue;
      at::Tensor v;
      if (m->frozen) {
        v = build_frozen(path, *m, t).dequantize();
      } else {
        // The fake-quantized weight, as the saved fake-quant layer computes it in eval.
        const at::Tensor w = read_like(s, key, t, false).to(at::kFloat);
        PointPlan pp;
        Quantizer q = build_point(path, "weight", m->points.at("weight"), ActivationMode::kNone, t.sizes().vec(), pp,
                                  Quantizer(nullptr));
        q->eval();
        at::NoGradGuard g;
        v = q->forward(w).detach().clone();
      }
      staged_.push_back({t, v});
    }
  }
  consume_quantizer_entries(path);
}

void Loader::plan_float_layer(const std::string& path, QuantizableLayer& layer) {
  QF_REQUIRE(!layer.quantized(), layer_where(path), " is float in the checkpoint, quantized in the model (",
             scheme_string(layer.scheme()), ")");
  for (bool buffers : {false, true}) {
    if (buffers && opts_.parameters_only) continue;
    for (const auto& [name, t] : own_tensors(layer.module(), buffers))
      stage_plain(buffers ? Section::kBuffers : Section::kParameters, join(path, name), t);
  }
}

// A layer saved quantized: its scheme attached or matched, its tensors staged, its packed weight
// built (frozen) and each quantization point's state read.
void Loader::plan_quantized_layer(const std::string& path, QuantizableLayer& layer, const LayerMeta& m) {
  LayerPlan lp;
  lp.path = path;
  lp.layer = &layer;
  lp.meta = &m;
  lp.freeze = m.frozen;
  if (layer.quantized()) {
    QF_REQUIRE(same_scheme(layer.scheme(), m.scheme), layer_where(path), " is quantized as ",
               scheme_string(m.scheme), " in the checkpoint, as ", scheme_string(layer.scheme()), " in the model");
  } else {
    lp.attach = true;
    try {
      layer.check_scheme(m.scheme);
    } catch (const Error& err) {
      throw Error(layer_where(path) + ": the saved scheme does not fit the model's layer: " + err.what());
    }
  }
  const std::vector<int64_t> weight_shape = stage_layer_tensors(lp);
  if (lp.freeze && m.scheme.weights && !lp.frozen.defined()) {
    // Non-strict load without the packed weight: nothing to freeze from.
    throw Error(layer_where(path) + ": frozen in the checkpoint but its packed weight is missing");
  }
  std::map<std::string, Quantizer> existing;
  for (const Quantizer& q : layer.quantizers()) existing.emplace(quantization_point(path, q), q);
  for (const auto& [point, pm] : m.points) {
    auto eit = existing.find(point);
    QF_REQUIRE(lp.attach || eit != existing.end(), layer_where(path), ": the model's layer has no quantizer '",
               point, "'");
    PointPlan pp;
    build_point(path, point, pm, m.scheme.activations, weight_shape, pp,
                eit == existing.end() ? Quantizer(nullptr) : eit->second);
    lp.points.push_back(std::move(pp));
  }
  plans_.push_back(std::move(lp));
}

// The layer's own tensors staged, or (frozen) its packed weight built; returns the weight's shape.
std::vector<int64_t> Loader::stage_layer_tensors(LayerPlan& lp) {
  const LayerMeta& m = *lp.meta;
  std::vector<int64_t> weight_shape;
  for (bool buffers : {false, true}) {
    if (buffers && opts_.parameters_only) continue;
    const Section s = buffers ? Section::kBuffers : Section::kParameters;
    for (const auto& [name, t] : own_tensors(lp.layer->module(), buffers)) {
      const std::string key = join(lp.path, name);
      if (!buffers && name == "weight") weight_shape = t.sizes().vec();
      if (!buffers && name == "weight" && lp.freeze && m.scheme.weights) {
        if (require(s, key)) lp.frozen = build_frozen(lp.path, m, t);
        continue;
      }
      stage_plain(s, key, t);
    }
  }
  return weight_shape;
}

void Loader::plan_optimizer() {
  torch::optim::Optimizer& o = *opts_.optimizer;
  const char* kind = optimizer_kind(o);
  QF_REQUIRE(kind, "framework/io: load_model: optimizer state of this optimizer type cannot be restored "
             "(Adam, AdamW and SGD are supported)");
  QF_REQUIRE(reader_.optimizer_kind() == kind, "framework/io: ", file(), ": optimizer state is '",
             reader_.optimizer_kind(), "', the optimizer given is '", kind, "'");
  const auto names = parameter_names(model_);
  for (size_t gi = 0; gi < o.param_groups().size(); ++gi) {
    const std::string lr_key = "param_groups." + std::to_string(gi) + ".lr";
    if (reader_.contains(lr_key, Section::kOptimizer))
      lrs_.emplace_back(gi, reader_.read_tensor(lr_key, Section::kOptimizer).item<double>());
    for (const at::Tensor& p : o.param_groups()[gi].params()) {
      auto nit = names.find(p.unsafeGetTensorImpl());
      QF_REQUIRE(nit != names.end(), "framework/io: load_model: the optimizer holds a parameter of shape ",
                 p.sizes(), " that is not in the model");
      if (!selected(nit->second)) continue;
      OptStaged st;
      st.param = p;
      for (const char* name : {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"}) {
        const std::string key = "state." + nit->second + "." + name;
        if (!reader_.contains(key, Section::kOptimizer)) continue;
        at::Tensor v = reader_.read_tensor(key, Section::kOptimizer);
        if (std::string(name) != "step") {
          QF_REQUIRE(v.sizes() == p.sizes(), where(Section::kOptimizer, key), " has shape ", v.sizes(),
                     ", parameter '", nit->second, "' has ", p.sizes());
          v = v.to(p.scalar_type());
        }
        st.values[name] = v;
      }
      if (!st.values.empty()) opt_staged_.push_back(std::move(st));
    }
  }
}

void Loader::apply_optimizer() {
  torch::optim::Optimizer& o = *opts_.optimizer;
  const std::string kind = optimizer_kind(o);
  auto& state = o.state();
  for (const auto& [gi, lr] : lrs_) o.param_groups()[gi].options().set_lr(lr);
  for (OptStaged& st : opt_staged_) {
    auto get = [&](const char* n) {
      auto it = st.values.find(n);
      return it == st.values.end() ? at::Tensor() : it->second;
    };
    std::unique_ptr<torch::optim::OptimizerParamState> ps;
    if (kind == "sgd") {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(get("momentum_buffer"));
      ps = std::move(s);
    } else {
      // Adam and AdamW keep the same moments under two state types.
      auto fill = [&](auto s) {
        if (get("step").defined()) s->step(get("step").item<int64_t>());
        s->exp_avg(get("exp_avg"));
        s->exp_avg_sq(get("exp_avg_sq"));
        s->max_exp_avg_sq(get("max_exp_avg_sq"));
        ps = std::move(s);
      };
      if (kind == "adam") fill(std::make_unique<torch::optim::AdamParamState>());
      else fill(std::make_unique<torch::optim::AdamWParamState>());
    }
    state[state_key(state, st.param)] = std::move(ps);
  }
}

// ---- mutation: everything above passed ----
void Loader::apply() {
  at::NoGradGuard no_grad;
  for (LayerPlan& lp : plans_) {
    if (lp.attach) {
      lp.layer->attach(lp.path, lp.meta->scheme);
      report_.quantized_layers.push_back(lp.path);
    }
    apply_points(lp);
  }
  for (Created& c : created_) c.layer->set_optional_buffer(c.name, c.value);
  for (Staged& s : staged_) s.target.copy_(s.value);
  for (LayerPlan& lp : plans_) {
    if (!lp.freeze) continue;
    lp.layer->install_frozen(std::move(lp.frozen));
    report_.frozen_layers.push_back(lp.path);
  }
  for (const auto& [path, l] : rpq_freeze_) {
    l->freeze();
    report_.frozen_layers.push_back(path);
  }
  if (opts_.optimizer && !opts_.parameters_only) apply_optimizer();
  for (const auto& [m, scheme] : kv_cache_) m->set_kv_cache_scheme(scheme);
}

// The loaded quantizers' grids, LSQ initialisation and tensors, on the layer's quantizers.
void Loader::apply_points(LayerPlan& lp) {
  const auto children = lp.layer->module().named_children();
  for (PointPlan& pp : lp.points) {
    const std::string child = child_of(pp.point);
    QF_CHECK(children.contains(child), "quantizer '", child, "' of layer '", lp.path, "' after attach");
    auto q = std::dynamic_pointer_cast<QuantizerImpl>(children[child]);
    QF_CHECK(q, "child '", child, "' is not a Quantizer");
    if (pp.qparams.defined() && !lsq_initialised(*q)) q->set_qparams(pp.qparams);
    if (pp.init_lsq && !lsq_initialised(*q)) {
      const bool was = q->is_training();
      q->train(true);
      q->forward(at::zeros(pp.init_shape));
      q->train(was);
    }
    for (const auto& [tag, v] : pp.values) {
      const std::string name = tag.substr(2);
      const bool buffer = tag[0] == 'b';
      const auto d = buffer ? q->named_buffers(false) : q->named_parameters(false);
      QF_CHECK(d.contains(name), "tensor '", name, "' of quantizer '", child, "'");
      d[name].copy_(v);
    }
  }
}

}  // namespace model_load

LoadReport load_model(torch::nn::Module& model, const std::string& path, const LoadModelOptions& options) {
  model_load::Loader loader(model, path, options);
  return loader.run();
}

}  // namespace qforge::io
