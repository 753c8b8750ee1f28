// The integer convolution formats of PackedWeight: int8 or int4 weights permuted to [N, kh, kw, C]
// for channels-last im2col and packed as the Linear kernels' weights (kernels/cpu/conv_s8.h), int8
// also as oneDNN's int8 convolution for large inputs; depthwise int8 weights as conv_dw_s8's
// [kh * kw, C] (kernels/cpu/conv_dw_s8.h); grouped convolutions as one such format per group.
// Static int8 activations only.
#include <ATen/ATen.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "framework/core/error.h"
#include "framework/core/isa.h"
#include "framework/nn/packed_weight_cpu.h"
#include "kernels/cpu/conv_dw_s8.h"
#include "kernels/cpu/conv_s8.h"
#include "kernels/cpu/gemm_s8s8s32_onednn.h"
#include "kernels/cpu/packed_linear.h"

namespace qforge::nn {
namespace {

using kernels::detail::OneDnnConvS8;

// The kernels' geometry of a convolution of this shape on a [batch, C, in_h, in_w] input.
kernels::ConvGeometry conv_geometry(const ConvShape& s, int64_t batch, int64_t in_h, int64_t in_w) {
  kernels::ConvGeometry g;
  g.batch = batch;
  g.in_channels = s.in_channels;
  g.in_h = in_h;
  g.in_w = in_w;
  g.out_channels = s.out_channels;
  g.kernel_h = s.kernel[0];
  g.kernel_w = s.kernel[1];
  g.stride_h = s.stride[0];
  g.stride_w = s.stride[1];
  g.pad_h = s.padding[0];
  g.pad_w = s.padding[1];
  g.dilation_h = s.dilation[0];
  g.dilation_w = s.dilation[1];
  g.groups = s.depthwise() ? 1 : s.groups;  // depthwise problems carry their own flag
  return g;
}

// A residual the epilogue can add (a float CPU tensor of the output's own NCHW shape, g's); any
// other is added after the convolution by add_residual.
bool residual_in_epilogue(const at::Tensor* r, const kernels::ConvGeometry& g) {
  return r != nullptr && r->is_cpu() && r->scalar_type() == at::kFloat && r->layout() == at::kStrided && !r->is_neg() &&
         r->sizes() == at::IntArrayRef{g.batch, g.out_channels, g.out_h(), g.out_w()};
}

// The weight half of a convolution call.
void set_weight(const kernels::PackedLinearS8& w, kernels::ConvS8Problem* p) {
  p->w8 = w.view();
  p->w_scale = w.w_scale().data_ptr<float>();
}
void set_weight(const kernels::PackedLinearS4& w, kernels::ConvS8Problem* p) {
  p->int4 = true;
  p->w4 = w.view();
}

// A depthwise convolution's int8 weight: pack_conv_dw_s8's int16 [kh * kw, C] and the scales [C].
struct PackedConvDwS8 {
  at::Tensor w;        // int16 [kh * kw, C]
  at::Tensor w_scale;  // float [C]
  int64_t bytes() const { return static_cast<int64_t>(w.nbytes() + w_scale.nbytes()); }
};
void set_weight(const PackedConvDwS8& w, kernels::ConvS8Problem* p) {
  p->depthwise = true;
  p->w_dw = w.w.data_ptr<int16_t>();
  p->w_scale = w.w_scale.data_ptr<float>();
}

// The codes of a packed weight in torch's [N, C / groups, kh, kw] order.
at::Tensor oihw_codes(const kernels::PackedLinearS8& k, const ConvShape& s);
at::Tensor oihw_codes(const kernels::PackedLinearS4& k, const ConvShape& s);
at::Tensor oihw_codes(const PackedConvDwS8& k, const ConvShape& s) {
  return k.w.t().reshape({s.out_channels, 1, s.kernel[0], s.kernel[1]}).to(at::kChar);
}
template <class Kernel>
at::Tensor im2col_oihw_codes(const Kernel& k, const ConvShape& s) {
  const int64_t N = s.out_channels, C = s.in_channels / s.groups, KH = s.kernel[0], KW = s.kernel[1];
  const at::Tensor packed = k.weight();  // [N, K or Kp] in (i, j, c) order
  return packed.narrow(1, 0, C * KH * KW).reshape({N, KH, KW, C}).permute({0, 3, 1, 2});
}
at::Tensor oihw_codes(const kernels::PackedLinearS8& k, const ConvShape& s) { return im2col_oihw_codes(k, s); }
at::Tensor oihw_codes(const kernels::PackedLinearS4& k, const ConvShape& s) { return im2col_oihw_codes(k, s); }

int64_t onednn_bytes(const OneDnnConvS8* onednn) { return onednn ? kernels::detail::onednn_bytes(*onednn) : 0; }

// Kernel = kernels::PackedLinearS8 (with oneDNN's convolution when built), PackedLinearS4 or
// PackedConvDwS8; the
// layer keeps the bias (FrozenInput::layer_bias), meta the spec and qparams.
template <class Kernel>
class PackedConvInt final : public CpuPackedWeight {
 public:
  PackedConvInt(std::shared_ptr<const Kernel> kernel, std::shared_ptr<const OneDnnConvS8> onednn, QuantizedTensor meta,
                LinearPath path, const ConvShape& shape, float static_scale, std::string who)
      : kernel_(std::move(kernel)), onednn_(std::move(onednn)), meta_(std::move(meta)), path_(path), shape_(shape),
        static_scale_(static_scale), who_(std::move(who)) {
    meta_.data = at::Tensor();
  }
  LinearPath path() const override { return path_; }
  at::Tensor forward(const at::Tensor& x, const FrozenInput& in) const override;
  QuantizedTensor weight() const override;
  at::Tensor bias() const override { return {}; }
  int64_t bytes() const override { return kernel_->bytes() + onednn_bytes(onednn_.get()); }
  float static_input_scale() const override { return static_scale_; }
  PackedWeightPtr to(const at::Device& device) const override {
    QF_REQUIRE(device.is_cpu(), who_, ": frozen integer convolutions run on the CPU, not ", device);
    return shared_from_this();
  }
  const std::shared_ptr<const OneDnnConvS8>& onednn() const { return onednn_; }

 private:
  std::shared_ptr<const Kernel> kernel_;
  std::shared_ptr<const OneDnnConvS8> onednn_;
  QuantizedTensor meta_;
  LinearPath path_;
  ConvShape shape_;
  float static_scale_;
  std::string who_;
};

template <class Kernel>
at::Tensor PackedConvInt<Kernel>::forward(const at::Tensor& x, const FrozenInput& in) const {
  const ConvShape& s = shape_;
  QF_REQUIRE(x.dim() == 4 && x.size(1) == s.in_channels, who_, ": input has shape ", x.sizes(), ", expected [batch, ",
             s.in_channels, ", ...]");
  const kernels::ConvGeometry g = conv_geometry(s, x.size(0), x.size(2), x.size(3));
  QF_REQUIRE(g.in_h > 0 && g.in_w > 0 && g.out_h() >= 1 && g.out_w() >= 1, who_, ": input of shape ", x.sizes(),
             " is smaller than the (dilated, padded) kernel");
  // The fake-quant formula of the static input quantizer, as int8 codes, channels last (no copy
  // of the float input when it is channels last already, as the previous integer conv leaves it).
  // int8 input: codes of this quantizer already (a requantized output), channels last.
  // (Conversions only where needed: at batch 1 a forward is a few hundred microseconds, and each
  // no-op ATen call on the way costs a dispatch.)
  const at::Tensor q = x.scalar_type() == at::kChar
                           ? x.permute({0, 2, 3, 1}).contiguous()
                           : quantize_to_int8((x.scalar_type() == at::kFloat ? x : x.to(at::kFloat)).permute({0, 2, 3, 1}),
                                              in.quantizer->qparams());
  const at::Tensor& lb = in.layer_bias;
  const at::Tensor b = !lb.defined() ? at::Tensor()
                       : lb.is_cpu() && lb.scalar_type() == at::kFloat && lb.is_contiguous()
                           ? lb
                           : lb.detach().to(at::kCPU, at::kFloat).contiguous();
  kernels::ConvS8Problem p;
  p.x_nhwc = q.data_ptr<int8_t>();
  p.a_scale = static_scale_;
  p.g = g;
  p.m = g.gemm_m();
  p.bias = b.defined() ? b.data_ptr<float>() : nullptr;
  p.relu = in.relu;
  p.onednn = onednn_.get();
  set_weight(*kernel_, &p);
  QF_REQUIRE(in.residual == nullptr || in.requant == nullptr, who_, ": a residual is added to float outputs only");
  if (in.requant != nullptr) {
    at::Tensor codes = at::empty({g.batch, g.out_h(), g.out_w(), g.out_channels}, at::kChar);
    kernels::RequantOut out;
    out.q = codes.data_ptr<int8_t>();
    out.inv = 1.0f / in.requant->scale_value();  // quantize_to_int8's reciprocal
    out.qmin = static_cast<int>(in.requant->spec.quant_min());
    out.qmax = static_cast<int>(in.requant->spec.quant_max());
    p.rq = &out;
    kernels::conv2d_s8(p);
    return codes.permute({0, 3, 1, 2});
  }
  at::Tensor y = at::empty({g.batch, g.out_h(), g.out_w(), g.out_channels}, at::kFloat);
  p.y = y.data_ptr<float>();
  // The residual in the epilogue where it has the output's shape (channels last: no copy when it
  // is already, as integer convolutions leave their outputs); else at::add after, then the ReLU.
  const at::Tensor* r = in.residual;
  const bool fused = residual_in_epilogue(r, g);
  const at::Tensor r_nhwc = fused ? r->permute({0, 2, 3, 1}).contiguous() : at::Tensor();
  if (fused) p.residual = r_nhwc.data_ptr<float>();
  if (r != nullptr && !fused) p.relu = false;
  kernels::conv2d_s8(p);
  // NCHW shape, channels-last memory (as LibTorch's quantized conv returns it).
  at::Tensor out = y.permute({0, 3, 1, 2});
  return r != nullptr && !fused ? add_residual(out, *r, in.relu, in.residual_in_place) : out;
}

template <class Kernel>
QuantizedTensor PackedConvInt<Kernel>::weight() const {
  const at::Tensor codes = oihw_codes(*kernel_, shape_).reshape(at::IntArrayRef(meta_.shape)).contiguous();
  QuantizedTensor fw = meta_;
  fw.data = pack_quantized(codes, fw.qparams()).data;
  return fw;
}

// oneDNN's int8 convolution of the oihw codes, reordered for a nominal input (batch 32, 16x16 or
// the dilated kernel's extent; other input sizes get their own primitive with the same weight
// format); null with *status when oneDNN cannot or offers only its reference implementation.
std::shared_ptr<const OneDnnConvS8> onednn_conv(const at::Tensor& oihw, const ConvShape& s, std::string* status) {
  const int64_t KH = s.kernel[0], KW = s.kernel[1];
  const kernels::ConvGeometry nominal = conv_geometry(s, 32, std::max<int64_t>(16, s.dilation[0] * (KH - 1) + 1),
                                                      std::max<int64_t>(16, s.dilation[1] * (KW - 1) + 1));
  auto conv = kernels::detail::onednn_conv_s8(oihw.data_ptr<int8_t>(), nominal, status);
  if (conv != nullptr && kernels::detail::onednn_impl(*conv).rfind("ref", 0) == 0) {
    *status = "oneDNN offers only its reference implementation (" + kernels::detail::onednn_impl(*conv) + ")";
    conv = nullptr;
  }
  return conv;
}

// Depthwise int8 weights [C, 1, kh, kw] (conv.cpp plans no other depthwise integer path).
PackedWeightPtr pack_conv_dw(QuantizedTensor fw, LinearPath path, const ConvShape& s, float static_scale,
                             const std::string& who) {
  const QParams qp = fw.qparams();
  const int64_t C = s.out_channels, taps = s.kernel[0] * s.kernel[1];
  QF_REQUIRE(path == LinearPath::kS8Static, who, ": depthwise convolutions run int8 weights only");
  QF_REQUIRE(fw.shape.size() >= 3 && fw.shape[0] == C && fw.numel() == C * taps, who, ": frozen weight has shape ",
             at::IntArrayRef(fw.shape), ", expected ", C, " x 1 x kernel ", s.kernel[0], "x", s.kernel[1]);
  require_symmetric_s8(qp.zero_point, who);
  const at::Tensor codes = fw.int_values().reshape({C, taps}).to(at::kChar).contiguous();
  auto kernel = std::make_shared<PackedConvDwS8>();
  kernel->w = at::empty({taps, C}, at::kShort);
  kernels::pack_conv_dw_s8(codes.data_ptr<int8_t>(), C, taps, kernel->w.data_ptr<int16_t>());
  kernel->w_scale = std::get<0>(int4_group_params(qp, C, taps, taps)).reshape({C}).to(at::kFloat).contiguous();
  return std::make_shared<PackedConvInt<PackedConvDwS8>>(std::move(kernel), nullptr, std::move(fw), path, s,
                                                         static_scale, who);
}

PackedWeightPtr pack_conv_dense(QuantizedTensor fw, LinearPath path, const ConvShape& s, float static_scale, bool onednn,
                                const std::string& who, std::string* onednn_missing);

// A grouped convolution (1 < groups < channels): as one oneDNN grouped convolution of the whole
// layer (int8 weights, `whole_`), else one groups = 1 packed convolution per group of C / groups
// input and N / groups output channels, run on its channel slice of the input (and of a residual),
// the outputs concatenated along the channels. The per-group formats are built at freeze when there
// is no oneDNN copy, and on the first input size oneDNN has no primitive for otherwise. Either way
// the same integer sums and epilogue per output element: the fake-quant forward's values, as for
// groups = 1.
class PackedConvGroups final : public CpuPackedWeight {
 public:
  PackedConvGroups(PackedWeightPtr whole, std::shared_ptr<const OneDnnConvS8> onednn, QuantizedTensor fw,
                   LinearPath path, const ConvShape& shape, float static_scale, std::string who)
      : whole_(std::move(whole)), onednn_(std::move(onednn)), meta_(std::move(fw)), path_(path), shape_(shape),
        static_scale_(static_scale), who_(std::move(who)) {
    if (whole_ == nullptr) groups_ = build_groups(meta_);
    meta_.data = at::Tensor();
  }
  LinearPath path() const override { return path_; }
  at::Tensor forward(const at::Tensor& x, const FrozenInput& in) const override {
    QF_REQUIRE(x.dim() == 4 && x.size(1) == shape_.in_channels, who_, ": input has shape ", x.sizes(),
               ", expected [batch, ", shape_.in_channels, ", ...]");
    const kernels::ConvGeometry g = conv_geometry(shape_, x.size(0), x.size(2), x.size(3));
    QF_REQUIRE(g.in_h > 0 && g.in_w > 0 && g.out_h() >= 1 && g.out_w() >= 1, who_, ": input of shape ", x.sizes(),
               " is smaller than the (dilated, padded) kernel");
    if (whole_ != nullptr) {
      // oneDNN's entry needs AVX-512 VNNI under the cap in force now (it may be lowered after freeze).
      if (usable_isa() >= Isa::kAvx512Vnni && kernels::detail::onednn_conv_primitive(*onednn_, g) != nullptr)
        return whole_->forward(x, in);
      std::call_once(groups_built_, [this] { groups_ = build_groups(whole_->weight()); });
    }
    return per_group(x, in, g);
  }
  QuantizedTensor weight() const override {
    if (whole_ != nullptr) return whole_->weight();
    std::vector<at::Tensor> codes;
    for (const PackedWeightPtr& g : groups_) codes.push_back(g->weight().int_values());
    QuantizedTensor fw = meta_;
    fw.data = pack_quantized(at::cat(codes, 0).reshape(at::IntArrayRef(meta_.shape)).contiguous(), fw.qparams()).data;
    return fw;
  }
  at::Tensor bias() const override { return {}; }
  int64_t bytes() const override {
    if (whole_ != nullptr) return whole_->bytes();
    int64_t b = 0;
    for (const PackedWeightPtr& g : groups_) b += g->bytes();
    return b;
  }
  float static_input_scale() const override { return static_scale_; }
  PackedWeightPtr to(const at::Device& device) const override {
    QF_REQUIRE(device.is_cpu(), who_, ": frozen integer convolutions run on the CPU, not ", device);
    return shared_from_this();
  }

 private:
  // One groups = 1 packed convolution per group from the layer's codes (no oneDNN copies: a group
  // runs im2col at every size).
  std::vector<PackedWeightPtr> build_groups(const QuantizedTensor& fw) const {
    std::vector<PackedWeightPtr> groups;  // assigned whole: a throw leaves no partial list
    const int64_t G = shape_.groups, ng = shape_.out_channels / G;
    const QParams qp = fw.qparams();
    const at::Tensor values = fw.int_values();
    ConvShape gs = shape_;
    gs.in_channels = shape_.in_channels / G, gs.out_channels = ng, gs.groups = 1;
    for (int64_t g = 0; g < G; ++g) {
      // Scales and zero points per output channel (or per channel and group along K) take the
      // group's rows; a per-tensor pair is shared.
      QParams sub = qp;
      if (qp.scale.dim() > 0 && qp.scale.size(0) == shape_.out_channels) {
        sub.scale = qp.scale.narrow(0, g * ng, ng).contiguous();
        sub.zero_point = qp.zero_point.narrow(0, g * ng, ng).contiguous();
      }
      QuantizedTensor part = pack_quantized(values.narrow(0, g * ng, ng).contiguous(), sub);
      groups.push_back(pack_conv_dense(std::move(part), path_, gs, static_scale_, /*onednn=*/false,
                                       detail::str_cat(who_, " group ", g), nullptr));
    }
    return groups;
  }
  // geo: the layer's geometry for x (forward's).
  at::Tensor per_group(const at::Tensor& x, const FrozenInput& in, const kernels::ConvGeometry& geo) const {
    const int64_t G = shape_.groups, cg = shape_.in_channels / G, ng = shape_.out_channels / G;
    // A residual of the output's own shape, float, is added per group in the epilogue; any other
    // (broadcast, another dtype) once after, as add_residual does for the other paths.
    const at::Tensor* r = in.residual;
    const bool fused = residual_in_epilogue(r, geo);
    std::vector<at::Tensor> outs;
    outs.reserve(static_cast<size_t>(G));
    for (int64_t g = 0; g < G; ++g) {
      FrozenInput sub = in;
      if (in.layer_bias.defined()) sub.layer_bias = in.layer_bias.narrow(0, g * ng, ng);
      at::Tensor rg;
      sub.residual = nullptr;
      if (fused) {
        rg = r->narrow(1, g * ng, ng);
        sub.residual = &rg;
        sub.residual_in_place = true;  // adds into this group's own fresh output
      } else if (r != nullptr) {
        sub.relu = false;  // after the residual, below
      }
      outs.push_back(groups_[static_cast<size_t>(g)]->forward(x.narrow(1, g * cg, cg), sub));
    }
    // Channels-last memory, as every integer convolution leaves its output.
    at::Tensor out = at::cat(outs, 1).contiguous(at::MemoryFormat::ChannelsLast);
    return r != nullptr && !fused ? add_residual(out, *r, in.relu, in.residual_in_place) : out;
  }

  PackedWeightPtr whole_;
  std::shared_ptr<const OneDnnConvS8> onednn_;
  mutable std::once_flag groups_built_;
  mutable std::vector<PackedWeightPtr> groups_;
  QuantizedTensor meta_;
  LinearPath path_;
  ConvShape shape_;
  float static_scale_;
  std::string who_;
};

}  // namespace

PackedWeightPtr pack_conv(QuantizedTensor fw, LinearPath path, const ConvShape& s, float static_scale, bool onednn,
                          const std::string& who, std::string* onednn_missing) {
  if (path != LinearPath::kS8Static && path != LinearPath::kS4Static) return pack_dequantize(std::move(fw), /*linear=*/false);
  if (s.depthwise()) return pack_conv_dw(std::move(fw), path, s, static_scale, who);
  if (s.groups > 1) {
    QF_REQUIRE(!fw.shape.empty() && fw.shape[0] == s.out_channels && s.in_channels % s.groups == 0 &&
                   s.out_channels % s.groups == 0,
               who, ": frozen weight has shape ", at::IntArrayRef(fw.shape), " for ", s.groups, " groups of ",
               s.in_channels, " -> ", s.out_channels, " channels");
    // The whole layer as oneDNN's grouped convolution where the plan wants it and oneDNN builds it.
    PackedWeightPtr whole;
    std::shared_ptr<const OneDnnConvS8> conv;
    if (path == LinearPath::kS8Static && onednn) {
      std::string status;
      PackedWeightPtr dense = pack_conv_dense(fw, path, s, static_scale, /*onednn=*/true, who, &status);
      conv = static_cast<const PackedConvInt<kernels::PackedLinearS8>&>(*dense).onednn();
      if (conv != nullptr) {
        whole = std::move(dense);
      } else if (onednn_missing != nullptr) {
        *onednn_missing = status.empty() ? "unavailable" : status;
      }
    }
    return std::make_shared<PackedConvGroups>(std::move(whole), std::move(conv), std::move(fw), path, s, static_scale, who);
  }
  return pack_conv_dense(std::move(fw), path, s, static_scale, onednn, who, onednn_missing);
}

namespace {

PackedWeightPtr pack_conv_dense(QuantizedTensor fw, LinearPath path, const ConvShape& s, float static_scale, bool onednn,
                                const std::string& who, std::string* onednn_missing) {
  const QParams qp = fw.qparams();
  const int64_t N = s.out_channels, C = s.in_channels / s.groups, KH = s.kernel[0], KW = s.kernel[1], K = C * KH * KW;
  QF_REQUIRE(!fw.shape.empty() && fw.shape[0] == N && fw.numel() == N * K, who, ": frozen weight has shape ",
             at::IntArrayRef(fw.shape), ", expected ", N, " x ", C, " x kernel ", KH, "x", KW);
  // [N, C, kh, kw] -> [N, kh, kw, C]: the K order of the channels-last im2col rows.
  const at::Tensor codes =
      fw.int_values().reshape({N, C, KH, KW}).permute({0, 2, 3, 1}).reshape({N, K}).to(at::kChar).contiguous();
  // One group along K: per-channel (or per-tensor) scales and zero points as [N, 1].
  auto [scale_n, zero_n] = int4_group_params(qp, N, K, K);
  if (path == LinearPath::kS8Static) {
    require_symmetric_s8(qp.zero_point, who);
    auto kernel = pack_s8_kernel(codes, scale_n.reshape({N}), at::Tensor());
    std::shared_ptr<const OneDnnConvS8> conv;
    if (onednn) {
      std::string status;
      conv = onednn_conv(fw.int_values().reshape({N, C, KH, KW}).to(at::kChar).contiguous(), s, &status);
      if (conv == nullptr && onednn_missing != nullptr) *onednn_missing = status.empty() ? "unavailable" : status;
    }
    return std::make_shared<PackedConvInt<kernels::PackedLinearS8>>(std::move(kernel), std::move(conv), std::move(fw),
                                                                    path, s, static_scale, who);
  }
  const int64_t Kp = kernels::round_up(K, kernels::kS4BlockK);
  // Zero columns up to Kp: the matching im2col columns are 0 too, so they add nothing (and 0 lies
  // on every 4-bit grid).
  const at::Tensor padded = Kp == K ? codes : at::constant_pad_nd(codes, {0, Kp - K}, 0).contiguous();
  auto kernel = std::make_shared<const kernels::PackedLinearS4>(padded, scale_n, zero_n, Kp, at::Tensor(), qp.spec.qtype);
  return std::make_shared<PackedConvInt<kernels::PackedLinearS4>>(std::move(kernel), nullptr, std::move(fw), path, s,
                                                                  static_scale, who);
}

}  // namespace

at::Tensor add_residual(at::Tensor y, const at::Tensor& r, bool relu, bool in_place) {
  y = in_place ? y.add_(r) : at::add(y, r);
  return relu ? at::relu(y) : y;
}

}  // namespace qforge::nn
