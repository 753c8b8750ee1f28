// Linear: fake-quant forward for PTQ/QAT, integer kernels after freeze.
#include "framework/nn/linear.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"
#include "kernels/cpu/gemv_s4.h"
#include "kernels/cpu/gemv_s8.h"
#include "kernels/cpu/packed_linear.h"

namespace qforge::nn {

// Largest M the weight-only GEMV kernels serve; above it unpack + float GEMM is faster.
constexpr int64_t kWeightOnlyMaxM = 16;

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  if (frozen_) return frozen_forward(x);
  if (!quantized()) return torch::nn::LinearImpl::forward(x);
  ScopedTensorSwap swap(weight, quantize_weight(weight));
  return torch::nn::LinearImpl::forward(quantize_input(x));
}

void LinearImpl::check_scheme(const LayerScheme& scheme) const {
  QuantizableLayer::check_scheme(scheme);
  if (scheme.weights) {
    const QSpec& s = scheme.weights->spec;
    QF_REQUIRE(s.granularity != Granularity::kPerChannel || s.axis == 0 || s.axis == -2, path_,
               " (Linear): per-channel weight quantization is along the output features (axis 0), got axis ", s.axis);
    QF_REQUIRE(s.granularity != Granularity::kPerGroup || options.in_features() % s.group_size == 0, path_,
               " (Linear): in_features ", options.in_features(), " is not a multiple of group_size ", s.group_size);
  }
}

namespace {

bool all_zero(const at::Tensor& t) { return at::eq(t, 0).all().item<bool>(); }

// Static activations can feed the int8 kernels when they are symmetric qint8 within [-127, 127].
bool static_act_fits_kernels(const LayerScheme& s, std::string* why) {
  const QSpec& a = s.activation.spec;
  if (!(a.qtype == qint8 && a.granularity == Granularity::kPerTensor)) {
    *why = "static activations are not per-tensor qint8";
    return false;
  }
  if (!a.symmetric) {
    *why = "affine static activations (zero point) have no integer kernel";
    return false;
  }
  if (a.quant_min() < -127) {
    *why = "static activation grid includes -128 (use narrow_range for the integer kernels)";
    return false;
  }
  return true;
}

}  // namespace

void LinearImpl::install_frozen(QuantizedTensor fw) {
  QF_REQUIRE(!frozen_, path_, " (Linear): already frozen");
  QF_REQUIRE(fw.defined() && scheme_.weights, path_, " (Linear): install_frozen needs the saved scheme attached and a packed weight");
  const QParams qp = fw.qparams();
  QF_REQUIRE(fw.shape == std::vector<int64_t>({options.out_features(), options.in_features()}), path_,
             " (Linear): frozen weight has shape ", at::IntArrayRef(fw.shape), ", layer expects [",
             options.out_features(), ", ", options.in_features(), "]");
  const QSpec& ws = qp.spec;
  const ActivationMode act = scheme_.activations;

  Path kind = Path::kDequant;
  std::string why;
  const bool per_row_scales = ws.granularity != Granularity::kPerChannel || ws.axis == 0 || ws.axis == -2;
  const bool s8_weights = ws.qtype == qint8 && ws.symmetric && per_row_scales &&
                          ws.granularity != Granularity::kPerGroup && all_zero(qp.zero_point);
  const bool s4_weights = (ws.qtype == qint4 || ws.qtype == quint4) && per_row_scales;
  if (act == ActivationMode::kNone && (s8_weights || s4_weights)) {
    kind = s8_weights ? Path::kS8WeightOnly : Path::kS4WeightOnly;
  } else if (act == ActivationMode::kNone) {
    why = detail::str_cat("no weight-only kernel for ", ws.to_string(), " weights: dequantized per call");
  } else if (act == ActivationMode::kStatic && !static_act_fits_kernels(scheme_, &why)) {
    // why set
  } else if (ws.qtype == qint8 && ws.symmetric && per_row_scales && ws.granularity != Granularity::kPerGroup &&
             all_zero(qp.zero_point)) {
    kind = act == ActivationMode::kStatic ? Path::kS8Static : Path::kS8Dynamic;
  } else if ((ws.qtype == qint4 || ws.qtype == quint4) && per_row_scales) {
    kind = act == ActivationMode::kStatic ? Path::kS4Static : Path::kS4Dynamic;
  } else {
    why = detail::str_cat("no integer kernel for ", ws.to_string(), " weights");
  }

  const int64_t N = options.out_features(), K = options.in_features();
  const at::Tensor b = options.bias() && bias.defined() ? bias.detach().to(at::kFloat).contiguous() : at::Tensor();
  if (kind == Path::kS8Dynamic || kind == Path::kS8Static || kind == Path::kS8WeightOnly) {
    const at::Tensor scale_n = qp.scale.to(at::kFloat).expand({N}).contiguous();
    // One packed copy only (1 byte per weight); large M runs the GEMV kernels in row blocks.
    kernels::PackOptions opts;
    opts.onednn = false;
    s8_ = std::make_shared<kernels::PackedLinearS8>(fw.int_values(), scale_n, b, opts);
    fw.data = at::Tensor();
  } else if (kind == Path::kS4Dynamic || kind == Path::kS4Static || kind == Path::kS4WeightOnly) {
    const int64_t g = ws.granularity == Granularity::kPerGroup ? ws.group_size : K;
    const at::Tensor scale_ng = qp.scale.to(at::kFloat).reshape({N, -1}).expand({N, K / g}).contiguous();
    at::Tensor zero_ng;
    if (!all_zero(qp.zero_point)) zero_ng = qp.zero_point.to(at::kInt).reshape({N, -1}).expand({N, K / g}).contiguous();
    s4_ = std::make_shared<kernels::PackedLinearS4>(fw.int_values(), scale_ng, zero_ng, g, b, ws.qtype);
    fw.data = at::Tensor();
  }
  if (kind == Path::kS8Static || kind == Path::kS4Static) static_act_scale_ = input_q_->qparams().scale.item<float>();

  fweight_ = std::move(fw);
  path_kind_ = kind;
  // Release the float weight: the packed storage is the only copy from here on.
  if (parameters_.contains("weight")) parameters_.erase("weight");
  weight = at::Tensor();
  if (weight_q_) weight_q_->clear_cache();
  if ((s8_ || s4_) && options.bias()) {
    // The kernel object holds the bias too; keep one copy.
    parameters_.erase("bias");
    bias = at::Tensor();
  }
  frozen_ = true;
  fallback_ = why;
  kernel_ = "dequantize+at::linear";
  // Record the kernel (and any fallback) a decode-sized call picks; later calls update it.
  if (kind != Path::kDequant) frozen_forward(at::zeros({1, K}));
}

QuantizedTensor LinearImpl::frozen_weight() const {
  if (!frozen_) return {};
  QuantizedTensor fw = fweight_;
  if (s8_) fw.data = pack_quantized(s8_->weight(), fw.qparams()).data;
  if (s4_) fw.data = pack_quantized(s4_->weight(), fw.qparams()).data;
  return fw;
}

at::Tensor LinearImpl::frozen_bias() const {
  if (s8_) return s8_->bias();
  if (s4_) return s4_->bias();
  return options.bias() ? bias : at::Tensor();
}

int64_t LinearImpl::frozen_storage_bytes() const {
  // Kernel objects hold the codes, scales and bias; otherwise the packed QuantizedTensor does.
  if (s8_) return s8_->bytes();
  if (s4_) return s4_->bytes();
  int64_t bytes = fweight_.defined() ? fweight_.bytes() : 0;
  return bytes;
}

at::Tensor LinearImpl::frozen_forward(const at::Tensor& x_in) {
  const int64_t K = options.in_features(), N = options.out_features();
  QF_REQUIRE(x_in.size(-1) == K, path_, " (Linear): input has ", x_in.size(-1), " features, expected ", K);
  if (path_kind_ == Path::kDequant) {
    return at::linear(quantize_input(x_in), fweight_.dequantize(), options.bias() ? bias : at::Tensor());
  }
  const at::Tensor x = x_in.to(at::kFloat).reshape({-1, K}).contiguous();
  const int64_t M = x.size(0);
  std::vector<int64_t> out_shape(x_in.sizes().begin(), x_in.sizes().end());
  out_shape.back() = N;
  if (path_kind_ == Path::kS8WeightOnly || path_kind_ == Path::kS4WeightOnly) {
    if (M > kWeightOnlyMaxM) {
      // Large M: unpack once per call and let the float GEMM amortise it over the rows.
      kernel_ = "unpack+at::linear";
      fallback_ = detail::str_cat("M=", M, " > ", kWeightOnlyMaxM, ": the weight-only GEMV kernels are for small M");
      return at::linear(x, fweight_.defined() && fweight_.data.defined() ? fweight_.dequantize()
                                                                           : dequantize_int(s8_ ? s8_->weight() : s4_->weight(), fweight_.qparams()),
                        s8_ ? s8_->bias() : s4_->bias()).reshape(out_shape);
    }
    kernels::RunInfo info;
    at::Tensor y = s8_ ? s8_->run_weight_only(x, &info) : s4_->run_weight_only(x, &info);
    kernel_ = info.kernel;
    fallback_ = info.fallback;
    return y.reshape(out_shape);
  }
  at::Tensor y = at::empty({M, N}, at::kFloat);
  kernels::RunInfo info;
  switch (path_kind_) {
    case Path::kS8Dynamic: s8_->run(x.data_ptr<float>(), M, y.data_ptr<float>(), &info); break;
    case Path::kS4Dynamic: s4_->run(x.data_ptr<float>(), M, y.data_ptr<float>(), &info); break;
    case Path::kS8Static:
    case Path::kS4Static: {
      // The fake-quant formula of the static input quantizer, as int8 codes.
      const at::Tensor q = quantize_to_int8(x, input_q_->qparams()).contiguous();
      const at::Tensor a_scale = at::full({M}, static_act_scale_, at::kFloat);
      if (path_kind_ == Path::kS8Static) {
        kernels::gemv_s8s8f32(q.data_ptr<int8_t>(), M, a_scale.data_ptr<float>(), s8_->view(),
                              s8_->w_scale().data_ptr<float>(),
                              s8_->bias().defined() ? s8_->bias().data_ptr<float>() : nullptr, y.data_ptr<float>(),
                              &info);
      } else {
        kernels::gemv_s8s4f32(q.data_ptr<int8_t>(), M, a_scale.data_ptr<float>(), s4_->view(),
                              s4_->bias().defined() ? s4_->bias().data_ptr<float>() : nullptr, y.data_ptr<float>(),
                              &info);
      }
      break;
    }
    case Path::kDequant:
    case Path::kS8WeightOnly:
    case Path::kS4WeightOnly: break;
  }
  kernel_ = info.kernel;
  fallback_ = info.fallback;
  std::vector<int64_t> shape(x_in.sizes().begin(), x_in.sizes().end());
  shape.back() = N;
  return y.reshape(shape);
}

}  // namespace qforge::nn
