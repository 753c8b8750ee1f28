// ScriptedLayer and the qforge TorchScript library: the custom class, its pickling through a model
// checkpoint, and the ops a rewritten graph calls.
#include "framework/jit/scripted_layer.h"

#include <torch/library.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <type_traits>

#include "framework/core/error.h"
#include "framework/io/checkpoint.h"
#include "framework/io/model_io.h"
#include "framework/nn/conv.h"
#include "framework/nn/embedding.h"
#include "framework/nn/linear.h"
#include "framework/nn/matmul.h"
#include "kernels/cpu/max_pool.h"

namespace qforge::jit {

const char* to_string(LayerKind k) {
  switch (k) {
    case LayerKind::kLinear: return "Linear";
    case LayerKind::kConv1d: return "Conv1d";
    case LayerKind::kConv2d: return "Conv2d";
    case LayerKind::kEmbedding: return "Embedding";
    case LayerKind::kMatMul: return "MatMul";
  }
  return "?";
}

const char* op_name(LayerKind k) {
  switch (k) {
    case LayerKind::kLinear: return "qforge::linear";
    case LayerKind::kConv1d: return "qforge::conv1d";
    case LayerKind::kConv2d: return "qforge::conv2d";
    case LayerKind::kEmbedding: return "qforge::embedding";
    case LayerKind::kMatMul: return "qforge::matmul";
  }
  return "?";
}

namespace {

// Spatial dimensions of a kind (0 for Linear).
size_t spatial_dims(LayerKind k) { return k == LayerKind::kConv2d ? 2 : k == LayerKind::kConv1d ? 1 : 0; }

}  // namespace

std::vector<int64_t> LayerSpec::to_ints() const {
  // Format 3 only where it is needed (a MatMul), so format-2 readers keep reading the other layers.
  const int64_t version = kind == LayerKind::kMatMul ? 3 : 2;
  std::vector<int64_t> v{version, static_cast<int64_t>(kind), in, out, groups, bias ? 1 : 0};
  for (const auto* a : {&kernel, &stride, &padding, &dilation}) v.insert(v.end(), a->begin(), a->end());
  if (kind == LayerKind::kEmbedding) v.push_back(padding_idx);
  v.push_back(weight_transposed ? 1 : 0);
  return v;
}

namespace {

constexpr size_t kHeaderInts = 6;  // version, kind, in, out, groups, bias

// Refuses options no torch.nn layer accepts (a crafted file must not reach a division by zero or a
// huge allocation in the layer's constructor).
void check_spec(const LayerSpec& s) {
  const char* k = to_string(s.kind);
  if (s.kind == LayerKind::kMatMul) {
    QF_REQUIRE(s.in == 0 && s.out == 0 && s.groups == 1 && !s.bias && !s.weight_transposed && s.padding_idx == -1,
               "framework/jit: pickled MatMul has layer options (in ", s.in, ", out ", s.out, ", groups ", s.groups,
               ", bias ", s.bias, "); a product of two activations has none");
    return;
  }
  QF_REQUIRE(s.in >= 1 && s.out >= 1 && s.in <= kMaxLayerWidth && s.out <= kMaxLayerWidth, "framework/jit: pickled ",
             k, " has in ", s.in, ", out ", s.out, " (each must lie in [1, ", kMaxLayerWidth, "])");
  const bool conv = s.kind == LayerKind::kConv1d || s.kind == LayerKind::kConv2d;
  QF_REQUIRE(s.groups >= 1 && (conv || s.groups == 1), "framework/jit: pickled ", k, " has groups ", s.groups);
  QF_REQUIRE(s.kind != LayerKind::kEmbedding || !s.bias, "framework/jit: pickled ", k, " has a bias");
  QF_REQUIRE(s.kind == LayerKind::kLinear || !s.weight_transposed, "framework/jit: pickled ", k,
             " has a transposed weight (only a Linear may)");
  QF_REQUIRE(s.padding_idx >= -1 && s.padding_idx < (s.kind == LayerKind::kEmbedding ? s.in : 0),
             "framework/jit: pickled ", k, " has padding_idx ", s.padding_idx, " for ", s.in, " rows");
  QF_REQUIRE(s.in % s.groups == 0 && s.out % s.groups == 0, "framework/jit: pickled ", k, " has in ", s.in, ", out ",
             s.out, " not divisible by groups ", s.groups);
  for (size_t i = 0; i < s.kernel.size(); ++i) {
    QF_REQUIRE(s.kernel[i] >= 1 && s.kernel[i] <= kMaxLayerKernel && s.stride[i] >= 1 && s.dilation[i] >= 1 &&
                   s.padding[i] >= 0 && s.stride[i] <= kMaxLayerKernel && s.dilation[i] <= kMaxLayerKernel &&
                   s.padding[i] <= kMaxLayerKernel,
               "framework/jit: pickled ", k, " has kernel ", at::IntArrayRef(s.kernel), ", stride ",
               at::IntArrayRef(s.stride), ", padding ", at::IntArrayRef(s.padding), ", dilation ",
               at::IntArrayRef(s.dilation), " (kernel, stride, dilation in [1, ", kMaxLayerKernel,
               "], padding in [0, ", kMaxLayerKernel, "])");
  }
  int64_t n = 1;
  for (const int64_t d : s.weight_shape()) {
    QF_REQUIRE(n <= kMaxLayerWeight / d, "framework/jit: pickled ", k, " declares a weight of shape ",
               at::IntArrayRef(s.weight_shape()), ", over ", kMaxLayerWeight, " elements");
    n *= d;
  }
}

}  // namespace

std::vector<int64_t> LayerSpec::weight_shape() const {
  if (kind == LayerKind::kMatMul) return {};
  if (kind == LayerKind::kEmbedding) return {in, out};
  std::vector<int64_t> shape{out, kind == LayerKind::kLinear ? in : in / groups};
  shape.insert(shape.end(), kernel.begin(), kernel.end());
  return shape;
}

LayerSpec LayerSpec::from_ints(const std::vector<int64_t>& v) {
  QF_REQUIRE(!v.empty() && v[0] >= 1, "framework/jit: pickled qforge layer has no format version");
  QF_REQUIRE(v[0] <= kLayerStateVersion, "framework/jit: pickled qforge layer written by a newer qforge (format ",
             v[0], "; this one reads up to ", kLayerStateVersion, ")");
  QF_REQUIRE(v.size() >= 2 && v[1] >= 0 && v[1] <= static_cast<int64_t>(LayerKind::kMatMul),
             "framework/jit: pickled qforge layer has an unknown kind");
  LayerSpec s;
  s.kind = static_cast<LayerKind>(v[1]);
  QF_REQUIRE(s.kind != LayerKind::kMatMul || v[0] >= 3, "framework/jit: pickled MatMul in format ", v[0],
             " (MatMul layers exist from format 3)");
  const size_t d = spatial_dims(s.kind), extra = s.kind == LayerKind::kEmbedding ? 1 : 0;
  const size_t flags = v[0] >= 2 ? 1 : 0;  // format 2: weight_transposed
  QF_REQUIRE(v.size() == kHeaderInts + 4 * d + extra + flags, "framework/jit: pickled ", to_string(s.kind), " options have ",
             v.size(), " values, expected ", kHeaderInts + 4 * d + extra + flags);
  s.in = v[2];
  s.out = v[3];
  s.groups = v[4];
  s.bias = v[5] != 0;
  size_t at = kHeaderInts;
  for (auto* a : {&s.kernel, &s.stride, &s.padding, &s.dilation}) {
    a->assign(v.begin() + static_cast<std::ptrdiff_t>(at), v.begin() + static_cast<std::ptrdiff_t>(at + d));
    at += d;
  }
  if (extra) s.padding_idx = v[at];
  if (flags) {
    QF_REQUIRE(v.back() == 0 || v.back() == 1, "framework/jit: pickled ", to_string(s.kind),
               " has weight_transposed ", v.back());
    s.weight_transposed = v.back() == 1;
  }
  check_spec(s);
  return s;
}

namespace {

// A qforge layer whose float weight and bias can be bound to tensors owned elsewhere (the
// TorchScript module's parameters), so one optimizer step on those trains the layer.
template <class Impl>
class SharedLayer : public Impl {
 public:
  using Impl::Impl;
  void share(const std::string& who, const at::Tensor& w, const at::Tensor& b) {
    QF_REQUIRE(w.sizes() == this->weight.sizes(), who, ": weight has shape ", w.sizes(), ", the layer expects ",
               this->weight.sizes());
    this->parameters_["weight"] = w;
    this->weight = w;
    if constexpr (std::is_same_v<Impl, nn::EmbeddingImpl>) {
      QF_REQUIRE(!b.defined(), who, ": an embedding has no bias");
      return;
    } else {
      share_bias(who, b);
    }
  }

 private:
  void share_bias(const std::string& who, const at::Tensor& b) {
    QF_REQUIRE(b.defined() == this->bias.defined(), who, ": bias ", b.defined() ? "given" : "missing",
               " but the layer was built ", this->bias.defined() ? "with" : "without", " one");
    if (!b.defined()) return;
    QF_REQUIRE(b.sizes() == this->bias.sizes(), who, ": bias has shape ", b.sizes(), ", the layer expects ",
               this->bias.sizes());
    this->parameters_["bias"] = b;
    this->bias = b;
  }
};

template <size_t D>
torch::nn::ConvOptions<D> conv_options(const LayerSpec& s) {
  torch::nn::ConvOptions<D> o(s.in, s.out, torch::ExpandingArray<D>(at::IntArrayRef(s.kernel)));
  o.stride(torch::ExpandingArray<D>(at::IntArrayRef(s.stride)))
      .padding(torch::ExpandingArray<D>(at::IntArrayRef(s.padding)))
      .dilation(torch::ExpandingArray<D>(at::IntArrayRef(s.dilation)))
      .groups(s.groups)
      .bias(s.bias);
  return o;
}

// A float layer of `spec` (random initialisation drawn without moving the default generator),
// bound to w / b when w is defined; *forward gets its forward.
template <class Impl, class Options>
std::shared_ptr<torch::nn::Module> build(Options o, const std::string& who, const at::Tensor& w, const at::Tensor& b,
                                         std::function<at::Tensor(const at::Tensor&)>* forward) {
  std::shared_ptr<SharedLayer<Impl>> m;
  {
    RngStateGuard rng;
    m = std::make_shared<SharedLayer<Impl>>(std::move(o));
  }
  if (w.defined()) m->share(who, w, b);
  Impl* raw = m.get();
  *forward = [raw](const at::Tensor& x) { return raw->forward(x); };
  return m;
}

std::shared_ptr<torch::nn::Module> make_layer(const LayerSpec& s, const std::string& who, const at::Tensor& w,
                                              const at::Tensor& b, std::function<at::Tensor(const at::Tensor&)>* fwd) {
  switch (s.kind) {
    case LayerKind::kLinear:
      return build<nn::LinearImpl>(torch::nn::LinearOptions(s.in, s.out).bias(s.bias), who, w, b, fwd);
    case LayerKind::kConv1d: return build<nn::Conv1dImpl>(conv_options<1>(s), who, w, b, fwd);
    case LayerKind::kConv2d: return build<nn::Conv2dImpl>(conv_options<2>(s), who, w, b, fwd);
    case LayerKind::kEmbedding: {
      torch::nn::EmbeddingOptions o(s.in, s.out);
      if (s.padding_idx >= 0) o.padding_idx(s.padding_idx);
      return build<nn::EmbeddingImpl>(o, who, w, b, fwd);
    }
    case LayerKind::kMatMul: {
      QF_REQUIRE(!w.defined() && !b.defined(), who, ": a product of two activations has no weight or bias");
      *fwd = [who](const at::Tensor&) -> at::Tensor {
        throw Error("framework/jit: " + who + " multiplies two operands; it has no one-input forward");
      };
      return std::make_shared<nn::MatMulImpl>();
    }
  }
  throw Error("framework/jit: unknown layer kind");
}

// A file in the temporary directory, removed on scope exit (the pickled checkpoint's bytes pass
// through it: model checkpoints are HDF5 files).
class TempFile {
 public:
  TempFile() {
    std::string t = (std::filesystem::temp_directory_path() / "qforge-jit-XXXXXX").string();
    const int fd = ::mkstemp(t.data());
    QF_REQUIRE(fd >= 0, "framework/jit: cannot create a temporary file in ", std::filesystem::temp_directory_path());
    ::close(fd);
    path_ = t;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

std::string outside_layers(const std::string& path, const std::set<std::string>& layers) {
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', dot + 1)) {
    if (!layers.count(path.substr(0, dot))) continue;
    std::string out = path;
    std::replace(out.begin() + static_cast<std::ptrdiff_t>(dot), out.end(), '.', '_');
    return out;
  }
  return path;
}

torch::nn::Module& module_at(torch::nn::Module& root, const std::string& path) {
  torch::nn::Module* at = &root;
  std::stringstream names(path);
  for (std::string name; std::getline(names, name, '.');) {
    QF_REQUIRE(dynamic_cast<QuantizableLayer*>(at) == nullptr, "framework/jit: module path '", path,
               "' passes through a qforge layer, which holds no children");
    if (!at->named_children().contains(name)) at->register_module(name, std::make_shared<torch::nn::Module>());
    at = at->named_children()[name].get();
  }
  QF_REQUIRE(dynamic_cast<QuantizableLayer*>(at) == nullptr || path.empty(), "framework/jit: module path '", path,
             "' is a qforge layer, which holds no children");
  return *at;
}

void mount(torch::nn::Module& root, const std::string& path, std::shared_ptr<torch::nn::Module> module) {
  QF_REQUIRE(!path.empty(), "framework/jit: a qforge layer needs a non-empty module path");
  const size_t dot = path.rfind('.');
  torch::nn::Module& at = dot == std::string::npos ? root : module_at(root, path.substr(0, dot));
  const std::string leaf = dot == std::string::npos ? path : path.substr(dot + 1);
  QF_REQUIRE(!at.named_children().contains(leaf), "framework/jit: two qforge layers at module path '", path, "'");
  at.register_module(leaf, std::move(module));
}

ScriptedLayer::ScriptedLayer(std::string path, const LayerSpec& spec, TensorHome home, const at::Tensor& weight,
                             const at::Tensor& bias)
    : path_(std::move(path)), spec_(spec), home_(std::move(home)) {
  std::function<at::Tensor(const at::Tensor&)> fwd;
  module_ = make_layer(spec_, path_ + " (" + to_string(spec_.kind) + ")", weight, bias, &fwd);
  forward_ = std::move(fwd);
  layer_ = dynamic_cast<QuantizableLayer*>(module_.get());
}

at::Tensor ScriptedLayer::forward(const at::Tensor& x) { return forward_(x); }

at::Tensor ScriptedLayer::forward(const at::Tensor& a, const at::Tensor& b) {
  auto* m = dynamic_cast<nn::MatMulImpl*>(module_.get());
  QF_REQUIRE(m != nullptr, "framework/jit: the ", to_string(spec_.kind), " layer '", path_, "' takes one input");
  return m->forward(a, b);
}

at::Tensor ScriptedLayer::weight() const {
  const auto params = module_->named_parameters(/*recurse=*/false);
  const at::Tensor* w = params.find("weight");
  return w ? *w : at::Tensor();
}

at::Tensor ScriptedLayer::bias() const {
  const auto params = module_->named_parameters(/*recurse=*/false);
  const at::Tensor* b = params.find("bias");
  return b ? *b : at::Tensor();
}

at::Tensor ScriptedLayer::effective_weight() {
  at::Tensor w;
  if (layer_->frozen()) {
    w = layer_->frozen_weight().dequantize();
  } else {
    Quantizer q = layer_->weight_quantizer();
    w = q ? q->forward(weight()) : weight();
  }
  const auto* linear = dynamic_cast<const nn::LinearImpl*>(module_.get());
  if (linear && linear->pre_quant_scale().defined()) w = w * linear->pre_quant_scale();
  return w;
}

at::Tensor ScriptedLayer::effective_bias() const { return layer_->frozen() ? layer_->frozen_bias() : bias(); }

ScriptedLayer::State ScriptedLayer::state() const {
  torch::nn::Module holder;
  mount(holder, path_, module_);
  TempFile file;
  io::save_model(holder, file.path());
  std::ifstream in(file.path(), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  at::Tensor data = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  return {{path_, home_.owner, home_.weight, home_.bias}, spec_.to_ints(), data};
}

namespace {

// The checkpoint must declare the weight the spec describes before the layer is built (a crafted
// spec cannot make the constructor allocate what the file does not hold).
void check_checkpoint_weight(const LayerSpec& spec, const std::string& path, const std::string& file) {
  const io::CheckpointReader reader(file);
  const std::string key = path + ".weight";
  if (spec.kind == LayerKind::kMatMul) {
    QF_REQUIRE(!reader.contains(key), "framework/jit: pickled MatMul '", path, "' holds a weight in its checkpoint");
    return;
  }
  QF_REQUIRE(reader.contains(key), "framework/jit: pickled ", to_string(spec.kind), " '", path,
             "' has no weight in its checkpoint");
  QF_REQUIRE(reader.info(key).shape == spec.weight_shape(), "framework/jit: pickled ", to_string(spec.kind), " '",
             path, "' declares a weight of shape ", at::IntArrayRef(spec.weight_shape()),
             " but its checkpoint holds ", at::IntArrayRef(reader.info(key).shape));
}

}  // namespace

c10::intrusive_ptr<ScriptedLayer> ScriptedLayer::from_state(State state) {
  auto& [names, ints, data] = state;
  QF_REQUIRE(names.size() == 4, "framework/jit: pickled qforge layer has ", names.size(), " names, expected 4");
  QF_REQUIRE(data.defined() && data.scalar_type() == at::kByte && data.dim() == 1,
             "framework/jit: pickled qforge layer '", names[0], "' holds no checkpoint bytes");
  const LayerSpec spec = LayerSpec::from_ints(ints);
  TempFile file;
  {
    const at::Tensor bytes = data.contiguous();
    std::ofstream out(file.path(), std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(bytes.data_ptr()), bytes.numel());
    QF_REQUIRE(out.good(), "framework/jit: cannot write ", file.path());
  }
  check_checkpoint_weight(spec, names[0], file.path());
  auto layer = c10::make_intrusive<ScriptedLayer>(names[0], spec, TensorHome{names[1], names[2], names[3]},
                                                  at::Tensor(), at::Tensor());
  torch::nn::Module holder;
  mount(holder, layer->path(), layer->module());
  io::load_model(holder, file.path());
  return layer;
}

namespace {

at::Tensor call(const at::Tensor& x, const c10::intrusive_ptr<ScriptedLayer>& l, bool training, LayerKind kind) {
  QF_REQUIRE(l->spec().kind == kind, "framework/jit: ", op_name(kind), " called with the ", to_string(l->spec().kind),
             " layer '", l->path(), "'");
  // The calling module's mode (its `training` attribute) rules: a loaded file's .eval() reaches the layer.
  if (l->module()->is_training() != training) l->module()->train(training);
  return l->forward(x);
}

// qforge::matmul: a MatMul layer's product of two activations (float, fake-quant, calibrating or frozen).
at::Tensor matmul(const at::Tensor& a, const at::Tensor& b, const c10::intrusive_ptr<ScriptedLayer>& l, bool training) {
  QF_REQUIRE(l->spec().kind == LayerKind::kMatMul, "framework/jit: qforge::matmul called with the ",
             to_string(l->spec().kind), " layer '", l->path(), "'");
  if (l->module()->is_training() != training) l->module()->train(training);
  return l->forward(a, b);
}

// Whether every value above clamp_max gets second's top input code as clamp_max itself does, so
// that codes of relu(y) are codes of hardtanh(y, 0, clamp_max) (computed as quantize_to_int8
// computes codes: v * (1 / scale) rounded, plus the zero point).
bool clamp_is_in_the_grid(const nn::Conv2dImpl& second, double clamp_max) {
  if (clamp_max <= 0) return true;  // a plain ReLU
  const QParams qp = second.input_quantizer()->qparams();
  const float inv = 1.0f / qp.scale_value();
  const int64_t zp = qp.zero_point_value();
  return static_cast<float>(clamp_max) * inv >= static_cast<float>(qp.spec.quant_max() - zp);
}

// qforge::conv2d_act_codes (graph_rewrite.h): relu(first(x)), or hardtanh(first(x), 0, clamp_max),
// for second's input. Once first is frozen on the integer path and second takes codes, the int8
// codes second's input quantizer makes of those values, requantized in first's epilogue
// (nn::Conv2dImpl::forward_relu_codes: code for code the same); floats otherwise.
at::Tensor conv2d_act_codes(const at::Tensor& x, const c10::intrusive_ptr<ScriptedLayer>& first,
                            const c10::intrusive_ptr<ScriptedLayer>& second, double clamp_max, bool training) {
  for (const auto* l : {&first, &second})
    QF_REQUIRE((*l)->spec().kind == LayerKind::kConv2d, "framework/jit: qforge::conv2d_act_codes called with the ",
               to_string((*l)->spec().kind), " layer '", (*l)->path(), "'");
  for (const auto* l : {&first, &second})
    if ((*l)->module()->is_training() != training) (*l)->module()->train(training);
  auto* a = dynamic_cast<nn::Conv2dImpl*>(first->module().get());
  auto* b = dynamic_cast<nn::Conv2dImpl*>(second->module().get());
  if (!training && x.is_cpu() && a != nullptr && b != nullptr && a->integer_frozen() && b->takes_codes() &&
      (x.scalar_type() != at::kChar || a->takes_codes()) && clamp_is_in_the_grid(*b, clamp_max))
    return a->forward_relu_codes(x, *b);
  const at::Tensor y = first->forward(x);
  return clamp_max > 0 ? at::hardtanh(y, 0.0, clamp_max) : at::relu(y);
}

// qforge::conv2d_add (conv_chain.h): layer(x) + residual, through a ReLU when relu; the addition
// and the ReLU in the frozen layer's epilogue (nn::Conv2dImpl::forward_add), ATen's ops otherwise.
at::Tensor conv2d_add(const at::Tensor& x, const c10::intrusive_ptr<ScriptedLayer>& l, const at::Tensor& residual,
                      bool relu, bool in_place, bool training) {
  QF_REQUIRE(l->spec().kind == LayerKind::kConv2d, "framework/jit: qforge::conv2d_add called with the ",
             to_string(l->spec().kind), " layer '", l->path(), "'");
  if (l->module()->is_training() != training) l->module()->train(training);
  auto* c = dynamic_cast<nn::Conv2dImpl*>(l->module().get());
  if (!training && c != nullptr && c->integer_frozen()) return c->forward_add(x, residual, relu, in_place);
  return nn::add_residual(l->forward(x), residual, relu, in_place);
}

// An int[] pooling argument for both dimensions (one value: both; empty stride: the kernel's).
std::array<int64_t, 2> pool_pair(c10::IntArrayRef v, c10::IntArrayRef fallback, const char* what) {
  if (v.empty()) v = fallback;
  QF_REQUIRE(v.size() == 1 || v.size() == 2, "framework/jit: max_pool2d ", what, " has ", v.size(),
             " values (1 or 2)");
  return {v[0], v.size() == 2 ? v[1] : v[0]};
}

// qforge::max_pool2d (conv_chain.h): qforge's kernel on a float channels-last CPU input with no
// gradient to record, at::max_pool2d otherwise (the same values either way).
at::Tensor pool_max(const at::Tensor& x, c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding,
                    c10::IntArrayRef dilation, bool ceil_mode) {
  const bool fast = x.is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 4 && x.numel() > 0 &&
                    x.is_contiguous(at::MemoryFormat::ChannelsLast) && !(x.requires_grad() && at::GradMode::is_enabled());
  if (!fast) return at::max_pool2d(x, kernel, stride, padding, dilation, ceil_mode);
  const auto k = pool_pair(kernel, kernel, "kernel_size"), s = pool_pair(stride, kernel, "stride");
  const auto p = pool_pair(padding, padding, "padding"), d = pool_pair(dilation, dilation, "dilation");
  kernels::PoolGeometry g;
  g.batch = x.size(0);
  g.channels = x.size(1);
  g.in_h = x.size(2);
  g.in_w = x.size(3);
  g.kernel_h = k[0];
  g.kernel_w = k[1];
  g.stride_h = s[0];
  g.stride_w = s[1];
  g.pad_h = p[0];
  g.pad_w = p[1];
  g.dilation_h = d[0];
  g.dilation_w = d[1];
  g.ceil_mode = ceil_mode;
  kernels::check_pool_geometry(g);
  at::Tensor y = at::empty({g.batch, g.out_h(), g.out_w(), g.channels}, x.options());
  kernels::max_pool2d_nhwc_f32(x.data_ptr<float>(), g, y.data_ptr<float>());
  return y.permute({0, 3, 1, 2});  // NCHW shape, channels-last memory, as ATen returns it
}

// A Linear call on an embedding's table (a tied LM head): x times the table's rows as the layer
// holds them now (float, fake-quantized, or dequantized from the frozen table), so the table is
// quantized once for both uses.
at::Tensor tied_linear(const at::Tensor& x, const c10::intrusive_ptr<ScriptedLayer>& l,
                       const c10::optional<at::Tensor>& bias, bool training) {
  QF_REQUIRE(l->spec().kind == LayerKind::kEmbedding, "framework/jit: qforge::tied_linear called with the ",
             to_string(l->spec().kind), " layer '", l->path(), "' (it takes an embedding table)");
  if (l->module()->is_training() != training) l->module()->train(training);
  const at::Tensor table = l->forward(at::arange(l->spec().in, at::TensorOptions().dtype(at::kLong)));
  return at::linear(x, table, bias.has_value() ? *bias : at::Tensor());
}

}  // namespace

// The TorchScript library: what a saved file names (torch.classes.qforge.Layer, torch.ops.qforge.*).
// The kernels are catch-all (composite) kernels: autograd records the ATen ops they run, so the
// fake-quant STE and LSQ gradients flow into the TorchScript module's parameters.
TORCH_LIBRARY(qforge, m) {
  m.class_<ScriptedLayer>("Layer")
      .def("path", [](const c10::intrusive_ptr<ScriptedLayer>& self) { return self->path(); })
      .def_pickle([](const c10::intrusive_ptr<ScriptedLayer>& self) { return self->state(); },
                  [](ScriptedLayer::State s) { return ScriptedLayer::from_state(std::move(s)); });
  m.def("linear(Tensor x, __torch__.torch.classes.qforge.Layer layer, bool training) -> Tensor",
        [](const at::Tensor& x, c10::intrusive_ptr<ScriptedLayer> l, bool training) {
          return call(x, l, training, LayerKind::kLinear);
        });
  // W @ x: the Linear on x with its last two dimensions swapped, and back (a vector x: the Linear
  // itself); contiguous, as torch.matmul returns it (a later .view() of the product works).
  m.def("linear_left(Tensor x, __torch__.torch.classes.qforge.Layer layer, bool training) -> Tensor",
        [](const at::Tensor& x, c10::intrusive_ptr<ScriptedLayer> l, bool training) {
          if (x.dim() <= 1) return call(x, l, training, LayerKind::kLinear);
          return call(x.transpose(-1, -2), l, training, LayerKind::kLinear).transpose(-1, -2).contiguous();
        });
  m.def("conv1d(Tensor x, __torch__.torch.classes.qforge.Layer layer, bool training) -> Tensor",
        [](const at::Tensor& x, c10::intrusive_ptr<ScriptedLayer> l, bool training) {
          return call(x, l, training, LayerKind::kConv1d);
        });
  m.def("conv2d(Tensor x, __torch__.torch.classes.qforge.Layer layer, bool training) -> Tensor",
        [](const at::Tensor& x, c10::intrusive_ptr<ScriptedLayer> l, bool training) {
          return call(x, l, training, LayerKind::kConv2d);
        });
  m.def("conv2d_act_codes(Tensor x, __torch__.torch.classes.qforge.Layer layer, "
        "__torch__.torch.classes.qforge.Layer next, float clamp_max, bool training) -> Tensor",
        [](const at::Tensor& x, c10::intrusive_ptr<ScriptedLayer> l, c10::intrusive_ptr<ScriptedLayer> next,
           double clamp_max, bool training) { return conv2d_act_codes(x, l, next, clamp_max, training); });
  m.def("conv2d_add(Tensor x, __torch__.torch.classes.qforge.Layer layer, Tensor residual, bool relu, "
        "bool in_place, bool training) -> Tensor",
        [](const at::Tensor& x, c10::intrusive_ptr<ScriptedLayer> l, const at::Tensor& residual, bool relu,
           bool in_place, bool training) { return conv2d_add(x, l, residual, relu, in_place, training); });
  m.def("max_pool2d(Tensor x, int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, bool ceil_mode) "
        "-> Tensor",
        [](const at::Tensor& x, c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding,
           c10::IntArrayRef dilation, bool ceil_mode) { return pool_max(x, kernel, stride, padding, dilation, ceil_mode); });
  m.def("embedding(Tensor indices, __torch__.torch.classes.qforge.Layer layer, bool training) -> Tensor",
        [](const at::Tensor& indices, c10::intrusive_ptr<ScriptedLayer> l, bool training) {
          return call(indices, l, training, LayerKind::kEmbedding);
        });
  m.def("matmul(Tensor a, Tensor b, __torch__.torch.classes.qforge.Layer layer, bool training) -> Tensor",
        [](const at::Tensor& a, const at::Tensor& b, c10::intrusive_ptr<ScriptedLayer> l, bool training) {
          return matmul(a, b, l, training);
        });
  // A Linear's weight and bias as it holds them, for ops that slice them (graph_rewrite.h, TiedCall::slice).
  m.def("weight(__torch__.torch.classes.qforge.Layer layer, bool training) -> Tensor",
        [](c10::intrusive_ptr<ScriptedLayer> l, bool training) {
          if (l->module()->is_training() != training) l->module()->train(training);
          return l->effective_weight();
        });
  m.def("bias(__torch__.torch.classes.qforge.Layer layer, bool training) -> Tensor",
        [](c10::intrusive_ptr<ScriptedLayer> l, bool training) {
          if (l->module()->is_training() != training) l->module()->train(training);
          return l->effective_bias();
        });
  m.def("tied_linear(Tensor x, __torch__.torch.classes.qforge.Layer layer, Tensor? bias, bool training) -> Tensor",
        [](const at::Tensor& x, c10::intrusive_ptr<ScriptedLayer> l, c10::optional<at::Tensor> bias, bool training) {
          return tied_linear(x, l, bias, training);
        });
}

c10::ClassTypePtr scripted_layer_type() { return c10::getCustomClassType<c10::intrusive_ptr<ScriptedLayer>>(); }

}  // namespace qforge::jit
