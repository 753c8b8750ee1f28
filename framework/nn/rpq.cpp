// RPQ layers: weights generated from shared codebooks and uint8 indices (framework/nn/rpq.h).
#include "framework/nn/rpq.h"

#include <ATen/ATen.h>

#include <cmath>

#include "framework/core/error.h"
#include "framework/nn/packed_weight_cpu.h"
#include "framework/nn/twin.h"

namespace qforge::nn {

at::Tensor rpq_expand(const at::Tensor& codebooks, const at::Tensor& indices) {
  QF_REQUIRE(codebooks.defined() && codebooks.dim() == 3 && at::isFloatingType(codebooks.scalar_type()),
             "rpq_expand: codebooks must be a float [H, 256, D] tensor");
  QF_REQUIRE(indices.defined() && indices.dim() == 2 && indices.scalar_type() == at::kByte &&
                 indices.size(0) == codebooks.size(0),
             "rpq_expand: indices must be uint8 [H, C] with the codebooks' H = ", codebooks.size(0));
  QF_REQUIRE(codebooks.size(1) == kRpqCodebookSize, "rpq_expand: codebooks hold ", codebooks.size(1),
             " sub-vectors each, expected ", kRpqCodebookSize);
  const int64_t H = codebooks.size(0), K = codebooks.size(1), D = codebooks.size(2), C = indices.size(1);
  const at::Tensor sub = codebooks.reshape({H * K, D}).index_select(0, rpq_codebook_rows(indices).reshape({-1})).view({H, C, D});
  return sub.permute({0, 2, 1}).reshape({H * D, C});  // [(h d), c]
}

at::Tensor rpq_codebook_rows(const at::Tensor& indices) {
  const at::Tensor offsets = at::arange(indices.size(0), indices.options().dtype(at::kLong)).mul_(kRpqCodebookSize);
  return indices.to(at::kLong) + offsets.unsqueeze(1);
}

at::Tensor rpq_linear(const at::Tensor& x_in, const at::Tensor& codebooks, const at::Tensor& indices,
                      const at::Tensor& bias) {
  const int64_t H = codebooks.size(0), D = codebooks.size(2), S = H * D, C = indices.size(1);
  QF_REQUIRE(x_in.dim() >= 1 && x_in.size(-1) == C, "RPQLinear: input has ", x_in.dim() ? x_in.size(-1) : 0,
             " features, expected ", C);
  const at::Tensor x = x_in.reshape({-1, C});
  const int64_t M = x.size(0);
  if (M > kRpqLutMaxRows) return at::linear(x_in, rpq_expand(codebooks, indices), bias);
  // The inner sums are a scatter-add of x into H x 256 bins; the outer one a [256, D] product.
  const at::Tensor flat = rpq_codebook_rows(indices).reshape({-1});
  const at::Tensor bins = at::zeros({M, H * kRpqCodebookSize}, x.options()).index_add(1, flat, x.repeat({1, H}));
  at::Tensor y = at::bmm(bins.view({M, H, kRpqCodebookSize}).transpose(0, 1), codebooks)  // [H, M, D]
                     .transpose(0, 1)
                     .reshape({M, S});
  if (bias.defined()) y = y + bias;
  std::vector<int64_t> shape(x_in.sizes().begin(), x_in.sizes().end());
  shape.back() = S;
  return y.view(shape);
}

at::Tensor rpq_gather_rows(const at::Tensor& codebooks, const at::Tensor& indices, const at::Tensor& ids) {
  QF_REQUIRE(!at::isFloatingType(ids.scalar_type()), "RPQEmbedding: indices must be integers, got ", ids.scalar_type());
  const int64_t H = codebooks.size(0), D = codebooks.size(2), C = indices.size(1);
  const at::Tensor flat = ids.reshape({-1}).to(at::kLong);
  if (flat.numel() > 0) {
    const int64_t lo = flat.min().item<int64_t>(), hi = flat.max().item<int64_t>();
    QF_REQUIRE(lo >= 0 && hi < C, "RPQEmbedding: index ", lo < 0 ? lo : hi, " is out of range [0, ", C, ")");
  }
  const int64_t n = flat.numel();
  const at::Tensor codes = rpq_codebook_rows(indices.index_select(1, flat));  // [H, n]
  const at::Tensor rows = codebooks.reshape({H * kRpqCodebookSize, D})
                              .index_select(0, codes.reshape({-1}))
                              .view({H, n, D})
                              .transpose(0, 1)
                              .reshape({n, H * D});
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(H * D);
  return rows.view(shape);
}

// ---- shared state ---------------------------------------------------------------------------

void RPQLayer::init_rpq(torch::nn::Module& m, int64_t split, int64_t columns, int64_t num_codebooks, const char* what) {
  require_unfrozen("reset (or clone)");
  QF_REQUIRE(num_codebooks >= 1, layer_type(), ": num_codebooks must be at least 1, got ", num_codebooks);
  QF_REQUIRE(split % num_codebooks == 0, layer_type(), ": ", what, " = ", split,
             " is not divisible by num_codebooks = ", num_codebooks, " (each codebook holds sub-vectors of ",
             what, " / num_codebooks values)");
  QF_REQUIRE(columns >= 1, layer_type(), ": the weight has no columns");
  H_ = num_codebooks;
  S_ = split;
  C_ = columns;
  D_ = split / num_codebooks;
  codebooks_ = m.register_parameter("codebooks", at::empty({H_, kRpqCodebookSize, D_}, at::kFloat));
  indices_ = m.register_buffer("indices", at::randint(kRpqCodebookSize, {H_, C_}, at::kByte));
}

void RPQLayer::init_codebooks_uniform(double bound) {
  at::NoGradGuard g;
  codebooks_.uniform_(-bound, bound);
}

int64_t RPQLayer::storage_bytes() const {
  if (packed_) return packed_->bytes();
  return codebooks_.nbytes() + indices_.nbytes() + (bias_.defined() ? bias_.nbytes() : 0);
}

at::Tensor RPQLayer::expanded() const {
  return packed_ ? rpq_split_weight(*packed_) : rpq_expand(codebooks_, indices_);
}

at::Tensor RPQLayer::layer_bias() const { return packed_ ? packed_->bias() : bias_; }

void RPQLayer::require_unfrozen(const char* what) const {
  QF_REQUIRE(!packed_, layer_type(), ": ", what, " on a frozen layer (its codebooks are packed and fixed; build a "
             "fresh layer and load its checkpoint instead)");
}

void RPQLayer::pack(RpqForward form) {
  QF_REQUIRE(codebooks_.device().is_cpu(), layer_type(), ": frozen RPQ layers run on the CPU; the layer is on ",
             codebooks_.device(), " (move it to the CPU before freeze())");
  const at::Tensor codebooks = codebooks_.detach().clone(), indices = indices_.detach().clone();
  const at::Tensor bias = bias_.defined() ? bias_.detach().clone() : at::Tensor();
  packed_ = pack_rpq(codebooks, indices, bias, form, layer_type());
  codebooks_ = codebooks, indices_ = indices, bias_ = bias;
}

template <class Derived>
void RPQModule<Derived>::freeze() {
  if (packed_) return;
  pack(frozen_forward_kind());
  for (const char* name : {"codebooks", "bias"})
    if (this->parameters_.contains(name)) this->parameters_.erase(name);
  // LibTorch cannot remove a buffer: `indices` stays, sharing the packed weight's storage.
  this->named_buffers(/*recurse=*/false)["indices"].set_data(indices_);
}

// A frozen layer's device move is its packed weight's, which refuses all but the CPU before this
// layer changes; siblings a parent moved earlier stay moved (docs/rpq.md, "Devices").
template <class Derived>
void RPQModule<Derived>::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  if (packed_) packed_ = packed_->to(device);
  torch::nn::Module::to(device, dtype, non_blocking);
}

template <class Derived>
void RPQModule<Derived>::to(torch::Device device, bool non_blocking) {
  if (packed_) packed_ = packed_->to(device);
  torch::nn::Module::to(device, non_blocking);
}

int64_t RPQLayer::dense_weight_bytes() const { return S_ * C_ * static_cast<int64_t>(sizeof(float)); }

std::string RPQLayer::kernel(int64_t) const { return "rpq_expand+dense"; }

void RPQLayer::set_rpq_state(const at::Tensor& codebooks, const at::Tensor& indices, const at::Tensor& bias) {
  require_unfrozen("set_rpq_state");
  QF_REQUIRE(codebooks.sizes() == codebooks_.sizes(), layer_type(), ": codebooks of shape ", codebooks.sizes(),
             ", layer holds ", codebooks_.sizes());
  QF_REQUIRE(indices.sizes() == indices_.sizes() && indices.scalar_type() == at::kByte, layer_type(),
             ": indices must be uint8 of shape ", indices_.sizes(), ", got ", indices.scalar_type(), " ", indices.sizes());
  QF_REQUIRE(!bias.defined() || (bias_.defined() && bias.sizes() == bias_.sizes()), layer_type(),
             ": bias does not match the layer's");
  QF_REQUIRE(at::isFloatingType(codebooks.scalar_type()) && at::isfinite(codebooks).all().item<bool>(), layer_type(),
             ": codebooks must be finite floats");
  QF_REQUIRE(!bias.defined() || at::isfinite(bias).all().item<bool>(), layer_type(), ": bias holds NaN or inf");
  at::NoGradGuard g;
  codebooks_.copy_(codebooks);
  indices_.copy_(indices);
  if (bias.defined()) bias_.copy_(bias);
}

// ---- Linear ---------------------------------------------------------------------------------

RPQLinearImpl::RPQLinearImpl(const torch::nn::LinearOptions& o, int64_t num_codebooks)
    : options(o), num_codebooks_option(num_codebooks) {
  reset();
}

void RPQLinearImpl::reset() {
  init_rpq(*this, options.out_features(), options.in_features(), num_codebooks_option, "out_features");
  // torch::nn::Linear's kaiming_uniform(a = sqrt(5)): U(-1/sqrt(in), 1/sqrt(in)), bias likewise.
  const double bound = 1.0 / std::sqrt(static_cast<double>(options.in_features()));
  init_codebooks_uniform(bound);
  bias_ = options.bias() ? register_parameter("bias", at::empty({options.out_features()}).uniform_(-bound, bound)) : at::Tensor();
}

at::Tensor RPQLinearImpl::weight() const { return expanded(); }

std::string RPQLinearImpl::kernel(int64_t rows) const {
  return rows <= kLutMaxRows ? "rpq_lut" : "rpq_expand+at::linear";
}

at::Tensor RPQLinearImpl::forward(const at::Tensor& x) {
  if (packed_) return packed_->forward(x, FrozenInput{});
  return rpq_linear(x, codebooks_, indices_, bias_);
}

// ---- Embedding ------------------------------------------------------------------------------

RPQEmbeddingImpl::RPQEmbeddingImpl(const torch::nn::EmbeddingOptions& o, int64_t num_codebooks)
    : options(o), num_codebooks_option(num_codebooks) {
  reset();
}

void RPQEmbeddingImpl::reset() {
  QF_REQUIRE(!options.max_norm(), "RPQEmbedding: max_norm would renormalise shared sub-vectors; not supported");
  QF_REQUIRE(!options.sparse(), "RPQEmbedding: sparse gradients are not supported (codebooks are dense)");
  init_rpq(*this, options.embedding_dim(), options.num_embeddings(), num_codebooks_option, "embedding_dim");
  at::NoGradGuard g;
  codebooks_.normal_();  // torch::nn::Embedding's N(0, 1)
}

at::Tensor RPQEmbeddingImpl::weight() const { return expanded().t(); }

at::Tensor RPQEmbeddingImpl::forward(const at::Tensor& ids) {
  if (packed_) return packed_->forward(ids, FrozenInput{});
  at::Tensor rows = rpq_gather_rows(codebooks_, indices_, ids);
  if (options.padding_idx()) {
    int64_t pad = *options.padding_idx();
    if (pad < 0) pad += C_;
    rows = at::where((ids == pad).unsqueeze(-1), rows.detach(), rows);
  }
  return rows;
}

// ---- convolutions ---------------------------------------------------------------------------

namespace {

template <size_t N>
int64_t rpq_elems(const torch::ExpandingArray<N>& a) {
  int64_t p = 1;
  for (size_t i = 0; i < N; ++i) p *= (*a)[i];
  return p;
}

template <size_t N>
std::vector<int64_t> rpq_dims(const torch::ExpandingArray<N>& a) {
  return std::vector<int64_t>(a->begin(), a->end());
}

// Explicit padding sizes: ConvTranspose options hold them; Conv options hold a variant that may
// also be 'same' / 'valid' (nullptr then).
template <size_t N>
const torch::ExpandingArray<N>* rpq_padding(const torch::ExpandingArray<N>& p) {
  return &p;
}
template <size_t N, class Variant>
const torch::ExpandingArray<N>* rpq_padding(const Variant& p) {
  return nn::variant_if<torch::ExpandingArray<N>>(&p);
}

}  // namespace

template <size_t Dims, bool Transposed>
RPQConvImpl<Dims, Transposed>::RPQConvImpl(Options o, int64_t num_codebooks)
    : options(std::move(o)), num_codebooks_option(num_codebooks) {
  reset();
}

template <size_t Dims, bool Transposed>
const char* RPQConvImpl<Dims, Transposed>::layer_type() const {
  static const char* names[2][3] = {{"RPQConv1d", "RPQConv2d", "RPQConv3d"},
                                    {"RPQConvTranspose1d", "RPQConvTranspose2d", "RPQConvTranspose3d"}};
  return names[Transposed ? 1 : 0][Dims - 1];
}

template <size_t Dims, bool Transposed>
void RPQConvImpl<Dims, Transposed>::reset() {
  const int64_t in = options.in_channels(), out = options.out_channels(), g = options.groups();
  QF_REQUIRE(g >= 1 && in % g == 0 && out % g == 0, layer_type(), ": in_channels ", in, " and out_channels ", out,
             " must be divisible by groups ", g);
  QF_REQUIRE(nn::variant_if<torch::enumtype::kZeros>(&options.padding_mode()), layer_type(),
             ": only zero padding is supported");
  QF_REQUIRE(rpq_padding<Dims>(options.padding()), layer_type(),
             ": padding must be explicit sizes ('same'/'valid' are not supported)");
  const int64_t k = rpq_elems<Dims>(options.kernel_size());
  int64_t fan_in;
  if constexpr (Transposed) {
    // Weight [in, out / g, k...]; split along out / g.
    init_rpq(*this, out / g, in * k, num_codebooks_option, "out_channels / groups");
    fan_in = (out / g) * k;  // torch's fan-in of a [in, out / g, k...] tensor
  } else {
    init_rpq(*this, out, (in / g) * k, num_codebooks_option, "out_channels");
    fan_in = (in / g) * k;
  }
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  init_codebooks_uniform(bound);
  bias_ = options.bias() ? this->register_parameter("bias", at::empty({out}).uniform_(-bound, bound)) : at::Tensor();
}

template <size_t Dims, bool Transposed>
std::vector<int64_t> RPQConvImpl<Dims, Transposed>::weight_shape() const {
  const int64_t in = options.in_channels(), out = options.out_channels(), g = options.groups();
  std::vector<int64_t> shape = Transposed ? std::vector<int64_t>{in, out / g} : std::vector<int64_t>{out, in / g};
  const std::vector<int64_t> k = rpq_dims<Dims>(options.kernel_size());
  shape.insert(shape.end(), k.begin(), k.end());
  return shape;
}

template <size_t Dims, bool Transposed>
at::Tensor RPQConvImpl<Dims, Transposed>::weight() const {
  std::vector<int64_t> shape = weight_shape();
  if constexpr (Transposed) {
    std::swap(shape[0], shape[1]);  // split-first [out / g, in, k...], then back to [in, out / g, k...]
    return expanded().view(shape).transpose(0, 1).contiguous();
  }
  return expanded().view(shape);
}

template <size_t Dims, bool Transposed>
at::Tensor RPQConvImpl<Dims, Transposed>::split_of(const at::Tensor& w) const {
  if constexpr (Transposed) return w.transpose(0, 1).reshape({S_, C_});
  return w.reshape({S_, C_});
}

template <size_t Dims, bool Transposed>
at::Tensor RPQConvImpl<Dims, Transposed>::forward(const at::Tensor& x) {
  const auto* pad = rpq_padding<Dims>(options.padding());
  QF_REQUIRE(pad, layer_type(), ": padding must be explicit sizes ('same'/'valid' are not supported)");
  const at::Tensor w = weight(), b = layer_bias();
  const auto stride = rpq_dims<Dims>(options.stride()), padding = rpq_dims<Dims>(*pad), dilation = rpq_dims<Dims>(options.dilation());
  if constexpr (Transposed) {
    const auto out_pad = rpq_dims<Dims>(options.output_padding());
    if constexpr (Dims == 1) return at::conv_transpose1d(x, w, b, stride, padding, out_pad, options.groups(), dilation);
    if constexpr (Dims == 2) return at::conv_transpose2d(x, w, b, stride, padding, out_pad, options.groups(), dilation);
    if constexpr (Dims == 3) return at::conv_transpose3d(x, w, b, stride, padding, out_pad, options.groups(), dilation);
  } else {
    if constexpr (Dims == 1) return at::conv1d(x, w, b, stride, padding, dilation, options.groups());
    if constexpr (Dims == 2) return at::conv2d(x, w, b, stride, padding, dilation, options.groups());
    if constexpr (Dims == 3) return at::conv3d(x, w, b, stride, padding, dilation, options.groups());
  }
}

template class RPQModule<RPQLinearImpl>;
template class RPQModule<RPQEmbeddingImpl>;
template class RPQModule<RPQBilinearImpl>;
template class RPQModule<RPQConvImpl<1, false>>;
template class RPQModule<RPQConvImpl<2, false>>;
template class RPQModule<RPQConvImpl<3, false>>;
template class RPQModule<RPQConvImpl<1, true>>;
template class RPQModule<RPQConvImpl<2, true>>;
template class RPQModule<RPQConvImpl<3, true>>;
template class RPQConvImpl<1, false>;
template class RPQConvImpl<2, false>;
template class RPQConvImpl<3, false>;
template class RPQConvImpl<1, true>;
template class RPQConvImpl<2, true>;
template class RPQConvImpl<3, true>;

// ---- Bilinear -------------------------------------------------------------------------------

RPQBilinearImpl::RPQBilinearImpl(const torch::nn::BilinearOptions& o, int64_t num_codebooks)
    : options(o), num_codebooks_option(num_codebooks) {
  reset();
}

void RPQBilinearImpl::reset() {
  init_rpq(*this, options.out_features(), options.in1_features() * options.in2_features(), num_codebooks_option,
           "out_features");
  // torch::nn::Bilinear: U(-1/sqrt(in1), 1/sqrt(in1)) for weight and bias.
  const double bound = 1.0 / std::sqrt(static_cast<double>(options.in1_features()));
  init_codebooks_uniform(bound);
  bias_ = options.bias() ? register_parameter("bias", at::empty({options.out_features()}).uniform_(-bound, bound)) : at::Tensor();
}

at::Tensor RPQBilinearImpl::weight() const { return expanded().view(weight_shape()); }

at::Tensor RPQBilinearImpl::forward(const at::Tensor& x1, const at::Tensor& x2) {
  QF_REQUIRE(x1.dim() >= 1 && x2.dim() >= 1 && x1.size(-1) == options.in1_features() &&
                 x2.size(-1) == options.in2_features(),
             "RPQBilinear: inputs must end in ", options.in1_features(), " and ", options.in2_features(), " features");
  return at::bilinear(x1, x2, weight(), layer_bias());
}

std::vector<std::pair<std::string, const RPQLayer*>> rpq_layers(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, const RPQLayer*>> out;
  // The root first, then named_modules() without it: the root may live on the stack.
  if (const auto* root = dynamic_cast<const RPQLayer*>(&model)) out.emplace_back(std::string(), root);
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (const auto* l = dynamic_cast<const RPQLayer*>(item.value().get())) out.emplace_back(item.key(), l);
  return out;
}

std::vector<std::pair<std::string, RPQLayer*>> rpq_layers(torch::nn::Module& model) {
  std::vector<std::pair<std::string, RPQLayer*>> out;
  for (const auto& [path, l] : rpq_layers(static_cast<const torch::nn::Module&>(model)))
    out.emplace_back(path, const_cast<RPQLayer*>(l));  // the model is not const
  return out;
}

// ---- conversion -----------------------------------------------------------------------------

RPQConversion rpq_convert(const at::Tensor& w_split_in, int64_t H, const KMeansOptions& options) {
  QF_REQUIRE(w_split_in.defined() && w_split_in.dim() == 2, "rpq_convert: the weight must be [S, C]");
  const at::Tensor w = w_split_in.detach().to(at::kFloat).contiguous();
  const int64_t S = w.size(0), C = w.size(1);
  QF_REQUIRE(H >= 1 && S % H == 0, "rpq_convert: ", S, " rows are not divisible by num_codebooks = ", H);
  const int64_t D = S / H;
  RPQConversion r;
  r.codebooks = at::empty({H, kRpqCodebookSize, D}, at::kFloat);
  r.indices = at::empty({H, C}, at::kByte);
  for (int64_t h = 0; h < H; ++h) {
    KMeansOptions o = options;
    o.seed = options.seed + static_cast<uint64_t>(h);
    const KMeansResult km = kmeans(w.narrow(0, h * D, D).t(), kRpqCodebookSize, o);  // C points of D values
    r.codebooks[h].copy_(km.centroids);
    r.indices[h].copy_(km.assignment.to(at::kByte));
  }
  const at::Tensor err = rpq_expand(r.codebooks, r.indices) - w;
  const double norm = w.pow(2).sum().item<double>();
  r.relative_error = norm > 0 ? err.pow(2).sum().item<double>() / norm : 0.0;
  return r;
}

void rpq_load_from_float(RPQLayer& layer, const at::Tensor& weight, const at::Tensor& bias, const KMeansOptions& options,
                         double* relative_error) {
  layer.require_unfrozen("rpq_load_from_float");
  const std::vector<int64_t> shape = layer.weight_shape();
  QF_REQUIRE(weight.defined() && weight.sizes() == at::IntArrayRef(shape), layer.layer_type(), ": float weight of shape ",
             weight.defined() ? weight.sizes() : at::IntArrayRef{}, " does not fit the layer's ", at::IntArrayRef(shape));
  QF_REQUIRE(bias.defined() == layer.has_bias(), layer.layer_type(), ": the float layer ",
             bias.defined() ? "has a bias and the RPQ layer has none" : "has no bias and the RPQ layer has one",
             " (construct the RPQ layer with the same bias option)");
  const RPQConversion c = rpq_convert(layer.split_of(weight), layer.num_codebooks(), options);
  layer.set_rpq_state(c.codebooks, c.indices, bias);
  if (relative_error) *relative_error = c.relative_error;
}

RPQRefineReport rpq_refine_codebooks(RPQLinearImpl& layer, const at::Tensor& weight_in, const at::Tensor& inputs,
                                     double damp) {
  layer.require_unfrozen("rpq_refine_codebooks");
  const at::Tensor w = weight_in.detach().to(at::kDouble);
  QF_REQUIRE(weight_in.defined() && w.sizes() == at::IntArrayRef({layer.options.out_features(), layer.options.in_features()}),
             "RPQLinear: refine needs the float weight [out, in]");
  QF_REQUIRE(inputs.defined() && inputs.dim() == 2 && inputs.size(1) == layer.options.in_features() && inputs.size(0) > 0,
             "RPQLinear: refine needs calibration inputs [N, ", layer.options.in_features(), "]");
  const at::Tensor x = inputs.detach().to(at::kDouble);
  QF_REQUIRE(at::isfinite(x).all().item<bool>(), "RPQLinear: calibration inputs hold NaN or inf");
  QF_REQUIRE(damp > 0.0 && std::isfinite(damp), "RPQLinear: damp must be a positive number, got ", damp);
  const at::Tensor G = x.t().matmul(x);  // [C, C]
  const double ref = x.matmul(w.t()).pow(2).sum().item<double>();
  auto output_error = [&] {
    const at::Tensor diff = w - layer.weight().detach().to(at::kDouble);
    return ref > 0 ? x.matmul(diff.t()).pow(2).sum().item<double>() / ref : 0.0;
  };
  RPQRefineReport r;
  r.output_error_before = output_error();
  const int64_t H = layer.num_codebooks(), D = layer.codebook_dim(), C = layer.options.in_features();
  at::Tensor codebooks = layer.codebooks().detach().clone();
  for (int64_t h = 0; h < H; ++h) {
    const at::Tensor idx = layer.indices()[h].to(at::kLong);
    const at::Tensor AtG = at::zeros({kRpqCodebookSize, C}, G.options()).index_add_(0, idx, G);              // Aᵀ G
    at::Tensor AtGA = at::zeros({kRpqCodebookSize, kRpqCodebookSize}, G.options()).index_add_(1, idx, AtG);  // Aᵀ G A
    const at::Tensor rhs = AtG.matmul(w.narrow(0, h * D, D).t());                                            // [256, D]
    const at::Tensor used = at::zeros({kRpqCodebookSize}, at::kBool).index_fill_(0, idx, true);
    const at::Tensor diag = AtGA.diagonal();
    const double mean_diag = diag.masked_select(used).mean().item<double>();
    QF_REQUIRE(mean_diag > 0.0, "RPQLinear: the calibration inputs are zero on every column codebook ", h,
               " reads; nothing to refine against");
    // Codes no column picks keep their sub-vector: their rows are decoupled (identity rows).
    AtGA += at::diag(at::where(used, at::full({kRpqCodebookSize}, damp * mean_diag, at::kDouble),
                               at::ones({kRpqCodebookSize}, at::kDouble)));
    // The ridge pulls toward the current sub-vector (not toward zero).
    const at::Tensor keep = codebooks[h].to(at::kDouble);
    const at::Tensor b = at::where(used.unsqueeze(1), rhs + damp * mean_diag * keep, keep);
    try {
      codebooks[h].copy_(at::linalg_solve(AtGA, b).to(at::kFloat));
    } catch (const c10::Error& e) {
      throw Error(detail::str_cat("RPQLinear: refining codebook ", h, " failed (", e.what_without_backtrace(),
                                  "); raise damp"));
    }
  }
  layer.set_rpq_state(codebooks, layer.indices(), at::Tensor());
  r.output_error_after = output_error();
  return r;
}

}  // namespace qforge::nn
