// Loading, the restored state: frozen (packed) weights and quantizer states, read and checked
// into scratch objects before load_model changes anything (model_loader.h).
#include <ATen/ATen.h>

#include <set>

#include "framework/core/error.h"
#include "framework/io/model_loader.h"
#include "framework/io/quantizer_attrs.h"

namespace qforge::io::model_load {

using namespace model_file;

std::vector<std::pair<std::string, at::Tensor>> own_tensors(const torch::nn::Module& m, bool buffers) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  const auto d = buffers ? m.named_buffers(false) : m.named_parameters(false);
  for (const auto& item : d) out.emplace_back(item.key(), item.value());
  return out;
}

void Loader::consume_quantizer_entries(const std::string& path) {
  for (const auto& q : {"weight_quantizer", "input_quantizer", "output_quantizer", "other_quantizer"}) {
    ReadOptions ro;
    ro.prefix = join(path, q);
    for (const EntryInfo& e : reader_.entries(ro)) consumed_.insert({e.section, e.key});
  }
}

QuantizedTensor Loader::build_frozen(const std::string& path, const LayerMeta& m, const at::Tensor& target) {
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
    if (spec.qtype.is_microscaling()) {
      try {
        QParams qp = q.qparams();  // block scales decoded from the file's scale bytes
        qp.spec = spec;
        fw = make_quantized(qp, e.shape, fw.data);
        (void)fw.dequantize();
      } catch (const Error& err) {
        throw Error(w + ": " + err.what());
      }
      return fw;
    }
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

Quantizer Loader::build_point(const std::string& path, const std::string& point, const PointMeta& pm,
                              ActivationMode mode, const std::vector<int64_t>& weight_shape, PointPlan& plan,
                              const Quantizer& existing) {
  plan.point = point;
  plan.role = pm.role;
  plan.config = pm.config;
  const std::string qprefix = join(path, child_of(point));
  Quantizer q = scratch_quantizer(path, point, pm, mode);
  at::NoGradGuard no_grad;
  restore_fixed_grid(qprefix, pm, mode, weight_shape, plan, q);
  restore_codebook(qprefix, pm, weight_shape, plan, q);
  const std::string skey = join(qprefix, "scale");
  if (pm.config.lsq && reader_.contains(skey, Section::kParameters)) init_scratch_lsq(path, pm, weight_shape, plan, q);
  // The tensors the loaded quantizer will hold: the scratch quantizer's, or those of an existing
  // LSQ quantizer that already trains (left as it is apart from the copies). An existing
  // quantizer that would hold more than the file gives is missing state.
  const bool keep_existing = existing && lsq_initialised(*existing);
  const torch::nn::Module& ref = keep_existing ? static_cast<const torch::nn::Module&>(*existing)
                                               : static_cast<const torch::nn::Module&>(*q);
  const std::set<std::string> names = read_point_tensors(qprefix, pm, ref, keep_existing, plan);
  if (existing && !keep_existing) check_existing_state(qprefix, existing, names);
  if (keep_existing && pm.config.lsq && !reader_.contains(skey, Section::kParameters)) {
    QF_REQUIRE(!opts_.strict, where(Section::kParameters, skey),
               ": missing; the model's LSQ quantizer already trains but the checkpoint has no learned scale");
  }
  consume_quantizer_entries(path);
  return q;
}

Quantizer Loader::scratch_quantizer(const std::string& path, const std::string& point, const PointMeta& pm,
                                    ActivationMode mode) {
  try {
    return Quantizer(pm.role, pm.config, pm.role == QuantizerImpl::Role::kWeight ? ActivationMode::kNone : mode,
                     join(path, point));
  } catch (const Error& err) {
    throw Error(layer_where(path) + ": point '" + point + "': " + err.what());
  }
}

// Calibrated static activations, and weights whose grid a PTQ solver fixed.
void Loader::restore_fixed_grid(const std::string& qprefix, const PointMeta& pm, ActivationMode mode,
                                const std::vector<int64_t>& weight_shape, PointPlan& plan, Quantizer& q) {
  const std::string skey = join(qprefix, "scale"), zkey = join(qprefix, "zero_point");
  const bool fixed = pm.role == QuantizerImpl::Role::kWeight || mode == ActivationMode::kStatic;
  if (!(fixed && pm.calibrated && !pm.config.lsq && reader_.contains(skey, Section::kBuffers))) return;
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

// A fitted codebook: its levels fix the scratch quantizer's parameter shape before the tensors are copied.
void Loader::restore_codebook(const std::string& qprefix, const PointMeta& pm,
                              const std::vector<int64_t>& weight_shape, PointPlan& plan, Quantizer& q) {
  const std::string ckey = join(qprefix, "codebook");
  if (!pm.config.spec.qtype.is_codebook() || !reader_.contains(ckey, Section::kParameters)) return;
  const at::Tensor c = reader_.read_tensor(ckey, Section::kParameters);
  try {
    QF_REQUIRE(!weight_shape.empty(), "a codebook without a weight");
    plan.qparams = make_codebook_qparams(pm.config.spec, c.to(at::kFloat), weight_shape);
  } catch (const Error& err) {
    throw Error(where(Section::kParameters, ckey) + ": " + err.what());
  }
  q->set_codebook(plan.qparams.codebook);
}

// A saved LSQ scale: the scratch quantizer runs its initialisation pass so its parameters exist.
void Loader::init_scratch_lsq(const std::string& path, const PointMeta& pm, const std::vector<int64_t>& weight_shape,
                              PointPlan& plan, Quantizer& q) {
  plan.init_lsq = true;
  plan.init_shape = pm.role == QuantizerImpl::Role::kWeight ? weight_shape : std::vector<int64_t>{1};
  QF_REQUIRE(!plan.init_shape.empty() || pm.role != QuantizerImpl::Role::kWeight, layer_where(path),
             ": LSQ weight quantizer without a weight");
  q->train(true);
  q->forward(at::zeros(plan.init_shape));
  q->train(false);
}

// Reads the file's tensor for each tensor `ref` holds ("p:" / "b:" tagged names), copying them into
// the scratch quantizer unless an existing one is kept; returns the tags `ref` holds.
std::set<std::string> Loader::read_point_tensors(const std::string& qprefix, const PointMeta& pm,
                                                 const torch::nn::Module& ref, bool keep_existing, PointPlan& plan) {
  std::set<std::string> names;
  for (bool buffers : {false, true}) {
    const Section s = buffers ? Section::kBuffers : Section::kParameters;
    for (const auto& [name, t] : own_tensors(ref, buffers)) {
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
  return names;
}

// State the model's quantizer holds beyond what the file gives: refused (strict) or reported missing.
void Loader::check_existing_state(const std::string& qprefix, const Quantizer& existing,
                                  const std::set<std::string>& names) {
  for (bool buffers : {false, true}) {
    for (const auto& [name, t] : own_tensors(*existing, buffers)) {
      const std::string tag = std::string(buffers ? "b:" : "p:") + name;
      if (names.count(tag)) continue;
      const std::string key = join(qprefix, name);
      QF_REQUIRE(!opts_.strict, where(buffers ? Section::kBuffers : Section::kParameters, key),
                 ": missing; the model's quantizer holds '", key, "' (state the checkpoint lacks)");
      report_.missing_keys.push_back(key);
    }
  }
}

}  // namespace qforge::io::model_load
