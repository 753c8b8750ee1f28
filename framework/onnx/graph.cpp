// The ONNX graph builder and the QDQ form of each qforge layer (docs/onnx.md, "Layers").
#include "framework/onnx/graph.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "framework/core/error.h"
#include "framework/nn/twin.h"

namespace qforge::onnx_export {

namespace {

int32_t onnx_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return onnx::TensorProto::FLOAT;
    case at::kChar: return onnx::TensorProto::INT8;
    case at::kByte: return onnx::TensorProto::UINT8;
    case at::kInt: return onnx::TensorProto::INT32;
    case at::kLong: return onnx::TensorProto::INT64;
    case at::kBool: return onnx::TensorProto::BOOL;
    default: throw Error(detail::str_cat("onnx export: no ONNX element type for ", t));
  }
}

void fill_tensor(onnx::TensorProto* p, const std::string& name, const at::Tensor& t_in) {
  const at::Tensor t = t_in.detach().cpu().contiguous();
  p->set_name(name);
  p->set_data_type(onnx_type(t.scalar_type()));
  for (int64_t d : t.sizes()) p->add_dims(d);
  // raw_data is little-endian, as this machine's memory is.
  p->set_raw_data(std::string(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size()));
}

void set_value_info(onnx::ValueInfoProto* v, const std::string& name, int32_t elem, const std::vector<Graph::Dim>& dims) {
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem);
  auto* shape = tt->mutable_shape();
  for (const auto& d : dims) {
    auto* dim = shape->add_dim();
    if (const auto* n = std::get_if<int64_t>(&d)) dim->set_dim_value(*n);
    else dim->set_dim_param(std::get<std::string>(d));
  }
}

}  // namespace

Graph::Graph(const std::string& name) {
  model_.set_ir_version(8);  // the IR of opset 17
  model_.set_producer_name("qforge");
  model_.set_producer_version("0.1.0");
  auto* op = model_.add_opset_import();
  op->set_domain("");
  op->set_version(kOpset);
  graph_ = model_.mutable_graph();
  graph_->set_name(name);
}

std::string Graph::unique(const std::string& hint) {
  const int n = used_[hint]++;
  return n == 0 ? hint : hint + "_" + std::to_string(n);
}

std::string Graph::input(const std::string& name, int32_t elem, const std::vector<Dim>& dims) {
  const std::string n = unique(name);
  set_value_info(graph_->add_input(), n, elem, dims);
  return n;
}

void Graph::output(const std::string& value, int32_t elem, const std::vector<Dim>& dims) {
  set_value_info(graph_->add_output(), value, elem, dims);
}

std::string Graph::initializer(const std::string& name, const at::Tensor& t) {
  const std::string n = unique(name);
  fill_tensor(graph_->add_initializer(), n, t);
  init_bytes_ += t.numel() * t.element_size();
  return n;
}

std::string Graph::scalar_f32(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const std::string key = "f32:" + std::to_string(bits);
  auto it = constants_.find(key);
  if (it != constants_.end()) return it->second;
  return constants_[key] = initializer("const_f32", at::full({}, v, at::kFloat));
}

std::string Graph::ints(const std::vector<int64_t>& v) {
  std::string key = "i64:";
  for (int64_t x : v) key += std::to_string(x) + ",";
  auto it = constants_.find(key);
  if (it != constants_.end()) return it->second;
  return constants_[key] = initializer("const_i64", at::tensor(v, at::kLong));
}

std::vector<std::string> Graph::node_n(const std::string& op, const std::vector<std::string>& inputs,
                                       const std::string& hint, int outputs, const Attrs& attrs) {
  auto* n = graph_->add_node();
  n->set_op_type(op);
  n->set_name(unique("node/" + hint));
  for (const auto& i : inputs) n->add_input(i);
  std::vector<std::string> outs;
  for (int i = 0; i < outputs; ++i) {
    outs.push_back(unique(hint));
    n->add_output(outs.back());
  }
  for (const auto& [name, value] : attrs) {
    auto* a = n->add_attribute();
    a->set_name(name);
    if (const auto* i = std::get_if<int64_t>(&value)) {
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(*i);
    } else if (const auto* f = std::get_if<float>(&value)) {
      a->set_type(onnx::AttributeProto::FLOAT);
      a->set_f(*f);
    } else if (const auto* v = std::get_if<std::vector<int64_t>>(&value)) {
      a->set_type(onnx::AttributeProto::INTS);
      for (int64_t x : *v) a->add_ints(x);
    } else if (const auto* s = std::get_if<std::string>(&value)) {
      a->set_type(onnx::AttributeProto::STRING);
      a->set_s(*s);
    } else {
      a->set_type(onnx::AttributeProto::TENSOR);
      fill_tensor(a->mutable_t(), name, std::get<at::Tensor>(value));
    }
  }
  return outs;
}

std::string Graph::node(const std::string& op, const std::vector<std::string>& inputs, const std::string& hint,
                        const Attrs& attrs) {
  return node_n(op, inputs, hint, 1, attrs)[0];
}

int64_t Graph::count(const std::string& op) const {
  int64_t n = 0;
  for (const auto& node : graph_->node()) n += node.op_type() == op;
  return n;
}

onnx::ModelProto Graph::finish() { return std::move(model_); }

namespace {

// Ops between a layer and the next activation QuantizeLinear through which that per-tensor
// rounding r(y) = s * (clamp(round(y / s) + z) - z) commutes: r is monotone, maps 0 to 0 (an
// integer zero point), and these ops only move, select (max) or clamp values.
bool commutes_with_rounding(const onnx::NodeProto& n) {
  static const std::set<std::string> ops{"Relu", "MaxPool", "Flatten", "Reshape", "Transpose", "Identity", "Clip"};
  return ops.count(n.op_type()) > 0;
}

}  // namespace

int64_t Graph::requantize_layer_outputs() {
  std::map<std::string, int> producer;  // value -> node index
  std::map<std::string, int> consumers;
  std::set<std::string> initializers, outputs, scalars;
  for (const auto& i : graph_->initializer()) {
    initializers.insert(i.name());
    if (i.dims_size() == 0) scalars.insert(i.name());
  }
  for (const auto& o : graph_->output()) outputs.insert(o.name());  // never rounded: a caller reads them
  for (int i = 0; i < graph_->node_size(); ++i) {
    for (const auto& o : graph_->node(i).output()) producer[o] = i;
    for (const auto& x : graph_->node(i).input()) ++consumers[x];
  }
  std::map<int, onnx::NodeProto> after;  // layer node index -> the QuantizeLinear to copy after it
  for (const auto& q : graph_->node()) {
    // Static per-tensor activations only: scale and zero point are scalar initializers.
    if (q.op_type() != "QuantizeLinear" || q.input_size() < 3 || !scalars.count(q.input(1)) || !scalars.count(q.input(2)))
      continue;
    std::string x = q.input(0);
    while (producer.count(x) && commutes_with_rounding(graph_->node(producer[x])) && consumers[x] == 1 && !outputs.count(x)) {
      const auto& n = graph_->node(producer[x]);
      if (n.op_type() == "Clip" && (n.input_size() < 3 || !initializers.count(n.input(1)) || !initializers.count(n.input(2))))
        break;
      x = n.input(0);
    }
    // Q right after the layer already, or the layer's output read elsewhere too.
    if (x == q.input(0) || !producer.count(x) || consumers[x] != 1 || outputs.count(x)) continue;
    const int p = producer[x];
    const auto& layer = graph_->node(p);
    const bool linear_out = layer.op_type() == "Add" && producer.count(layer.input(0)) &&
                            graph_->node(producer[layer.input(0)]).op_type() == "MatMul";
    if (layer.op_type() != "Conv" && !linear_out) continue;
    after.emplace(p, q);
  }
  if (after.empty()) return 0;
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  nodes.Swap(graph_->mutable_node());
  for (int i = 0; i < nodes.size(); ++i) {
    const auto it = after.find(i);
    if (it == after.end()) {
      *graph_->add_node() = nodes.Get(i);
      continue;
    }
    onnx::NodeProto layer = nodes.Get(i);
    const std::string y = layer.output(0), pre = unique(y + "/pre_requantize");
    layer.set_output(0, pre);
    *graph_->add_node() = layer;
    const onnx::NodeProto& q = it->second;
    const std::string codes = node("QuantizeLinear", {pre, q.input(1), q.input(2)}, y + "/requantize");
    auto* dq = graph_->add_node();
    dq->set_op_type("DequantizeLinear");
    dq->set_name(unique("node/" + y + "/dequantize"));
    dq->add_input(codes), dq->add_input(q.input(1)), dq->add_input(q.input(2));
    dq->add_output(y);  // the consumers keep reading y
  }
  return static_cast<int64_t>(after.size());
}

// ---- layers ---------------------------------------------------------------------------------

std::string qdq_problem(const QuantizableLayer& l) {
  if (const auto* c = dynamic_cast<const nn::Conv2dImpl*>(&l)) {
    if (!nn::variant_if<torch::ExpandingArray<2>>(&c->options.padding()))
      return "'same'/'valid' padding is not written; use explicit padding sizes";
    if (!nn::variant_if<torch::enumtype::kZeros>(&c->options.padding_mode())) return "only zero padding has an ONNX Conv form";
  }
  if (const auto* e = dynamic_cast<const nn::EmbeddingImpl*>(&l)) {
    if (e->options.max_norm()) return "max_norm renormalises rows on lookup; not written";
  }
  if (dynamic_cast<const nn::Conv1dImpl*>(&l)) return "Conv1d has no ONNX graph here (no shipped model uses it)";
  const LayerScheme& s = l.scheme();
  if (!l.quantized()) return "";
  if (s.clips_rows())
    return detail::str_cat("dynamic rows clipped at clip_ratio ", s.activation.clip_ratio,
                           " have no QDQ form (DynamicQuantizeLinear-style rows take the whole amax)");
  if (s.weights) {
    const QSpec& w = s.weights->spec;
    if (w.qtype.is_float())
      return detail::str_cat(w.qtype.name, " weights: float8 needs opset 19; this build's libonnx 1.12 writes opset ",
                             kOpset);
    if (w.qtype.is_codebook())
      return detail::str_cat(w.qtype.name, " weights: ONNX's DequantizeLinear has no codebook (look-up) form; "
                                           "export safetensors (indices + float16 levels) instead");
    if (w.qtype.bits < 8)
      return detail::str_cat(w.qtype.name, " weights: ", w.qtype.bits,
                             "-bit codes need ONNX's INT4 type (opset 21, onnx >= 1.16); this build's libonnx 1.12 "
                             "writes opset ", kOpset, " (keep the layer at qint8, or export safetensors)");
    if (w.granularity == Granularity::kPerGroup)
      return detail::str_cat("per-group weight scales (group_size ", w.group_size,
                             ") need DequantizeLinear's block_size (opset 21); opset ", kOpset,
                             " has per-tensor and per-channel scales only");
  }
  if (s.activations == ActivationMode::kStatic) {
    const QSpec& a = s.activation.spec;
    if (a.qtype.is_float())
      return detail::str_cat(a.qtype.name, " activations: float8 needs opset 19; this build writes opset ", kOpset);
    // Per channel: the per-head scales of attention products (per-axis QDQ on the heads axis).
    if (a.granularity == Granularity::kPerGroup || (a.granularity == Granularity::kPerChannel && a.axis >= 0))
      return detail::str_cat("static ", a.to_string(), " activations: static activation scales are written per tensor, "
                             "or per channel on an axis counted from the back (per-head attention scales)");
  }
  return "";
}

std::string LayerWriter::name(const QuantizableLayer& l) const {
  auto it = names_.find(&l);
  if (it != names_.end() && !it->second.empty()) return it->second;
  return l.path().empty() ? std::string(l.layer_type()) : l.path();
}

void LayerWriter::check_usable(const QuantizableLayer& l) const {
  const std::string problem = qdq_problem(l);
  QF_REQUIRE(problem.empty(), "onnx export: ", name(l), " (", l.layer_type(), "): no QDQ form: ", problem);
  QF_REQUIRE(!l.quantized() || l.frozen(), "onnx export: ", name(l), " (", l.layer_type(),
             "): quantized but not frozen; ONNX export writes the frozen model (qforge::freeze first, or "
             "freeze.enabled: true in the recipe)");
}

std::string LayerWriter::activation_qdq(const Quantizer& q, const std::string& x, const std::string& who,
                                        std::string* form) {
  if (!q || q->mode() == ActivationMode::kNone || !q->fake_quant()) return x;
  if (q->mode() == ActivationMode::kDynamicPerToken) {
    QF_REQUIRE(q->config().clip_ratio == 1.0f, "onnx export: ", who, ": clipped dynamic rows (clip_ratio ",
               q->config().clip_ratio, ") have no QDQ form here");
    // QuantizerImpl::dynamic_qparams: rows of the last dimension, scale = amax / qmax (1 for an
    // all-zero row), codes in [-qmax, qmax] (int8: 127; W4A4's qint4: 7), zero point 0.
    const int64_t qmax = q->config().spec.quant_max();
    const std::string shape = g_.node("Shape", {x}, who + "/shape");
    const std::string last = g_.node("Slice", {shape, g_.ints({-1}), g_.ints({std::numeric_limits<int64_t>::max()})},
                                     who + "/last_dim");
    const std::string shape2d = g_.node("Concat", {g_.ints({-1}), last}, who + "/shape_2d", {{"axis", int64_t{0}}});
    const std::string x2 = g_.node("Reshape", {x, shape2d}, who + "/rows");
    const std::string amax = g_.node("ReduceMax", {g_.node("Abs", {x2}, who + "/abs")}, who + "/amax",
                                     {{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t{0}}});
    const std::string positive = g_.node("Greater", {amax, g_.scalar_f32(0.0f)}, who + "/nonzero");
    const std::string scale = g_.node("Where", {positive, g_.node("Div", {amax, g_.scalar_f32(static_cast<float>(qmax))},
                                                                        who + "/amax_qmax"),
                                                g_.scalar_f32(1.0f)},
                                      who + "/scale");
    const std::string zp = g_.node("ConstantOfShape", {g_.node("Shape", {scale}, who + "/rows_shape")}, who + "/zero_point",
                                   {{"value", at::zeros({1}, at::kChar)}});
    // |x| <= amax gives |x / scale| <= qmax, so the [-qmax, qmax] grid needs no Clip: Q -> DQ stay
    // adjacent, the pattern ONNX Runtime's QDQ fusions look for.
    const std::string qv = g_.node("QuantizeLinear", {x2, scale, zp}, who + "/q", {{"axis", int64_t{0}}});
    const std::string dq = g_.node("DequantizeLinear", {qv, scale, zp}, who + "/dq", {{"axis", int64_t{0}}});
    *form += detail::str_cat("QDQ dynamic per-token ", q->config().spec.qtype.name, " [-", qmax, ", ", qmax,
                             "] (int8 codes) ", who);
    return g_.node("Reshape", {dq, shape}, who + "/restore");
  }
  const QParams qp = q->qparams();
  const QSpec& spec = qp.spec;
  if (spec.granularity == Granularity::kPerChannel) return activation_qdq_per_channel(qp, x, who, form);
  QF_REQUIRE(qp.scale.numel() == 1, "onnx export: ", who, ": static activation qparams are not per-tensor");
  const bool is_signed = spec.qtype.is_signed;
  const at::ScalarType container = is_signed ? at::kChar : at::kByte;
  const int64_t cmin = is_signed ? -128 : 0, cmax = is_signed ? 127 : 255;
  const int64_t zpv = qp.zero_point.reshape({}).item<int64_t>();
  QF_REQUIRE(zpv >= cmin && zpv <= cmax, "onnx export: ", who, ": zero point ", zpv, " does not fit the 8-bit container");
  const std::string s = g_.initializer(who + "/scale", qp.scale.to(at::kFloat).reshape({}));
  const std::string z = g_.initializer(who + "/zero_point", at::full({}, zpv, container));
  std::string xin = x;
  if (spec.quant_min() != cmin || spec.quant_max() != cmax) {
    // Grids narrower than the 8-bit container (narrow_range, reduce_range, 2..7-bit activations):
    // clamp in float to scale * (q - zero_point) at the grid's ends, before QuantizeLinear, so
    // Q -> DQ stay adjacent (ONNX Runtime fuses them into integer ops; a Clip on the codes
    // between them stops that). round(x / scale) of an end point is that end's code again.
    const float sc = qp.scale.to(at::kFloat).reshape({}).item<float>();
    const float lo = sc * static_cast<float>(spec.quant_min() - zpv), hi = sc * static_cast<float>(spec.quant_max() - zpv);
    xin = g_.node("Clip", {x, g_.initializer(who + "/xmin", at::full({}, lo, at::kFloat)),
                           g_.initializer(who + "/xmax", at::full({}, hi, at::kFloat))},
                  who + "/grid_clip");
  }
  const std::string qv = g_.node("QuantizeLinear", {xin, s, z}, who + "/q");
  *form += detail::str_cat("QDQ static ", spec.qtype.name, " [", spec.quant_min(), ", ", spec.quant_max(), "] per_tensor ", who);
  return g_.node("DequantizeLinear", {qv, s, z}, who + "/dq");
}

// Static activations with a scale per channel (per-head attention operands, axis -3): per-axis
// QuantizeLinear / DequantizeLinear (opset 13) with 1-D scales and zero points; a narrow grid is
// clamped in float by Max / Min against [C, 1, ...] bounds (Clip takes scalars only), so Q -> DQ
// stay adjacent as in the per-tensor form.
std::string LayerWriter::activation_qdq_per_channel(const QParams& qp, const std::string& x, const std::string& who,
                                                    std::string* form) {
  const QSpec& spec = qp.spec;
  QF_REQUIRE(spec.axis < 0, "onnx export: ", who, ": per-channel static activations are written on a negative axis (",
             "counted from the back), got axis ", spec.axis);
  const bool is_signed = spec.qtype.is_signed;
  const at::ScalarType container = is_signed ? at::kChar : at::kByte;
  const int64_t cmin = is_signed ? -128 : 0, cmax = is_signed ? 127 : 255;
  const at::Tensor sc = qp.scale.to(at::kFloat).reshape({-1}).contiguous();
  const at::Tensor zp = qp.zero_point.to(at::kLong).reshape({-1});
  QF_REQUIRE(zp.min().item<int64_t>() >= cmin && zp.max().item<int64_t>() <= cmax, "onnx export: ", who,
             ": a zero point does not fit the 8-bit container");
  const std::string s = g_.initializer(who + "/scale", sc);
  const std::string z = g_.initializer(who + "/zero_point", zp.to(container));
  std::string xin = x;
  if (spec.quant_min() != cmin || spec.quant_max() != cmax) {
    // Each channel's grid ends, scale · (q - zero_point), shaped to broadcast along `axis`.
    std::vector<int64_t> shape{sc.numel()};
    for (int64_t i = spec.axis + 1; i < 0; ++i) shape.push_back(1);
    const at::Tensor zf = zp.to(at::kFloat);
    const at::Tensor lo = (sc * (static_cast<float>(spec.quant_min()) - zf)).reshape(shape);
    const at::Tensor hi = (sc * (static_cast<float>(spec.quant_max()) - zf)).reshape(shape);
    xin = g_.node("Min", {g_.node("Max", {x, g_.initializer(who + "/xmin", lo)}, who + "/grid_floor"),
                          g_.initializer(who + "/xmax", hi)},
                  who + "/grid_clip");
  }
  const std::string qv = g_.node("QuantizeLinear", {xin, s, z}, who + "/q", {{"axis", spec.axis}});
  *form += detail::str_cat("QDQ static ", spec.qtype.name, " [", spec.quant_min(), ", ", spec.quant_max(),
                           "] per_channel(axis=", spec.axis, ") ", who);
  return g_.node("DequantizeLinear", {qv, s, z}, who + "/dq", {{"axis", spec.axis}});
}

std::string LayerWriter::bias(const QuantizableLayer& l, const at::Tensor& b_in, const std::string& base, std::string* form) {
  const at::Tensor b = b_in.detach().to(at::kFloat).contiguous();
  const Quantizer& q = l.input_quantizer();
  const QuantizedTensor fw = l.frozen() ? l.frozen_weight() : QuantizedTensor{};
  // Per-channel scales must run along the output (the bias's) axis: axis 0 of the weight.
  const bool per_output = fw.defined() && (fw.scale.dim() == 0 || (fw.spec.granularity == Granularity::kPerChannel &&
                                                                    fw.spec.axis == 0 && fw.scale.numel() == b.numel()));
  const bool integer = q && q->mode() == ActivationMode::kStatic && q->fake_quant() && per_output &&
                       !fw.spec.qtype.is_float() && fw.spec.qtype.bits == 8 && q->qparams().spec.qtype.bits == 8;
  if (integer) {
    // s_x * s_w in float32, as ONNX Runtime forms it; codes round half to even.
    const at::Tensor s = (q->qparams().scale.to(at::kFloat).reshape({}) * fw.scale.to(at::kFloat)).expand_as(b).contiguous();
    const at::Tensor codes = (b.to(at::kDouble) / s.to(at::kDouble)).round();
    const double limit = static_cast<double>(std::numeric_limits<int32_t>::max());
    if (!(s > 0).all().item<bool>() || !codes.isfinite().all().item<bool>()) {
      *form += "; float bias (a non-positive scale product or a non-finite bias has no int32 code)";
    } else if (codes.abs().max().item<double>() > limit) {
      *form += "; float bias (int32 codes at s_x * s_w would overflow)";
    } else {
      *form += "; int32 bias (scale s_x * s_w)";
      return g_.node("DequantizeLinear", {g_.initializer(base + ".bias_codes", codes.to(at::kInt)), g_.initializer(base + ".bias_scale", s)},
                     base + "/bias", {{"axis", int64_t{0}}});
    }
  }
  return g_.initializer(base + ".bias", b);
}

std::string LayerWriter::weight(const QuantizableLayer& l, const at::Tensor& float_weight, bool transpose,
                                std::string* form) {
  const std::string base = name(l);
  const QuantizedTensor fw = l.frozen() ? l.frozen_weight() : QuantizedTensor{};
  if (!fw.defined()) {
    QF_REQUIRE(float_weight.defined(), "onnx export: ", base, " (", l.layer_type(), "): has no weight to write");
    *form += "float weight";
    const at::Tensor w = float_weight.detach().to(at::kFloat);
    return g_.initializer(base + ".weight", transpose ? w.t().contiguous() : w);
  }
  const QSpec& spec = fw.spec;
  at::Tensor codes = fw.int_values();
  int64_t axis = spec.granularity == Granularity::kPerChannel ? spec.axis : 0;
  if (transpose) {
    codes = codes.t().contiguous();
    axis = 1 - axis;
  }
  const at::ScalarType container = spec.qtype.is_signed ? at::kChar : at::kByte;
  const at::Tensor scale = fw.scale.to(at::kFloat);  // the checkpoint's scales, bit for bit
  const at::Tensor zp = fw.zero_point.to(container);
  const std::string c = g_.initializer(base + ".weight_codes", codes);
  const std::string s = g_.initializer(base + ".weight_scale", scale);
  const std::string z = g_.initializer(base + ".weight_zero_point", zp);
  Attrs attrs;
  if (scale.dim() > 0) attrs.push_back({"axis", axis});
  *form += detail::str_cat("DequantizeLinear ", spec.qtype.name, " ", to_string(spec.granularity),
                           scale.dim() > 0 ? detail::str_cat("(axis=", axis, ")") : std::string(), " weight");
  return g_.node("DequantizeLinear", {c, s, z}, base + "/weight", attrs);
}

std::string LayerWriter::linear(const nn::LinearImpl& l, const std::string& x_in) {
  check_usable(l);
  const std::string base = name(l);
  LayerForm f{name(l), l.layer_type(), ""};
  std::string x = x_in;
  if (l.pre_quant_scale().defined()) {
    x = g_.node("Mul", {x, g_.initializer(base + ".pre_quant_scale", l.pre_quant_scale())}, base + "/pre_quant_scale");
    f.form += "pre_quant_scale; ";
  }
  std::string aform;
  x = activation_qdq(l.input_quantizer(), x, base + "/input", &aform);
  const std::string w = weight(l, l.weight, /*transpose=*/true, &f.form);
  if (!aform.empty()) f.form += "; " + aform;
  std::string y = g_.node("MatMul", {x, w}, base + "/matmul");
  const at::Tensor b = l.frozen() ? l.frozen_bias() : (l.options.bias() ? l.bias : at::Tensor());
  if (b.defined()) y = g_.node("Add", {y, bias(l, b, base, &f.form)}, base + "/out");
  forms_.push_back(f);
  return y;
}

std::string LayerWriter::conv2d(const nn::Conv2dImpl& l, const std::string& x_in) {
  check_usable(l);
  const std::string base = name(l);
  const auto& o = l.options;
  const auto* pad = nn::variant_if<torch::ExpandingArray<2>>(&o.padding());  // qdq_problem refused the others
  QF_CHECK(pad);
  LayerForm f{name(l), l.layer_type(), ""};
  std::string aform;
  const std::string x = activation_qdq(l.input_quantizer(), x_in, base + "/input", &aform);
  const std::string w = weight(l, l.weight, /*transpose=*/false, &f.form);
  if (!aform.empty()) f.form += "; " + aform;
  std::vector<std::string> inputs{x, w};
  const at::Tensor b = l.frozen() ? l.frozen_bias() : (o.bias() ? l.bias : at::Tensor());
  if (b.defined()) inputs.push_back(bias(l, b, base, &f.form));
  const auto& k = o.kernel_size();
  const auto& st = o.stride();
  const auto& d = o.dilation();
  const auto& p = *pad;
  forms_.push_back(f);
  return g_.node("Conv", inputs, base + "/conv",
                 {{"kernel_shape", std::vector<int64_t>{(*k)[0], (*k)[1]}},
                  {"strides", std::vector<int64_t>{(*st)[0], (*st)[1]}},
                  {"dilations", std::vector<int64_t>{(*d)[0], (*d)[1]}},
                  {"pads", std::vector<int64_t>{(*p)[0], (*p)[1], (*p)[0], (*p)[1]}},
                  {"group", o.groups()}});
}

std::string LayerWriter::embedding_table(const nn::EmbeddingImpl& l) {
  auto it = tables_.find(&l);
  if (it != tables_.end()) return it->second;
  check_usable(l);
  LayerForm f{name(l), l.layer_type(), ""};
  const std::string t = weight(l, l.weight, /*transpose=*/false, &f.form);
  forms_.push_back(f);
  return tables_[&l] = t;
}

std::string LayerWriter::embedding(const nn::EmbeddingImpl& l, const std::string& ids) {
  const std::string base = name(l);
  return g_.node("Gather", {embedding_table(l), ids}, base + "/gather", {{"axis", int64_t{0}}});
}

std::string LayerWriter::layer_norm(const nn::LayerNormImpl& l, const std::string& x) {
  check_usable(l);
  const std::string base = name(l);
  const auto& shape = l.options.normalized_shape();
  QF_REQUIRE(shape.size() == 1, "onnx export: ", base, " (LayerNorm): only a last-dimension normalized_shape is written");
  const at::Tensor w = l.options.elementwise_affine() ? l.weight.detach() : at::ones({shape[0]});
  const at::Tensor b = l.options.elementwise_affine() ? l.bias.detach() : at::zeros({shape[0]});
  const std::string y = g_.node("LayerNormalization",
                                {x, g_.initializer(base + ".weight", w.to(at::kFloat)), g_.initializer(base + ".bias", b.to(at::kFloat))},
                                base + "/layer_norm",
                                {{"axis", int64_t{-1}}, {"epsilon", static_cast<float>(l.options.eps())}});
  LayerForm f{name(l), l.layer_type(), "LayerNormalization"};
  std::string aform;
  const std::string out = activation_qdq(l.input_quantizer(), y, base + "/output", &aform);
  if (!aform.empty()) f.form += "; " + aform;
  forms_.push_back(f);
  return out;
}

std::string LayerWriter::matmul(const nn::MatMulImpl& l, const std::string& a, const std::string& b, int64_t rank) {
  check_usable(l);
  QF_REQUIRE(rank >= 2, "onnx export: ", name(l), ": MatMul operands of rank ", rank, " (at least 2 expected)");
  const std::string base = name(l);
  LayerForm f{name(l), l.layer_type(), "MatMul"};
  std::string fa, fb;
  const std::string qa = activation_qdq(l.input_quantizer(), a, base + "/input", &fa);
  std::string qb;
  const Quantizer& oq = l.other_quantizer();
  if (oq && oq->mode() == ActivationMode::kDynamicPerToken && oq->fake_quant()) {
    // nn::MatMul: the second operand's dynamic scales are one per column (rows of b^T).
    std::vector<int64_t> perm(static_cast<size_t>(rank));
    for (int64_t i = 0; i < rank; ++i) perm[static_cast<size_t>(i)] = i;
    std::swap(perm[static_cast<size_t>(rank - 2)], perm[static_cast<size_t>(rank - 1)]);
    const std::string bt = g_.node("Transpose", {b}, base + "/other_columns", {{"perm", perm}});
    qb = g_.node("Transpose", {activation_qdq(oq, bt, base + "/other", &fb)}, base + "/other_restore",
                 {{"perm", perm}});
    fb += " (per column)";
  } else {
    qb = activation_qdq(oq, b, base + "/other", &fb);
  }
  if (!fa.empty()) f.form += "; " + fa;
  if (!fb.empty()) f.form += "; " + fb;
  forms_.push_back(f);
  return g_.node("MatMul", {qa, qb}, base + "/matmul");
}

std::string LayerWriter::activation(const std::string& act, const std::string& x) {
  if (act == "relu") return g_.node("Relu", {x}, "relu");
  if (act == "gelu") {
    // x * 0.5 * (1 + erf(x / sqrt(2))), PyTorch's exact gelu.
    const std::string e = g_.node("Erf", {g_.node("Mul", {x, g_.scalar_f32(static_cast<float>(M_SQRT1_2))}, "gelu/scaled")}, "gelu/erf");
    const std::string half_x = g_.node("Mul", {x, g_.scalar_f32(0.5f)}, "gelu/half_x");
    return g_.node("Mul", {half_x, g_.node("Add", {e, g_.scalar_f32(1.0f)}, "gelu/one_plus")}, "gelu");
  }
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
    // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), PyTorch's gelu(approximate="tanh").
    const std::string x3 = g_.node("Mul", {g_.node("Mul", {x, x}, "gelu/x2"), x}, "gelu/x3");
    const std::string inner = g_.node("Add", {x, g_.node("Mul", {x3, g_.scalar_f32(0.044715f)}, "gelu/cubic")}, "gelu/inner");
    const std::string t = g_.node("Tanh", {g_.node("Mul", {inner, g_.scalar_f32(static_cast<float>(M_2_SQRTPI * M_SQRT1_2))}, "gelu/arg")},
                                  "gelu/tanh");
    const std::string half_x = g_.node("Mul", {x, g_.scalar_f32(0.5f)}, "gelu/half_x");
    return g_.node("Mul", {half_x, g_.node("Add", {t, g_.scalar_f32(1.0f)}, "gelu/one_plus")}, "gelu");
  }
  throw Error("onnx export: activation '" + act + "' has no ONNX form here (gelu, gelu_new, gelu_pytorch_tanh, relu)");
}

}  // namespace qforge::onnx_export
