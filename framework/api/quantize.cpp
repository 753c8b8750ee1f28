// quantize / Calibration / QAT / freeze / model_size / describe over a module tree.
#include "framework/api/quantize.h"

#include <torch/nn/modules/batchnorm.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "framework/api/kv_cache_scheme.h"
#include "framework/api/kv_static_scales.h"
#include "framework/core/error.h"
#include "framework/nn/conv.h"
#include "framework/nn/convert.h"
#include "framework/nn/rpq.h"

namespace qforge {

namespace {

std::string display_name(const std::string& path) { return path.empty() ? "(root)" : path; }

// The error quantize() gives for plain LibTorch layers: each with where it sits and its way out.
std::string float_layers_error(const torch::nn::Module& model, const std::vector<PlainLayer>& plain) {
  const nn::ConvertReport plan = nn::convert_plan(model);
  std::map<std::string, std::string> hint;
  for (const auto& e : plan.converted) hint[e.path] = "inside a Sequential: qforge::nn::convert(model) replaces it";
  for (const auto& e : plan.kept) hint[e.path] = e.note;
  std::string all;
  for (const PlainLayer& p : plain) {
    const auto h = hint.find(p.path);
    all += "\n  " + display_name(p.path) + " (torch::nn::" + p.type + "): " +
           (h != hint.end() ? h->second : "use qforge::nn::" + p.type);
  }
  return "quantize: " + std::to_string(plain.size()) +
         " LibTorch layer(s) have no quantizers and would stay float while the model looks quantized:" + all +
         "\nWays out: (1) qforge layers: declare qforge::nn::Linear, Conv1d, Conv2d, Embedding, LayerNorm (same options, "
         "parameter names and float forward as their torch::nn twins), or run qforge::nn::convert(model) to replace "
         "the layers inside Sequentials; (2) TorchScript: script or trace the model in PyTorch and bring the file "
         "(README, \"Your own model\"). Scheme::allow_float_layers = true keeps them float with a warning instead.";
}

// A torch::nn::BatchNorm2d right after a qforge Conv2d (BatchNorm1d after a Conv1d) in a
// Sequential (nn::batch_norm_after). The conv quantizes; the BatchNorm stays a float op after it
// unless folded.
struct BatchNormAfterConv {
  std::string path;
  const torch::nn::Module* bn;
  const QuantizableLayer* conv;
  bool one_d = false;
};
std::vector<BatchNormAfterConv> batch_norms_after_convs(const torch::nn::Module& model) {
  std::vector<BatchNormAfterConv> out;
  std::vector<std::pair<std::string, const torch::nn::Module*>> modules{{std::string(), &model}};
  for (const auto& item : model.named_modules("", /*include_self=*/false)) modules.emplace_back(item.key(), item.value().get());
  for (const auto& [path, m] : modules) {
    const auto* seq = dynamic_cast<const torch::nn::SequentialImpl*>(m);
    if (!seq) continue;
    const auto children = seq->named_children();
    for (size_t i = 0; i + 1 < std::min(children.size(), seq->size()); ++i) {
      const auto* conv2 = dynamic_cast<const nn::Conv2dImpl*>(seq->ptr(i).get());
      const auto* conv1 = dynamic_cast<const nn::Conv1dImpl*>(seq->ptr(i).get());
      const QuantizableLayer* conv = conv2 ? static_cast<const QuantizableLayer*>(conv2) : conv1;
      const torch::nn::Module* bn = nn::batch_norm_after(*seq, i);
      if (conv && bn)
        out.push_back({path.empty() ? children[i + 1].key() : path + "." + children[i + 1].key(), bn, conv, conv1 != nullptr});
    }
  }
  return out;
}

std::string batch_norm_reason(const std::string& conv_path, bool one_d) {
  return std::string(one_d ? "torch::nn::BatchNorm1d after the quantized Conv1d '" : "torch::nn::BatchNorm2d after the quantized Conv2d '") + conv_path +
         "' stays a float op: fold it into the conv before quantize() (qforge::nn::fold_conv_bn; qforge::nn::convert "
         "folds Sequential pairs in eval mode) so freeze() runs one integer convolution";
}

}  // namespace

QuantizeReport quantize(torch::nn::Module& model, const Scheme& scheme) {
  QuantizeReport report;
  std::vector<bool> rule_used(scheme.rules.size(), false);
  // Resolve everything first so a bad combination changes nothing.
  std::vector<std::pair<QuantizableLayer*, QuantizeReport::Entry>> plan;
  for_each_quantizable(model, [&](const std::string& path, QuantizableLayer& layer) {
    int rule = -1;
    std::string note;
    const std::optional<LayerScheme> ls = scheme.resolve(path, layer, &rule, &note);
    if (rule >= 0) rule_used[rule] = true;
    if (!note.empty()) report.warnings.push_back(display_name(path) + ": " + note);
    if (!ls) {
      report.kept_float.push_back(display_name(path));
      return;
    }
    layer.check_scheme(*ls);
    plan.push_back({&layer, QuantizeReport::Entry{path, layer.layer_type(), *ls, rule, note}});
  });
  if (scheme.activation_clip_ratio != 1.0f) {
    QF_REQUIRE(scheme.activation_clip_ratio > 0.0f && scheme.activation_clip_ratio <= 1.0f,
               "quantize: Scheme::activation_clip_ratio must be in (0, 1], got ", scheme.activation_clip_ratio);
    // A scheme that asks for no dynamic rows anywhere cannot mean the ratio; rules, float layers or
    // convolutions (static) leaving none dynamic in this model are said, not refused.
    QF_REQUIRE(scheme.asks_activations(ActivationMode::kDynamicPerToken), "quantize: Scheme::activation_clip_ratio ", scheme.activation_clip_ratio,
               " clips dynamic per-token activation rows only, and the scheme asks for none (static scales come "
               "from the observer): set activations to ActivationMode::kDynamicPerToken, or leave the ratio at 1");
    if (std::none_of(plan.begin(), plan.end(), [](const auto& p) {
          return p.second.scheme.activations == ActivationMode::kDynamicPerToken;
        }))
      report.warnings.push_back(detail::str_cat("activation_clip_ratio ", scheme.activation_clip_ratio,
                                                " clips no layer: none has dynamic per-token activations here"));
  }
  if (scheme.asks_attention_scales(AttentionScales::kPerHead)) {
    // Per-head scales are static ones: a scheme with no static activations anywhere cannot mean
    // them; learned (LSQ) activation steps are per tensor.
    QF_REQUIRE(scheme.asks_activations(ActivationMode::kStatic), "quantize: attention_scales per_head sets the static scales of attention products, and "
               "the scheme's activations are ", to_string(scheme.activations), " with no rule asking for static ones: "
               "set activations to ActivationMode::kStatic, or leave attention_scales per_tensor");
    const auto per_head = [](const auto& p) {
      return p.second.scheme.activations == ActivationMode::kStatic &&
             p.second.scheme.activation.spec.granularity == Granularity::kPerChannel;
    };
    QF_REQUIRE(!scheme.activation_lsq || std::none_of(plan.begin(), plan.end(), per_head),
               "quantize: attention_scales per_head with activation_lsq: learned activation steps are per tensor; "
               "calibrate per-head scales without LSQ, or keep attention_scales per_tensor");
    if (std::none_of(plan.begin(), plan.end(), per_head))
      report.warnings.push_back("attention_scales per_head applies to no layer: no MatMul (attention product) has "
                                "static activations here");
  }
  const std::vector<PlainLayer> plain = plain_libtorch_layers(model);
  if (!scheme.allow_float_layers && !plain.empty()) throw Error(float_layers_error(model, plain));
  for (const PlainLayer& p : plain) {
    report.warnings.push_back(display_name(p.path) + ": " + p.reason());
    report.kept_float.push_back(display_name(p.path));
  }
  for (size_t i = 0; i < scheme.rules.size(); ++i)
    if (!rule_used[i])
      report.warnings.push_back("rule " + std::to_string(i) + " (pattern '" + scheme.rules[i].pattern +
                                "') matched no layer");
  for (const BatchNormAfterConv& b : batch_norms_after_convs(model)) {
    const auto it = std::find_if(plan.begin(), plan.end(), [&](const auto& p) { return p.first == b.conv; });
    if (it != plan.end()) report.notes.push_back(b.path + ": " + batch_norm_reason(display_name(it->second.path), b.one_d));
  }
  for (auto& [layer, entry] : plan) {
    layer->attach(entry.path, entry.scheme);
    report.quantized.push_back(std::move(entry));
  }
  for (const std::string& w : report.warnings) std::fprintf(stderr, "qforge: warning: %s\n", w.c_str());
  for (const std::string& n : report.notes) std::fprintf(stderr, "qforge: note: %s\n", n.c_str());
  return report;
}

Calibration::Calibration(torch::nn::Module& model) {
  for_each_quantizable(model, [&](const std::string&, QuantizableLayer& layer) {
    for (Quantizer q : layer.quantizers()) {
      if (q->role() == QuantizerImpl::Role::kWeight) {
        // The forwards fake-quantize each weight afresh: calibrating peaks at the float model plus
        // one layer's fake-quantized weight, not at twice the float model.
        q->pause_weight_cache();
        uncached_.push_back(q);
      }
      if (q->role() != QuantizerImpl::Role::kActivation || q->mode() != ActivationMode::kStatic) continue;
      q->set_observing(true);
      q->set_fake_quant(false);
      quantizers_.push_back(q);
    }
  });
  try {
    for (const auto& [path, m] : kv_cache_models(model)) {
      const KvCacheScheme& s = m->kv_cache_scheme();
      if (!s.is_static()) continue;
      KvCacheScheme observing = s;
      observing.calibrated.reset();
      observing.observer = std::make_shared<KvRangeObserver>(s, m->kv_cache_layers(), m->kv_cache_heads(),
                                                             m->kv_cache_head_dim());
      kv_caches_.push_back({path, m, s, observing.observer});
      m->set_kv_cache_scheme(observing);
    }
  } catch (...) {  // no destructor runs for a half-built guard: put the schemes and switches back
    for (const KvCacheCalibration& c : kv_caches_) c.model->set_kv_cache_scheme(c.before);
    for (Quantizer q : quantizers_) q->set_observing(false), q->set_fake_quant(true);
    for (Quantizer q : uncached_) q->resume_weight_cache();
    throw;
  }
}

void Calibration::finish() {
  if (done_) return;
  done_ = true;
  for (Quantizer q : uncached_) q->resume_weight_cache();
  std::vector<std::string> empty;
  // The KV caches first: an activation quantizer whose qparams throw must not leave a cache observing.
  for (const KvCacheCalibration& c : kv_caches_) {
    KvCacheScheme done = c.model->kv_cache_scheme();
    if (done.observer != c.observer) {
      // The scheme was replaced inside the guard (set_kv_cache_scheme, a load, another Calibration):
      // it is the caller's now.
      continue;
    }
    try {
      done.calibrated = c.observer->compute("KV cache");
      done.observer.reset();
      c.model->set_kv_cache_scheme(done);
    } catch (const std::exception&) {
      c.model->set_kv_cache_scheme(c.before);
      empty.push_back((c.path.empty() ? std::string("(root)") : c.path) + " KV cache");
    }
  }
  // Every quantizer leaves observing even when one's qparams throw; the first such error is rethrown after.
  std::exception_ptr failed;
  for (Quantizer q : quantizers_) {
    q->set_observing(false);
    q->set_fake_quant(true);
    if (q->observer() && q->observer()->has_data()) {
      try {
        q->compute_qparams();
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    } else {
      empty.push_back(q->path());
    }
  }
  if (failed) std::rethrow_exception(failed);
  if (!empty.empty()) {
    std::string names;
    for (const auto& n : empty) names += (names.empty() ? "" : ", ") + n;
    throw Error("Calibration: these quantizers saw no finite data (was the model run inside the guard?): " + names);
  }
}

Calibration::~Calibration() {
  try {
    finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qforge: %s\n", e.what());
  }
}

QatController::QatController(torch::nn::Module& model, QatOptions options) : model_(model), options_(options) {}

void QatController::begin_epoch() {
  model_.train();
  for_each_quantizable(model_, [&](const std::string&, QuantizableLayer& layer) {
    for (Quantizer q : layer.quantizers())
      if (q->role() == QuantizerImpl::Role::kActivation) q->set_observing(true);
  });
  apply();
}

void QatController::step() {
  ++steps_;
  apply();
}

void QatController::apply() {
  const bool freeze_obs = options_.freeze_observers_after >= 0 && steps_ >= options_.freeze_observers_after;
  const bool freeze_bn = options_.freeze_bn_after >= 0 && steps_ >= options_.freeze_bn_after;
  if (freeze_obs) {
    for_each_quantizable(model_, [&](const std::string&, QuantizableLayer& layer) {
      for (Quantizer q : layer.quantizers()) q->freeze_observer();
    });
  }
  if (freeze_bn) {
    for (const auto& m : model_.modules()) {
      if (dynamic_cast<torch::nn::BatchNorm1dImpl*>(m.get()) || dynamic_cast<torch::nn::BatchNorm2dImpl*>(m.get()))
        m->eval();
    }
  }
}

void freeze(torch::nn::Module& model) {
  std::vector<QuantizableLayer*> layers;
  std::vector<std::string> missing;
  bool any_quantized = false;
  for_each_quantizable(model, [&](const std::string& path, QuantizableLayer& layer) {
    any_quantized |= layer.quantized();
    if (!layer.quantized() || layer.frozen()) return;
    for (const std::string& n : layer.uncalibrated()) missing.push_back(n);
    layers.push_back(&layer);
  });
  const auto rpq = nn::rpq_layers(model);
  if (!any_quantized && rpq.empty()) {
    const size_t plain = plain_libtorch_layers(model).size();
    throw Error("freeze: nothing to freeze: no layer of the model is quantized (run qforge::quantize first" +
                (plain ? "; its " + std::to_string(plain) + " LibTorch layer(s) have no quantizers, see qforge::nn::convert" : std::string()) +
                ")");
  }
  if (!missing.empty()) {
    std::string names;
    for (const auto& n : missing) names += (names.empty() ? "" : ", ") + n;
    throw Error("freeze: static activations were never calibrated (run forward passes inside qforge::Calibration "
                "or load a calibration dump): " + names);
  }
  // RPQ layers pack on the CPU only (their packed weight has no CUDA form): checked before anything changes.
  for (const auto& [path, l] : rpq)
    QF_REQUIRE(l->frozen() || l->codebooks().device().is_cpu(), "freeze: ", display_name(path), " (",
               l->layer_type(), ") is on ", l->codebooks().device(),
               "; frozen RPQ layers run on the CPU (move the model there before freeze(), or keep it unfrozen)");
  // Fake-quant weight caches (a float copy of every weight once a forward ran) are about to be
  // replaced by packed storage: drop them all first, so freezing peaks at the float model plus
  // one layer's packing, not at twice the float model.
  for (QuantizableLayer* layer : layers)
    if (layer->weight_quantizer()) layer->weight_quantizer()->clear_cache();
  for (QuantizableLayer* layer : layers) layer->freeze();
  for (const auto& [path, l] : rpq) l->freeze();
}

ModelSize model_size(const torch::nn::Module& model) {
  ModelSize out;
  // The root first, then named_modules() without it: the root may live on the stack.
  std::vector<std::pair<std::string, const torch::nn::Module*>> modules{{std::string(), &model}};
  for (const auto& item : model.named_modules("", /*include_self=*/false)) modules.emplace_back(item.key(), item.value().get());
  for (const auto& [path, module] : modules) {
    const torch::nn::Module& m = *module;
    if (dynamic_cast<const QuantizerImpl*>(&m)) continue;  // counted with their layer
    ModelSize::Layer l;
    l.name = display_name(path);
    if (const auto* layer = dynamic_cast<const QuantizableLayer*>(&m)) {
      l.bytes = layer->storage_bytes();
      l.kind = layer->frozen() ? "frozen" : (layer->quantized() ? "fake_quant" : "float");
    } else if (const auto* rpq = dynamic_cast<const nn::RPQLayer*>(&m)) {
      l.bytes = rpq->storage_bytes();
      l.kind = "rpq";
    } else {
      for (const auto& p : m.named_parameters(/*recurse=*/false)) l.bytes += p.value().nbytes();
      for (const auto& b : m.named_buffers(/*recurse=*/false)) l.bytes += b.value().nbytes();
      l.kind = "float";
    }
    if (l.bytes == 0) continue;
    (l.kind == "frozen" || l.kind == "rpq" ? out.quantized_bytes : out.float_bytes) += l.bytes;
    out.total_bytes += l.bytes;
    out.layers.push_back(std::move(l));
  }
  return out;
}

int64_t estimate_memory(int64_t num_params, const QType& qtype, int64_t group_size, int64_t channels, bool affine) {
  QF_REQUIRE(num_params >= 0, "estimate_memory: negative parameter count");
  // Codebook grids store their indices as nibbles (qkmeans4/3) or 2-bit fields (qkmeans2).
  const int64_t bits = qtype.is_codebook() ? codebook_storage_bits(qtype) : qtype.bits;
  const int64_t data = (num_params * bits + 7) / 8;
  int64_t scales = 0;
  if (group_size > 0) scales = (num_params + group_size - 1) / group_size;
  else if (channels > 0) scales = channels;
  else scales = 1;
  // A codebook holds 2^bits float16 levels where an integer grid holds one float32 scale.
  if (qtype.is_codebook()) return data + scales * qtype.levels() * 2;
  // Microscaling blocks: one scale byte each (E8M0 / E4M3), plus nvfp4's float32 tensor scale.
  if (qtype.is_microscaling()) return data + scales + (qtype == qnvfp4 ? 4 : 0);
  return data + scales * (4 + (affine ? 1 : 0));
}

std::shared_ptr<QuantizableLayer> frozen_copy(const QuantizableLayer& layer, const std::string& path,
                                              const LayerScheme& ls) {
  std::shared_ptr<QuantizableLayer> copy = layer.float_copy();
  if (!copy) return nullptr;
  copy->attach(path, ls);
  if (ls.weights && ls.weights->lsq) {
    // LSQ creates its learnable per-channel (per-group) step on the first training forward;
    // after QAT those parameters are part of the frozen layer's bytes.
    Quantizer wq = copy->weight_quantizer();
    at::Tensor w;
    for (const auto& p : copy->module().named_parameters(/*recurse=*/false))
      if (p.key() == "weight") w = p.value();
    wq->train();
    at::NoGradGuard no_grad;
    wq->forward(w);
    wq->eval();
  }
  for (Quantizer q : copy->quantizers())
    if (q->role() == QuantizerImpl::Role::kActivation && q->mode() == ActivationMode::kStatic)
      q->set_qparams(QParams{q->config().spec, at::ones({}, at::kFloat), at::zeros({}, at::kInt)});
  copy->freeze();
  return copy;
}

std::vector<LayerReport> layer_reports(const torch::nn::Module& model, bool planned) {
  std::vector<std::pair<std::string, LayerReport>> rows;  // (path, report)
  for_each_quantizable(model, [&](const std::string& path, const QuantizableLayer& layer) {
    LayerReport r = layer.report(planned);
    // A layer freeze() leaves without a packed weight (no quantized weight) keeps its fake-quant bytes.
    if (planned && layer.quantized() && !layer.frozen() && layer.scheme().weights)
      if (const auto frozen = frozen_copy(layer, path, layer.scheme())) r.bytes = frozen->storage_bytes();
    r.name = display_name(path);
    rows.emplace_back(path, std::move(r));
  });
  // RPQ layers: their own weight format, listed with the kernel a decode-sized call runs.
  bool extra = false;
  for (const auto& [path, rpq] : nn::rpq_layers(model)) {
    LayerReport r;
    r.name = display_name(path);
    r.type = rpq->layer_type();
    r.weights = detail::str_cat("rpq ", rpq->num_codebooks(), " codebooks x ", nn::kRpqCodebookSize, " x ",
                                rpq->codebook_dim(), " (uint8 indices", rpq->frozen() ? ", frozen)" : ")");
    r.activations = "float";
    r.kernel = rpq->kernel(1);
    if (r.kernel.rfind("rpq_expand", 0) == 0) r.fallback_reason = "the weight is expanded from the codebooks per call";
    r.bytes = rpq->storage_bytes();
    rows.emplace_back(path, std::move(r));
    extra = true;
  }
  for (const BatchNormAfterConv& b : batch_norms_after_convs(model)) {
    if (!b.conv->quantized()) continue;
    LayerReport r;
    r.name = b.path;
    r.type = b.one_d ? "torch::nn::BatchNorm1d" : "torch::nn::BatchNorm2d";
    r.weights = r.activations = r.kernel = "float";
    r.fallback_reason = batch_norm_reason(display_name(b.conv->path()), b.one_d);
    for (const auto& t : b.bn->named_parameters(/*recurse=*/false)) r.bytes += t.value().nbytes();
    for (const auto& t : b.bn->named_buffers(/*recurse=*/false)) r.bytes += t.value().nbytes();
    rows.emplace_back(b.path, std::move(r));
    extra = true;
  }
  const std::vector<PlainLayer> plain = plain_libtorch_layers(model);
  if (!plain.empty() || extra) {
    // LibTorch layers stay float; listed where they sit in the model.
    for (const PlainLayer& p : plain) {
      LayerReport r;
      r.name = display_name(p.path);
      r.type = "torch::nn::" + p.type;
      r.weights = r.activations = r.kernel = "float";
      r.fallback_reason = p.reason();
      for (const auto& param : p.module->named_parameters(/*recurse=*/false)) r.bytes += param.value().nbytes();
      rows.emplace_back(p.path, std::move(r));
    }
    std::map<std::string, size_t> order{{std::string(), 0}};
    for (const auto& item : model.named_modules("", /*include_self=*/false)) order.emplace(item.key(), order.size());
    std::stable_sort(rows.begin(), rows.end(),
                     [&](const auto& a, const auto& b) { return order.at(a.first) < order.at(b.first); });
  }
  std::vector<LayerReport> out;
  for (auto& [path, r] : rows) out.push_back(std::move(r));
  return out;
}

std::string describe(const torch::nn::Module& model, bool planned) {
  const auto reports = layer_reports(model, planned);
  // Columns as wide as their widest cell.
  size_t w_name = 5, w_type = 4, w_weights = 7, w_act = 11, w_kernel = 6;
  for (const LayerReport& r : reports) {
    w_name = std::max(w_name, r.name.size());
    w_type = std::max(w_type, r.type.size());
    w_weights = std::max(w_weights, r.weights.size());
    w_act = std::max(w_act, r.activations.size());
    w_kernel = std::max(w_kernel, r.kernel.size());
  }
  std::ostringstream os;
  auto row = [&](const std::string& name, const std::string& type, const std::string& weights, const std::string& act,
                 const std::string& kernel, const std::string& bytes, const std::string& fallback) {
    os << std::left << std::setw(static_cast<int>(w_name + 2)) << name << std::setw(static_cast<int>(w_type + 2)) << type
       << std::setw(static_cast<int>(w_weights + 2)) << weights << std::setw(static_cast<int>(w_act + 2)) << act
       << std::setw(static_cast<int>(w_kernel + 2)) << kernel << std::right << std::setw(10) << bytes << "  "
       << fallback << "\n";
  };
  row("layer", "type", "weights", "activations", "kernel", "bytes", "fallback");
  for (const LayerReport& r : reports)
    row(r.name, r.type, r.weights, r.activations, r.kernel, std::to_string(r.bytes),
        r.fallback_reason.empty() ? "-" : r.fallback_reason);
  os << describe_kv_cache(model);
  const ModelSize size = model_size(model);
  if (!planned) {
    os << "total " << size.total_bytes << " bytes (" << size.quantized_bytes << " frozen, " << size.float_bytes
       << " float)\n";
    return os.str();
  }
  // The quantized layers as freeze() will pack them, the rest of the model as it is.
  // The same layers on both sides: activation-only ones (LayerNorm, MatMul) included.
  int64_t quantized_now = 0, planned_bytes = 0;
  std::set<std::string> quantized_rows;
  for_each_quantizable(model, [&](const std::string& path, const QuantizableLayer& l) {
    if (!l.quantized() && !l.frozen()) return;
    quantized_now += l.storage_bytes();
    quantized_rows.insert(display_name(path));
  });
  for (const LayerReport& r : reports)
    if (quantized_rows.count(r.name)) planned_bytes += r.bytes;
  os << "total " << size.total_bytes - quantized_now + planned_bytes << " bytes once frozen (" << planned_bytes
     << " in quantized layers, " << size.total_bytes - quantized_now << " float)\n";
  return os.str();
}

}  // namespace qforge
