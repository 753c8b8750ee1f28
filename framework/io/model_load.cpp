// Loading qforge models from HDF5 model checkpoints: every check first, then the changes, so a
// failed load leaves the model exactly as it was (model_io.h).
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
#include "framework/io/quantizer_attrs.h"

namespace qforge::io {

using namespace model_file;
using detail::str_cat;

// ---------------------------------------------------------------------------------------------
// Loading

namespace {

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

bool same_config(const QuantizerConfig& a, const QuantizerConfig& b) {
  return same_spec(a.spec, b.spec) && a.lsq == b.lsq && a.observer == b.observer &&
         same_options(a.observer_options, b.observer_options, a.observer);
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
  return out;
}

class Loader {
 public:
  Loader(torch::nn::Module& model, const std::string& path, const LoadModelOptions& o)
      : model_(model), reader_(path), opts_(o) {
    meta_ = read_model_meta(path);
  }

  LoadReport run() {
    plan();
    apply();
    report_.step = reader_.step();
    report_.recipe = reader_.recipe();
    return report_;
  }

 private:
  std::string file() const { return reader_.path(); }
  std::string where(Section s, const std::string& key) const {
    if (reader_.contains(key, s)) return "framework/io: " + file() + ": dataset '" + reader_.info(key, s).dataset_path + "'";
    return "framework/io: " + file() + ": dataset '" + dataset_path(s, key) + "'";
  }
  std::string layer_where(const std::string& path) const {
    return "framework/io: " + file() + ": layer '" + (path.empty() ? "(root)" : path) + "'";
  }

  // True when the file has `key`; otherwise throws (strict) or records it as missing.
  bool require(Section s, const std::string& key) {
    consumed_.insert({s, key});
    if (reader_.contains(key, s)) return true;
    if (opts_.strict) reader_.info(key, s);  // throws "no parameter 'k' (missing dataset '...')"
    report_.missing_keys.push_back(key);
    return false;
  }

  // A float entry read and checked against `target` (shape; dtype: floats convert).
  at::Tensor read_like(Section s, const std::string& key, const at::Tensor& target, bool dequant) {
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

  void stage_plain(Section s, const std::string& key, const at::Tensor& target) {
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

  bool selected(const std::string& key) const { return key_matches_prefix(key, opts_.prefix); }

  void plan() {
    const auto params = to_map(model_.named_parameters(true));
    const auto buffers = to_map(model_.named_buffers(true));
    std::set<std::string> layer_keys;
    for (const auto& [path, layer] : quantizable_layers(model_)) {
      for (const auto& p : layer->module().named_parameters(true)) layer_keys.insert(join(path, p.key()));
      for (const auto& b : layer->module().named_buffers(true)) layer_keys.insert(join(path, b.key()));
      const bool chosen = opts_.prefix.empty() || (!path.empty() && selected(path));
      if (!chosen) continue;
      plan_optional_buffers(path, *layer);
      plan_layer(path, *layer);
    }
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
      if (model_layers.count(path) || !(opts_.prefix.empty() || (!path.empty() && selected(path)))) continue;
      QF_REQUIRE(!opts_.strict, layer_where(path), " (", m.type, ", ", scheme_string(m.scheme),
                 ") has no qforge layer at that path in the model (strict load)");
    }
    // File entries nobody asked for.
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
    if (opts_.optimizer && !opts_.parameters_only) plan_optimizer();
  }

  // The layer's own tensors (weight, bias, ...), not its quantizers'.
  static std::vector<std::pair<std::string, at::Tensor>> own(const torch::nn::Module& m, bool buffers) {
    std::vector<std::pair<std::string, at::Tensor>> out;
    const auto d = buffers ? m.named_buffers(false) : m.named_parameters(false);
    for (const auto& item : d) out.emplace_back(item.key(), item.value());
    return out;
  }

  void consume_quantizer_entries(const std::string& path) {
    for (const auto& q : {"weight_quantizer", "input_quantizer", "output_quantizer", "other_quantizer"}) {
      ReadOptions ro;
      ro.prefix = join(path, q);
      for (const EntryInfo& e : reader_.entries(ro)) consumed_.insert({e.section, e.key});
    }
  }

  QuantizedTensor build_frozen(const std::string& path, const LayerMeta& m, const at::Tensor& target) {
    const std::string key = join(path, "weight");
    const QSpec& spec = m.scheme.weights->spec;
    const std::string w = where(Section::kParameters, key);
    const EntryInfo& e = reader_.info(key, Section::kParameters);
    QF_REQUIRE(e.shape == target.sizes().vec(), w, " has shape ", at::IntArrayRef(e.shape), ", model expects ",
               target.sizes());
    QuantizedTensor fw;
    fw.shape = e.shape;
    at::Tensor scale, zero_point;
    if (spec.qtype.is_float()) {
      QF_REQUIRE(!e.quantized, w, " is ", e.qtype, ", the layer's scheme says ", spec.qtype.name);
      const at::Tensor codes = reader_.read_tensor(key, Section::kParameters);
      QF_REQUIRE(codes.scalar_type() == at::kByte, w, ": ", spec.qtype.name, " codes must be uint8, got ",
                 codes.scalar_type());
      fw.data = codes.contiguous().reshape(e.shape);
      scale = m.float8_scale;
      zero_point = m.float8_zero_point;
      QF_REQUIRE(scale.defined() && zero_point.defined(), layer_where(path),
                 ": float8 weight without scale / zero_point in /model");
    } else {
      QF_REQUIRE(e.quantized, w, " is a float tensor, the layer's scheme says ", spec.qtype.name,
                 " (frozen)");
      QF_REQUIRE(e.qtype == spec.qtype.name, w, " is ", e.qtype, ", the layer's scheme says ", spec.qtype.name);
      const QuantizedTensor q = reader_.read_quantized(key, Section::kParameters);
      const int64_t axis = spec.axis < 0 ? spec.axis + static_cast<int64_t>(q.shape.size()) : spec.axis;
      QF_REQUIRE(q.spec.granularity == spec.granularity &&
                     (spec.granularity != Granularity::kPerChannel || q.spec.axis == axis) &&
                     (spec.granularity != Granularity::kPerGroup || q.spec.group_size == spec.group_size),
                 w, " is ", to_string(q.spec.granularity), " (axis ", q.spec.axis, ", group_size ", q.spec.group_size,
                 "), the layer's scheme says ", spec.to_string());
      fw.data = q.data;
      scale = q.scale;
      zero_point = q.zero_point;
      if (spec.qtype.is_codebook()) {
        try {
          fw = make_quantized(make_codebook_qparams(spec, q.codebook.to(at::kFloat), e.shape), e.shape, fw.data);
          (void)fw.dequantize();
        } catch (const Error& err) {
          throw Error(w + ": " + err.what());
        }
        return fw;
      }
    }
    try {
      fw = make_quantized(make_qparams(spec, scale, zero_point), e.shape, fw.data);
      // Checked here, before anything changes: the int8 kernels take symmetric weights only.
      QF_REQUIRE(!(spec.symmetric && spec.qtype.is_integer() && spec.qtype.is_signed) ||
                     at::eq(fw.zero_point, 0).all().item<bool>(),
                 "symmetric ", spec.qtype.name, " weights with nonzero zero points");
      (void)fw.dequantize();  // builds the weight once: any inconsistency fails here, not after changes
    } catch (const Error& err) {
      throw Error(w + ": " + err.what());
    }
    return fw;
  }

  // Scratch quantizer of the saved point with the file's tensors: the expected names, shapes and
  // dtypes, and (for dequantize) the fake-quant it computes.
  Quantizer build_point(const std::string& path, const std::string& point, const PointMeta& pm,
                        ActivationMode mode, const std::vector<int64_t>& weight_shape, PointPlan& plan,
                        const Quantizer& existing) {
    plan.point = point;
    plan.role = pm.role;
    plan.config = pm.config;
    const std::string qprefix = join(path, child_of(point));
    Quantizer q{nullptr};
    try {
      q = Quantizer(pm.role, pm.config, pm.role == QuantizerImpl::Role::kWeight ? ActivationMode::kNone : mode,
                    join(path, point));
    } catch (const Error& err) {
      throw Error(layer_where(path) + ": point '" + point + "': " + err.what());
    }
    at::NoGradGuard no_grad;
    const std::string skey = join(qprefix, "scale"), zkey = join(qprefix, "zero_point");
    // Calibrated static activations, and weights whose grid a PTQ solver fixed.
    const bool fixed = pm.role == QuantizerImpl::Role::kWeight || mode == ActivationMode::kStatic;
    if (fixed && pm.calibrated && !pm.config.lsq && reader_.contains(skey, Section::kBuffers)) {
      QF_REQUIRE(reader_.contains(zkey, Section::kBuffers), where(Section::kBuffers, zkey),
                 ": missing (the layer's scale is there)");
      const at::Tensor s = reader_.read_tensor(skey, Section::kBuffers);
      const at::Tensor z = reader_.read_tensor(zkey, Section::kBuffers);
      try {
        plan.qparams = make_qparams(pm.config.spec, s.to(at::kFloat), z.to(at::kInt));
        if (pm.role == QuantizerImpl::Role::kWeight) {
          const std::vector<int64_t> want = qparam_shape(pm.config.spec, weight_shape);
          QF_REQUIRE(s.sizes().vec() == want, "a fixed weight grid of shape ", s.sizes(), " for a weight of shape ",
                     at::IntArrayRef(weight_shape), " quantized ", pm.config.spec.to_string(), " (expected ",
                     at::IntArrayRef(want), ")");
        }
      } catch (const Error& err) {
        throw Error(where(Section::kBuffers, skey) + ": " + err.what());
      }
      q->set_qparams(plan.qparams);
    }
    // A fitted codebook: its levels fix the scratch quantizer's parameter shape before the copy below.
    const std::string ckey = join(qprefix, "codebook");
    if (pm.config.spec.qtype.is_codebook() && reader_.contains(ckey, Section::kParameters)) {
      const at::Tensor c = reader_.read_tensor(ckey, Section::kParameters);
      try {
        QF_REQUIRE(!weight_shape.empty(), "a codebook without a weight");
        plan.qparams = make_codebook_qparams(pm.config.spec, c.to(at::kFloat), weight_shape);
      } catch (const Error& err) {
        throw Error(where(Section::kParameters, ckey) + ": " + err.what());
      }
      q->set_codebook(plan.qparams.codebook);
    }
    if (pm.config.lsq && reader_.contains(skey, Section::kParameters)) {
      plan.init_lsq = true;
      plan.init_shape = pm.role == QuantizerImpl::Role::kWeight ? weight_shape : std::vector<int64_t>{1};
      QF_REQUIRE(!plan.init_shape.empty() || pm.role != QuantizerImpl::Role::kWeight, layer_where(path),
                 ": LSQ weight quantizer without a weight");
      q->train(true);
      q->forward(at::zeros(plan.init_shape));
      q->train(false);
    }
    // The tensors the loaded quantizer will hold: the scratch quantizer's, or those of an existing
    // LSQ quantizer that already trains (left as it is apart from the copies). An existing
    // quantizer that would hold more than the file gives is missing state.
    const bool keep_existing = existing && lsq_initialised(*existing);
    const torch::nn::Module& ref = keep_existing ? static_cast<const torch::nn::Module&>(*existing)
                                                 : static_cast<const torch::nn::Module&>(*q);
    std::set<std::string> names;
    for (bool buffers : {false, true}) {
      const Section s = buffers ? Section::kBuffers : Section::kParameters;
      for (const auto& [name, t] : own(ref, buffers)) {
        names.insert(std::string(buffers ? "b:" : "p:") + name);
        // Written only for a fixed weight grid (model_file.cpp collect); files of older versions
        // may hold them anyway (consumed below, never read).
        if (buffers && pm.role == QuantizerImpl::Role::kWeight && !pm.calibrated && (name == "scale" || name == "zero_point"))
          continue;
        if (!buffers && name == "codebook" && !pm.calibrated) continue;  // not fitted: not written
        const std::string key = join(qprefix, name);
        if (!require(s, key)) continue;
        at::Tensor v = read_like(s, key, t, false);
        plan.values[std::string(buffers ? "b:" : "p:") + name] = v;
        if (!keep_existing) t.copy_(v);
      }
    }
    if (existing && !keep_existing) {
      for (bool buffers : {false, true}) {
        for (const auto& [name, t] : own(*existing, buffers)) {
          const std::string tag = std::string(buffers ? "b:" : "p:") + name;
          if (names.count(tag)) continue;
          const std::string key = join(qprefix, name);
          QF_REQUIRE(!opts_.strict, where(buffers ? Section::kBuffers : Section::kParameters, key),
                     ": missing; the model's quantizer holds '", key, "' (state the checkpoint lacks)");
          report_.missing_keys.push_back(key);
        }
      }
    }
    if (keep_existing && pm.config.lsq && !reader_.contains(skey, Section::kParameters)) {
      QF_REQUIRE(!opts_.strict, where(Section::kParameters, skey),
                 ": missing; the model's LSQ quantizer already trains but the checkpoint has no learned scale");
    }
    consume_quantizer_entries(path);
    return q;
  }

  // Buffers the file holds that the model's layer creates only when set (SmoothQuant's
  // pre_quant_scale): created in apply(); those the layer has already load like any buffer.
  void plan_optional_buffers(const std::string& path, QuantizableLayer& layer) {
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

  void plan_layer(const std::string& path, QuantizableLayer& layer) {
    auto mit = meta_.layers.find(path);
    const LayerMeta* m = mit == meta_.layers.end() ? nullptr : &mit->second;
    const bool saved_quantized = m && (m->scheme.weights || m->scheme.activations != ActivationMode::kNone);
    torch::nn::Module& mod = layer.module();
    QF_REQUIRE(!layer.frozen(), layer_where(path),
               ": the model's layer is frozen; load into a freshly built (float) model or one in fake-quant state");
    if (saved_quantized && layer.layer_type() != m->type) {
      throw Error(str_cat(layer_where(path), " is a ", m->type, " in the checkpoint, a ", layer.layer_type(),
                          " in the model"));
    }
    if (opts_.dequantize) {
      QF_REQUIRE(!layer.quantized(), layer_where(path),
                 ": dequantize=true loads into float layers; the model's layer is quantized (",
                 scheme_string(layer.scheme()), ")");
      for (bool buffers : {false, true}) {
        if (buffers && opts_.parameters_only) continue;
        const Section s = buffers ? Section::kBuffers : Section::kParameters;
        for (const auto& [name, t] : own(mod, buffers)) {
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
            Quantizer q = build_point(path, "weight", m->points.at("weight"), ActivationMode::kNone,
                                      t.sizes().vec(), pp, Quantizer(nullptr));
            q->eval();
            at::NoGradGuard g;
            v = q->forward(w).detach().clone();
          }
          staged_.push_back({t, v});
        }
      }
      consume_quantizer_entries(path);
      return;
    }
    if (!saved_quantized) {
      QF_REQUIRE(!layer.quantized(), layer_where(path), " is float in the checkpoint, quantized in the model (",
                 scheme_string(layer.scheme()), ")");
      for (bool buffers : {false, true}) {
        if (buffers && opts_.parameters_only) continue;
        for (const auto& [name, t] : own(mod, buffers))
          stage_plain(buffers ? Section::kBuffers : Section::kParameters, join(path, name), t);
      }
      return;
    }
    LayerPlan lp;
    lp.path = path;
    lp.layer = &layer;
    lp.meta = m;
    lp.freeze = m->frozen;
    if (layer.quantized()) {
      QF_REQUIRE(same_scheme(layer.scheme(), m->scheme), layer_where(path), " is quantized as ",
                 scheme_string(m->scheme), " in the checkpoint, as ", scheme_string(layer.scheme()),
                 " in the model");
    } else {
      lp.attach = true;
      try {
        layer.check_scheme(m->scheme);
      } catch (const Error& err) {
        throw Error(layer_where(path) + ": the saved scheme does not fit the model's layer: " + err.what());
      }
    }
    std::vector<int64_t> weight_shape;
    for (bool buffers : {false, true}) {
      if (buffers && opts_.parameters_only) continue;
      const Section s = buffers ? Section::kBuffers : Section::kParameters;
      for (const auto& [name, t] : own(mod, buffers)) {
        const std::string key = join(path, name);
        if (!buffers && name == "weight") weight_shape = t.sizes().vec();
        if (!buffers && name == "weight" && lp.freeze && m->scheme.weights) {
          if (require(s, key)) lp.frozen = build_frozen(path, *m, t);
          continue;
        }
        stage_plain(s, key, t);
      }
    }
    if (lp.freeze && m->scheme.weights && !lp.frozen.defined()) {
      // Non-strict load without the packed weight: nothing to freeze from.
      throw Error(layer_where(path) + ": frozen in the checkpoint but its packed weight is missing");
    }
    std::map<std::string, Quantizer> existing;
    for (const Quantizer& q : layer.quantizers()) existing.emplace(quantization_point(path, q), q);
    for (const auto& [point, pm] : m->points) {
      auto eit = existing.find(point);
      QF_REQUIRE(lp.attach || eit != existing.end(), layer_where(path), ": the model's layer has no quantizer '",
                 point, "'");
      PointPlan pp;
      build_point(path, point, pm, m->scheme.activations, weight_shape, pp,
                  eit == existing.end() ? Quantizer(nullptr) : eit->second);
      lp.points.push_back(std::move(pp));
    }
    plans_.push_back(std::move(lp));
  }

  // ---- optimizer ----
  struct OptStaged {
    at::Tensor param;
    std::map<std::string, at::Tensor> values;
  };

  void plan_optimizer() {
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

  void apply_optimizer() {
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
  void apply() {
    at::NoGradGuard no_grad;
    for (LayerPlan& lp : plans_) {
      if (lp.attach) {
        lp.layer->attach(lp.path, lp.meta->scheme);
        report_.quantized_layers.push_back(lp.path);
      }
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
    for (Created& c : created_) c.layer->set_optional_buffer(c.name, c.value);
    for (Staged& s : staged_) s.target.copy_(s.value);
    for (LayerPlan& lp : plans_) {
      if (!lp.freeze) continue;
      lp.layer->install_frozen(std::move(lp.frozen));
      report_.frozen_layers.push_back(lp.path);
    }
    if (opts_.optimizer && !opts_.parameters_only) apply_optimizer();
  }

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
  std::vector<std::pair<size_t, double>> lrs_;
  std::vector<OptStaged> opt_staged_;
  LoadReport report_;
};

}  // namespace

LoadReport load_model(torch::nn::Module& model, const std::string& path, const LoadModelOptions& options) {
  Loader loader(model, path, options);
  return loader.run();
}

}  // namespace qforge::io
