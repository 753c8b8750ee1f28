// Quantizer: observer + qparams + fake-quant of one quantization point.
#include "framework/api/quantizer.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "fake_quant/fake_quantize.h"
#include "fake_quant/lsq.h"
#include "fake_quant/microscaling.h"
#include "framework/core/enum_names.h"
#include "framework/core/error.h"
#include "framework/api/kmeans.h"
#include "kernels/cpu/quantize_rows_s8.h"

namespace qforge {

namespace {
constexpr NamedValue<ActivationMode> kActivationModeNames[] = {
    {ActivationMode::kNone, "none"},
    {ActivationMode::kStatic, "static"},
    {ActivationMode::kDynamicPerToken, "dynamic_per_token"},
    {ActivationMode::kNone, "float", true},
    {ActivationMode::kDynamicPerToken, "dynamic", true}};
}  // namespace

const char* to_string(ActivationMode m) { return name_of(kActivationModeNames, m); }
ActivationMode activation_mode_from_name(const std::string& name) {
  return value_of(kActivationModeNames, name, "activation mode");
}
std::vector<std::string> activation_mode_names() { return names_of(kActivationModeNames); }

at::Tensor broadcast_qparam(const at::Tensor& t, const at::Tensor& x, const QSpec& spec) {
  switch (spec.granularity) {
    case Granularity::kPerTensor: return t.reshape({});
    case Granularity::kPerChannel: {
      const int64_t axis = spec.axis < 0 ? spec.axis + x.dim() : spec.axis;
      std::vector<int64_t> shape(x.dim(), 1);
      shape[axis] = x.size(axis);
      return t.reshape(shape);
    }
    case Granularity::kPerGroup: {
      // x [..., K] is viewed as [..., G, g]; the qparam [..., G] becomes [..., G, 1].
      std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
      shape.push_back(1);
      return t.reshape(shape);
    }
  }
  return t;
}

at::Tensor round_scale_up_to_half(const at::Tensor& scale) {
  const at::Tensor s = scale.to(at::kFloat);
  QF_REQUIRE(at::logical_and(at::isfinite(s), s > 0).all().item<bool>() && s.max().item<float>() <= 65504.0f,
             "round_scale_up_to_half: scales must be positive and at most 65504 (float16's largest value)");
  at::Tensor h = s.to(at::kHalf);
  // Positive halves are ordered like their bit patterns: +1 is the next value up.
  const at::Tensor below = h.to(at::kFloat) < s;
  h = at::where(below, (h.view(at::kShort) + 1).view(at::kHalf), h);
  return h.to(at::kFloat);
}

at::Tensor grouped(const at::Tensor& x, const QSpec& spec) {
  if (spec.granularity != Granularity::kPerGroup) return x;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(x.size(-1) / spec.group_size);
  shape.push_back(spec.group_size);
  return x.reshape(shape);
}

namespace {
// Whether x's rows (dim 0) can be quantized apart: one qparam per row (per channel on axis 0, per
// group along the rows) or one for all (per tensor).
bool qparams_by_rows(const QParams& qp, const at::Tensor& x) {
  const QSpec& spec = qp.spec;
  if (spec.granularity == Granularity::kPerTensor) return true;
  if (spec.granularity == Granularity::kPerChannel && (spec.axis < 0 ? spec.axis + x.dim() : spec.axis) != 0)
    return false;
  const auto rows_of = [&](const at::Tensor& t) { return t.dim() >= 1 && t.size(0) == x.size(0); };
  return rows_of(qp.scale) && rows_of(qp.zero_point);
}
}  // namespace

at::Tensor quantize_to_int8(const at::Tensor& x_in, const QParams& qp) {
  QF_REQUIRE(qp.spec.qtype.is_integer() && qp.spec.qtype.bits <= 8,
             "quantize_to_int8: needs an integer grid of at most 8 bits, got ", qp.spec.qtype.name);
  QF_REQUIRE(qp.spec.qtype != quint8, "quantize_to_int8: quint8 values do not fit int8; use qint8");
  if (x_in.is_cpu() && qp.spec.granularity == Granularity::kPerTensor && qp.scale.numel() == 1 &&
      qp.zero_point.numel() == 1 &&
      (qp.zero_point.scalar_type() == at::kInt ? qp.zero_point_value() == 0 : qp.zero_point.item<double>() == 0.0)) {
    // Per-tensor, zero point 0 (the static inputs of the integer kernels): one pass of
    // kernels::quantize_static_s8, the same formula with inv = 1.0f / s (what at::reciprocal
    // computes) and the + 0 dropped. Output is contiguous in x's logical shape.
    const at::Tensor x = (x_in.scalar_type() == at::kFloat ? x_in : x_in.to(at::kFloat)).contiguous();
    at::Tensor q = at::empty(x.sizes(), at::TensorOptions(at::kChar));
    kernels::quantize_static_s8(x.data_ptr<float>(), x.numel(), 1.0f / qp.scale_value(),
                                static_cast<int>(qp.spec.quant_min()), static_cast<int>(qp.spec.quant_max()),
                                q.data_ptr<int8_t>());
    return q;
  }
  // Large tensors whose rows (dim 0) carry their own qparams, or share one, go a block of rows at
  // a time: the float temporary below is then a block's (about 4 MB), not the whole tensor's (an
  // embedding table's 94 to 2000 MB at freeze). Element for element the same operations.
  constexpr int64_t kBlockElements = int64_t{1} << 20;
  if (x_in.dim() >= 2 && x_in.size(0) > 1 && x_in.numel() > kBlockElements && qparams_by_rows(qp, x_in)) {
    at::Tensor out = at::empty(x_in.sizes(), x_in.options().dtype(at::kChar));
    const int64_t rows = x_in.size(0), block = std::max<int64_t>(1, kBlockElements / (x_in.numel() / rows));
    for (int64_t r = 0; r < rows; r += block) {
      const int64_t n = std::min(block, rows - r);
      QParams part = qp;
      if (qp.spec.granularity != Granularity::kPerTensor) {
        part.scale = qp.scale.narrow(0, r, n);
        part.zero_point = qp.zero_point.narrow(0, r, n);
      }
      out.narrow(0, r, n).copy_(quantize_to_int8(x_in.narrow(0, r, n), part));
    }
    return out;
  }
  const at::Tensor x = grouped(x_in.to(at::kFloat), qp.spec);
  const at::Tensor s = broadcast_qparam(qp.scale.to(at::kFloat), x_in, qp.spec);
  const at::Tensor z = broadcast_qparam(qp.zero_point.to(at::kFloat), x_in, qp.spec);
  // Same operations as the fake-quant kernels: float reciprocal, product, rint, + z, clamp; in
  // place on one float temporary (a block of rows' worth, not four tensors' worth).
  at::Tensor q = x * at::reciprocal(s);
  q.round_().add_(z).clamp_(qp.spec.quant_min(), qp.spec.quant_max());
  return q.to(at::kChar).reshape(x_in.sizes());
}

at::Tensor dequantize_int(const at::Tensor& q, const QParams& qp) {
  const at::Tensor g = grouped(q.to(at::kFloat), qp.spec);
  const at::Tensor s = broadcast_qparam(qp.scale.to(at::kFloat), q, qp.spec);
  const at::Tensor z = broadcast_qparam(qp.zero_point.to(at::kFloat), q, qp.spec);
  return ((g - z) * s).reshape(q.sizes());
}

QuantizerImpl::QuantizerImpl(Role role, QuantizerConfig config, ActivationMode mode, std::string path)
    : role_(role), config_(std::move(config)), mode_(mode), path_(std::move(path)) {
  QF_REQUIRE(!config_.spec.qtype.is_microscaling() || role_ == Role::kWeight, path_, ": ",
             config_.spec.qtype.name, " is a weight-only format in qforge (block scales follow the weight); quantize "
             "activations with qint8, quint8 or an fp8 qtype");
  config_.spec.validate();
  // LSQ activations calibrate too: their learnable step starts from the calibrated scale.
  if (role_ == Role::kActivation && mode_ == ActivationMode::kStatic)
    observer_ = make_observer(config_.observer, config_.observer_options);
  if (config_.spec.qtype.is_codebook()) {
    QF_REQUIRE(role_ == Role::kWeight, path_, ": ", config_.spec.qtype.name,
               " is a codebook qtype, for weights only (activations take qint8 or float8 grids)");
    QF_REQUIRE(!config_.lsq, path_, ": LSQ learns a scale; ", config_.spec.qtype.name,
               " weights learn their codebook levels instead (drop lsq)");
    // Empty until k-means fits it; trainable in QAT (straight-through in the weight).
    codebook_ = register_parameter("codebook", at::empty({0}, at::kFloat));
  } else if (config_.lsq) {
    QF_REQUIRE(config_.spec.qtype.is_integer(), path_, ": LSQ needs an integer grid, got ", config_.spec.qtype.name);
    QF_REQUIRE(role_ == Role::kWeight || config_.spec.granularity == Granularity::kPerTensor, path_,
               ": LSQ activations are per-tensor");
    // Learnable qparams are registered once their shape is known (first forward).
  } else {
    scale_ = register_buffer("scale", at::ones({}, at::kFloat));
    zero_point_ = register_buffer("zero_point", at::zeros({}, at::kInt));
  }
}

bool QuantizerImpl::dynamic_qtype_supported(const QType& qtype) {
  return qtype.is_integer() && qtype.is_signed && qtype.bits >= 2 && qtype.bits <= 8;
}

int QuantizerImpl::dynamic_qmax(const QType& qtype) {
  QF_REQUIRE(dynamic_qtype_supported(qtype), "dynamic per-token activations take a signed integer qtype (qint8, "
             "qint4, qint3, qint2), not ", qtype.name);
  return static_cast<int>(qtype.quant_max);  // narrow_range drops the lowest code only
}

QParams QuantizerImpl::dynamic_qparams(const at::Tensor& x2d, const QType& qtype, float clip_ratio) {
  // The kernels' dynamic activation formula: scale = amax / 127 (1 when the row is all zero),
  // grid [-127, 127] (kernels/cpu/reference.h quantize_rows_s8_reference); narrower signed grids
  // (W4A4's qint4: amax / 7 on [-7, 7]) follow the same rule with their own qmax.
  const float qmax = static_cast<float>(dynamic_qmax(qtype));
  QSpec spec;
  spec.qtype = qtype;
  spec.symmetric = true;
  spec.narrow_range = true;
  spec.granularity = Granularity::kPerChannel;
  spec.axis = 0;
  // Divided on the CPU: LibTorch's CUDA division by a scalar multiplies by its reciprocal, which
  // can be one ulp off (framework/core/qparams.cpp); the fake-quant kernels read qparams on the host.
  QF_REQUIRE(clip_ratio > 0.0f && clip_ratio <= 1.0f, "dynamic per-token activations: clip_ratio must be in (0, 1], "
             "got ", clip_ratio);
  at::Tensor amax = x2d.detach().to(at::kFloat).abs().amax(1).to(at::kCPU);
  const at::Tensor range = clip_ratio == 1.0f ? amax : amax * clip_ratio;
  const at::Tensor scale = at::where(range > 0, range / qmax, at::ones_like(amax));
  return QParams{spec, scale, at::zeros(amax.sizes(), at::kInt)};
}

void QuantizerImpl::init_lsq(const at::Tensor& x) {
  const QSpec& spec = config_.spec;
  at::Tensor s, z;
  if (role_ == Role::kActivation && calibrated_) {
    s = scale_.detach().reshape({1}).clone();
    z = zero_point_.detach().to(at::kFloat).reshape({1}).clone();
  } else if (role_ == Role::kActivation) {
    // LSQ's initial step; zero at the bottom of unsigned grids (non-negative activations).
    s = lsq_init_scale(x, spec.quant_max());
    z = at::full({1}, spec.qtype.is_signed ? 0.0f : static_cast<float>(spec.quant_min()));
  } else {
    // Weights start from their min/max qparams, which LSQ then refines.
    const QParams qp = weight_grid(x);
    s = qp.scale.to(at::kFloat).clone();
    z = qp.zero_point.to(at::kFloat).clone();
    if (s.dim() == 0) {
      s = s.reshape({1});
      z = z.reshape({1});
    }
  }
  // Under LSQ the same names hold learnable parameters instead of buffers.
  scale_ = register_parameter("scale", s.clamp_min(kScaleEps));
  zero_point_ = register_parameter("zero_point", z, /*requires_grad=*/!spec.symmetric);
  lsq_initialised_ = true;
}

at::Tensor QuantizerImpl::lsq_forward(const at::Tensor& x) {
  if (!lsq_initialised_) init_lsq(x);
  const QSpec& spec = config_.spec;
  // Keep the step positive, as PyTorch's _LearnableFakeQuantize clamps scale.data.
  { at::NoGradGuard g; scale_.clamp_min_(kScaleEps); }
  const int64_t qmin = spec.quant_min(), qmax = spec.quant_max();
  if (spec.granularity == Granularity::kPerTensor) {
    const double gf = lsq_grad_factor(x.numel(), qmax);
    return fake_quantize_learnable_per_tensor_affine(x, scale_.reshape({1}), zero_point_.reshape({1}), qmin, qmax, gf);
  }
  if (spec.granularity == Granularity::kPerChannel) {
    const int64_t axis = spec.axis < 0 ? spec.axis + x.dim() : spec.axis;
    const double gf = lsq_grad_factor(x.numel() / x.size(axis), qmax);
    return fake_quantize_learnable_per_channel_affine(x, scale_.reshape({-1}), zero_point_.reshape({-1}), axis,
                                                      qmin, qmax, gf);
  }
  // Per-group: rows of group_size elements are the channels.
  const at::Tensor rows = x.reshape({-1, spec.group_size});
  const double gf = lsq_grad_factor(spec.group_size, qmax);
  return fake_quantize_learnable_per_channel_affine(rows, scale_.reshape({-1}), zero_point_.reshape({-1}), 0, qmin,
                                                    qmax, gf)
      .reshape(x.sizes());
}

QParams QuantizerImpl::qparams(const at::Tensor& weight) const {
  const QSpec& spec = config_.spec;
  if (config_.lsq && lsq_initialised_) {
    at::Tensor s = scale_.detach().to(at::kFloat).clone(), z;
    if (role_ == Role::kWeight && spec.granularity == Granularity::kPerTensor) s = s.reshape({});
    if (spec.granularity == Granularity::kPerChannel) s = s.reshape({-1});
    const at::Tensor zf = zero_point_.detach().to(at::kFloat);
    z = at::clamp(at::round(zf), spec.quant_min(), spec.quant_max()).to(at::kInt).reshape(s.sizes());
    if (role_ == Role::kActivation) {
      s = s.reshape({});
      z = z.reshape({});
    }
    // Evaluation and freeze use the float16 step the packed int4 layout stores.
    if (role_ == Role::kWeight && nibble_packed(spec.qtype)) s = round_scale_up_to_half(s);
    return QParams{spec, s, z};
  }
  if (role_ == Role::kWeight && spec.qtype.is_codebook()) {
    // Evaluation and freeze use the float16 levels the packed format stores (round to nearest).
    if (codebook_.numel() > 0) return QParams{spec, {}, {}, codebook_.detach().to(at::kHalf).to(at::kFloat)};
    QF_REQUIRE(weight.defined(), path_, ": codebook qparams need the weight (k-means on it)");
    return QParams{spec, {}, {}, codebook_levels(weight, {}, spec, path_)};
  }
  if (role_ == Role::kWeight) return weight_grid(weight);
  QF_REQUIRE(mode_ == ActivationMode::kStatic, path_, ": dynamic activations have per-call qparams");
  QF_REQUIRE(calibrated_, path_,
             ": the static activation quantizer was never calibrated; run forward passes inside "
             "qforge::Calibration (or load a calibration dump) first");
  return QParams{spec, scale_.detach(), zero_point_.detach()};
}

QParams weight_minmax_qparams(const at::Tensor& weight, const QSpec& spec, const std::string& who) {
  QF_REQUIRE(weight.defined(), who, ": weight qparams need the weight");
  // Microscaling scales are the format's function of each block's values, recomputed with the weight.
  if (spec.qtype.is_microscaling()) {
    try {
      return microscaling_qparams(weight, spec);  // refuses NaN / inf, naming the first
    } catch (const Error& e) {
      throw Error(who + ": " + e.what());
    }
  }
  const at::Tensor w = weight.detach().to(at::kFloat);
  at::Tensor mn, mx;
  switch (spec.granularity) {
    case Granularity::kPerTensor: mn = w.min(); mx = w.max(); break;
    case Granularity::kPerChannel: {
      const int64_t axis = spec.axis < 0 ? spec.axis + w.dim() : spec.axis;
      const at::Tensor rows = w.movedim(axis, 0).reshape({w.size(axis), -1});
      mn = std::get<0>(rows.min(1));
      mx = std::get<0>(rows.max(1));
      break;
    }
    case Granularity::kPerGroup: {
      const at::Tensor g = grouped(w, spec);
      mn = std::get<0>(g.min(-1));
      mx = std::get<0>(g.max(-1));
      break;
    }
  }
  QF_REQUIRE(at::isfinite(mn).all().item<bool>() && at::isfinite(mx).all().item<bool>(), who,
             ": weight holds NaN or inf; cannot quantize it");
  QParams qp = calculate_qparams(mn, mx, spec);
  if (nibble_packed(spec.qtype)) qp.scale = round_scale_up_to_half(qp.scale);
  return qp;
}

QParams QuantizerImpl::weight_grid(const at::Tensor& weight) const {
  if (calibrated_) return QParams{config_.spec, scale_.detach(), zero_point_.detach()};  // a fixed grid
  return qforge::weight_minmax_qparams(weight, config_.spec, path_);
}

void QuantizerImpl::compute_qparams() {
  QF_REQUIRE(observer_, path_, ": no observer to compute qparams from");
  QF_REQUIRE(observer_->has_data(), path_, ": the observer saw no finite values during calibration");
  set_qparams(observer_->qparams(config_.spec));
}

namespace {
// w (or an importance of w's shape) as the rows k-means clusters: one row per codebook.
at::Tensor codebook_rows(const at::Tensor& w, const QSpec& spec) {
  switch (spec.granularity) {
    case Granularity::kPerTensor: return w.reshape({1, -1});
    case Granularity::kPerChannel: {
      const int64_t axis = spec.axis < 0 ? spec.axis + w.dim() : spec.axis;
      return w.movedim(axis, 0).reshape({w.size(axis), -1});
    }
    case Granularity::kPerGroup: return w.reshape({-1, spec.group_size});
  }
  return w;
}
}  // namespace

at::Tensor codebook_levels(const at::Tensor& w_in, const at::Tensor& importance, const QSpec& spec,
                           const std::string& who) {
  QF_REQUIRE(spec.qtype.is_codebook(), who, ": codebook levels for a ", spec.qtype.name, " weight");
  QF_REQUIRE(w_in.defined() && w_in.dim() >= 1 && w_in.numel() > 0, who, ": fit_codebook needs a non-empty weight");
  const at::Tensor w = w_in.detach().to(at::kCPU, at::kFloat).contiguous();
  QF_REQUIRE(at::isfinite(w).all().item<bool>(), who, ": weight holds NaN or inf; cannot fit its codebook");
  const std::vector<int64_t> shape = codebook_shape(spec, w.sizes());
  at::Tensor imp;
  if (importance.defined()) {
    const int64_t per_channel = w.numel() / w.size(0);
    QF_REQUIRE(importance.numel() == per_channel, who, ": codebook importance has ", importance.numel(),
               " values; one output channel of the weight ", w.sizes(), " has ", per_channel);
    std::vector<int64_t> one(w.sizes().begin(), w.sizes().end());
    one[0] = 1;
    imp = codebook_rows(importance.detach().to(at::kCPU, at::kFloat).reshape(one).expand(w.sizes()).contiguous(), spec);
    // Rows whose inputs never carried energy fall back to equal weights.
    const at::Tensor dead = imp.sum(1, true) <= 0;
    imp = at::where(dead, at::ones_like(imp), imp);
  }
  KMeansOptions opts;
  opts.iterations = 50;
  const at::Tensor levels = kmeans_1d(codebook_rows(w, spec), spec.qtype.levels(), imp, opts);
  const at::Tensor half = levels.to(at::kHalf).to(at::kFloat);
  QF_REQUIRE(at::isfinite(half).all().item<bool>(), who, ": a codebook level exceeds float16's range (65504)");
  return half.reshape(shape);
}

void QuantizerImpl::fit_codebook(const at::Tensor& w, const at::Tensor& importance) {
  set_codebook(codebook_levels(w, importance, config_.spec, path_));
}

void QuantizerImpl::set_codebook(const at::Tensor& levels) {
  QF_REQUIRE(config_.spec.qtype.is_codebook(), path_, ": set_codebook on a ", config_.spec.qtype.name, " quantizer");
  const at::Tensor c = levels.detach().to(at::kCPU, at::kFloat).contiguous();
  QF_REQUIRE(c.dim() >= 1 && c.size(-1) == config_.spec.qtype.levels(), path_, ": a ", config_.spec.qtype.name,
             " codebook has ", config_.spec.qtype.levels(), " levels per row, got shape ", c.sizes());
  QF_REQUIRE(at::isfinite(c).all().item<bool>() && at::equal(c.to(at::kHalf).to(at::kFloat), c), path_,
             ": codebook levels must be finite float16 values");
  {
    at::NoGradGuard g;
    codebook_.set_data(c.to(codebook_.device()).clone());
  }
  calibrated_ = true;
  clear_cache();
}

void QuantizerImpl::set_qparams(const QParams& qp) {
  if (config_.spec.qtype.is_codebook()) {
    QF_REQUIRE(same_spec(qp.spec, config_.spec) && qp.codebook.defined(), path_, ": set_qparams with ",
               qp.spec.to_string(), " on a weight quantized as ", config_.spec.to_string());
    set_codebook(qp.codebook);
    return;
  }
  QF_REQUIRE(!config_.spec.qtype.is_microscaling(), path_, ": ", config_.spec.qtype.name,
             " block scales follow the weight's values; there is no fixed grid to set");
  QF_REQUIRE(!config_.lsq || !lsq_initialised_, path_, ": set_qparams on an LSQ quantizer that already trains");
  // Activations hold one scale, or one per channel (per-head attention operands: a 1-D [C]); a
  // weight's fixed grid keeps its per-channel / per-group shape.
  const bool weight = role_ == Role::kWeight;
  const bool channels = !weight && config_.spec.granularity == Granularity::kPerChannel;
  if (weight) {
    QF_REQUIRE(same_spec(qp.spec, config_.spec), path_, ": set_qparams with ", qp.spec.to_string(),
               " on a weight quantized as ", config_.spec.to_string());
  }
  if (channels) {
    QF_REQUIRE(qp.scale.defined() && qp.zero_point.defined() && qp.scale.dim() <= 1 && qp.scale.numel() >= 1 &&
                   qp.zero_point.numel() == qp.scale.numel(),
               path_, ": set_qparams: per-channel activations take one scale and zero point per channel (1-D), got ",
               qp.scale.defined() ? qp.scale.sizes() : at::IntArrayRef{}, " and ",
               qp.zero_point.defined() ? qp.zero_point.sizes() : at::IntArrayRef{});
  }
  const at::Tensor s = weight     ? qp.scale.to(at::kFloat).contiguous()
                       : channels ? qp.scale.to(at::kFloat).reshape({-1})
                                  : qp.scale.to(at::kFloat).reshape({});
  const at::Tensor z = weight     ? qp.zero_point.to(at::kInt).contiguous()
                       : channels ? qp.zero_point.to(at::kInt).reshape({-1})
                                  : qp.zero_point.to(at::kInt).reshape({});
  if (config_.lsq) {
    // LSQ starts from these values at its first training step, when "scale" and "zero_point"
    // become learnable parameters; until then they are plain members.
    scale_ = s.clone();
    zero_point_ = z.clone();
  } else {
    scale_.set_data(s.clone());
    zero_point_.set_data(z.clone());
  }
  calibrated_ = true;
  clear_cache();  // a weight's cached fake-quant followed the old grid
}

void QuantizerImpl::drop_fixed_grid() {
  if (role_ != Role::kWeight || config_.lsq || config_.spec.qtype.is_codebook() || !calibrated_) return;
  scale_.set_data(at::ones({}, scale_.options()));
  zero_point_.set_data(at::zeros({}, zero_point_.options()));
  calibrated_ = false;
  clear_cache();
}

at::Tensor QuantizerImpl::weight_forward(const at::Tensor& w) {
  if (!fake_quant_) return w;
  if (config_.spec.qtype.is_codebook()) {
    // The first fake-quantized forward fits the codebook (k-means on the weight); training then
    // learns the float levels, evaluation uses their float16 values.
    if (codebook_.numel() == 0) fit_codebook(w);
    if (is_training()) return fake_quantize(w, QParams{config_.spec, {}, {}, codebook_.to(w.device())});
  }
  if (config_.lsq && is_training()) return lsq_forward(w);
  if (config_.lsq && lsq_initialised_) return fake_quantize(w, qparams());
  // In eval the fake-quantized weight is reused until the weight changes (unless the cache is off).
  const bool no_grad = !w.requires_grad() || !at::GradMode::is_enabled();
  if (weight_cache() && !is_training() && no_grad) {
    // Codebook levels train too: their version is part of the key.
    const int64_t cb_version = codebook_.defined() ? static_cast<int64_t>(codebook_._version()) : 0;
    if (cached_wq_.defined() && cached_w_.is_same(w) &&
        cached_storage_.unsafeGetStorageImpl() == w.storage().unsafeGetStorageImpl() &&
        cached_offset_ == w.storage_offset() &&
        cached_version_ == static_cast<int64_t>(w._version()) && cached_cb_version_ == cb_version)
      return cached_wq_;
    cached_cb_version_ = cb_version;
    cached_wq_ = fake_quantize(w.detach(), qparams(w));
    cached_w_ = w;
    cached_storage_ = w.storage();
    cached_offset_ = w.storage_offset();
    cached_version_ = static_cast<int64_t>(w._version());
    return cached_wq_;
  }
  return fake_quantize(w, qparams(w));
}

at::Tensor QuantizerImpl::weight_rows(const at::Tensor& w, const at::Tensor& index) {
  const QSpec& spec = config_.spec;
  // Indices the whole-table path would refuse (floating, on another device) are left to it.
  const bool integer_index = index.scalar_type() == at::kLong || index.scalar_type() == at::kInt;
  if (role_ != Role::kWeight || !fake_quant_ || weight_cache() || is_training() || config_.lsq ||
      spec.qtype.is_codebook() || spec.qtype.is_microscaling() || w.dim() != 2 ||
      (w.requires_grad() && at::GradMode::is_enabled()) || !integer_index || index.device() != w.device())
    return {};
  QParams qp = weight_grid(w);
  if (!qparams_by_rows(qp, w)) return {};
  const at::Tensor idx = index.reshape({-1}).to(at::kLong);
  if (spec.granularity != Granularity::kPerTensor) {
    qp.scale = qp.scale.index_select(0, idx.to(qp.scale.device()));
    qp.zero_point = qp.zero_point.index_select(0, idx.to(qp.zero_point.device()));
  }
  return fake_quantize(w.detach().index_select(0, idx), qp);
}

at::Tensor QuantizerImpl::activation_forward(const at::Tensor& x) {
  if (mode_ == ActivationMode::kNone) return x;
  if (mode_ == ActivationMode::kDynamicPerToken) {
    if (!fake_quant_ || x.numel() == 0) return x;
    const at::Tensor x2d = x.reshape({-1, x.size(-1)});
    return fake_quantize(x2d, dynamic_qparams(x2d, config_.spec.qtype, config_.clip_ratio)).reshape(x.sizes());
  }
  const bool update = observer_ && observing_ && !observer_frozen_;
  if (update) {
    try {
      observer_->update(x.detach());
    } catch (const Error& e) {
      throw Error(path_ + " (" + observer_->kind() + " observer): " + e.what());
    }
  }
  if (!fake_quant_) return x;
  // LSQ trains from its first training step on; before that (PTQ evaluation) the calibrated
  // static qparams apply.
  if (config_.lsq && (is_training() || lsq_initialised_)) return lsq_forward(x);
  // While QAT observes, min/max observers give fresh qparams every step (PyTorch FakeQuantize);
  // histogram observers keep their calibrated qparams (a search per step would dominate).
  if (update && is_training() && observer_->kind().find("histogram") == std::string::npos) compute_qparams();
  return fake_quantize(x, qparams());
}

void QuantizerImpl::train(bool on) {
  clear_cache();
  torch::nn::Module::train(on);
}

at::Tensor QuantizerImpl::forward(const at::Tensor& x) {
  return role_ == Role::kWeight ? weight_forward(x) : activation_forward(x);
}

void QuantizerImpl::save(torch::serialize::OutputArchive&) const {
  throw Error("torch::save: '" + path_ + "' is a qforge quantizer, which LibTorch's archive cannot hold (the model "
              "would load back float, or not at all once frozen): save quantized and frozen models with "
              "qforge::io::save_model(model, path) and load them with qforge::io::load_model");
}

}  // namespace qforge
