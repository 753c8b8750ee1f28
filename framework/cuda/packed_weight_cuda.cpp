// The CUDA forms of frozen Linear weights (see packed_weight_cuda.h): the int8 chain through
// cuda_ops::linear_s8 (weight-only: cuda_ops::linear_s8_weight_only), int4 through cuda_ops::linear_s4 (the GEMV for decode-sized inputs,
// dequantized per call otherwise), and a float weight.
#include "framework/cuda/packed_weight_cuda.h"

#include <ATen/ATen.h>

#include <vector>

#include "framework/core/error.h"
#include "framework/cuda/linear_cuda.h"
#include "framework/nn/packed_weight_cpu.h"

namespace qforge::nn {
namespace {

// What every CUDA form shares: the CPU original and the device its copies landed on.
class CudaPackedWeight : public PackedWeight {
 public:
  explicit CudaPackedWeight(PackedWeightPtr host) : host_(std::move(host)) {}
  LinearPath path() const override { return host_->path(); }
  at::Device device() const override { return device_; }
  QuantizedTensor weight() const override { return host_->weight(); }
  at::Tensor bias() const override { return host_->bias(); }
  int64_t bytes() const override { return host_->bytes(); }
  float static_input_scale() const override { return host_->static_input_scale(); }
  PackedWeightPtr to(const at::Device& device) const override { return host_->to(device); }

 protected:
  // Uploads the host's bias (when it holds one); the landing device is the codes' (torch::kCUDA
  // without an index means the current one).
  void upload_bias(const at::Device& device) {
    if (host_->bias().defined()) bias_ = host_->bias().to(device);
  }
  const at::Tensor& bias_or(const FrozenInput& in) const { return bias_.defined() ? bias_ : in.layer_bias; }

  PackedWeightPtr host_;
  at::Device device_{at::kCPU};
  at::Tensor bias_;
};

// Int8 weights: codes [N, K] and per-row scales [N]; weight-only runs the int8 GEMV at M <= 16.
class CudaInt8Linear final : public CudaPackedWeight {
 public:
  CudaInt8Linear(PackedWeightPtr host, const at::Device& device) : CudaPackedWeight(std::move(host)) {
    const QuantizedTensor fw = host_->weight();
    codes_ = fw.int_values().to(device);
    w_scale_ = fw.scale.to(at::kFloat).expand({fw.shape.at(0)}).contiguous().to(device);
    upload_bias(device);
    device_ = codes_.device();
  }
  at::Tensor forward(const at::Tensor& x_in, const FrozenInput& in) const override {
    const int64_t K = codes_.size(1);
    std::vector<int64_t> out_shape(x_in.sizes().begin(), x_in.sizes().end());
    out_shape.back() = codes_.size(0);
    const at::Tensor x = x_in.to(at::kFloat).reshape({-1, K});
    kernels::RunInfo info;
    if (path() == LinearPath::kS8WeightOnly)
      return cuda_ops::linear_s8_weight_only(x.contiguous(), codes_, w_scale_, bias_, &info).reshape(out_shape);
    if (path() == LinearPath::kS8Dynamic && in.quantizer &&
        (in.quantizer->config().spec.qtype != qint8 || in.quantizer->config().clip_ratio != 1.0f)) {
      // Narrower or clipped dynamic rows (W4A4-style qint4; the CPU kernels take them as int8
      // codes) have no CUDA integer kernel: their fake-quant values through the dequantized weight.
      const at::Tensor w = codes_.to(at::kFloat) * w_scale_.unsqueeze(1);
      return at::linear(fake_quantize_input(in, x_in).to(at::kFloat), w, bias_or(in)).reshape(out_shape);
    }
    if (path() == LinearPath::kS8Dynamic)
      return cuda_ops::linear_s8(x.contiguous(), at::Tensor(), 0.0f, codes_, w_scale_, bias_, &info).reshape(out_shape);
    // The fake-quant formula of the static input quantizer, as int8 codes (ATen on the device).
    const at::Tensor q = quantize_to_int8(x, in.quantizer->qparams()).contiguous();
    return cuda_ops::linear_s8(at::Tensor(), q, static_input_scale(), codes_, w_scale_, bias_, &info)
        .reshape(out_shape);
  }

 private:
  at::Tensor codes_, w_scale_;
};

// 4-bit weights: the packed codes with [N, G] scales / zero points.
class CudaInt4Linear final : public CudaPackedWeight {
 public:
  CudaInt4Linear(PackedWeightPtr host, const at::Device& device) : CudaPackedWeight(std::move(host)) {
    const QuantizedTensor fw = host_->weight();
    const QParams qp = fw.qparams();
    N_ = fw.shape.at(0);
    K_ = fw.shape.at(1);
    group_size_ = int4_group_size(qp.spec, K_);
    is_signed_ = qp.spec.qtype.is_signed;
    // Where the tensor-core GEMV serves, only its tiled layout is kept on the device.
    tiled_ = cuda_ops::s4_tiles_serve(K_, group_size_, device);
    packed_ = fw.data.to(device).contiguous();
    if (tiled_) packed_ = cuda_ops::repack_s4_tiles(packed_, N_, K_);
    auto [scale_ng, zero_ng] = int4_group_params(qp, N_, K_, group_size_);
    group_scale_ = scale_ng.to(device);
    if (zero_ng.defined()) group_zero_ = zero_ng.to(device);
    upload_bias(device);
    device_ = packed_.device();
  }
  // Decode-sized inputs run the int4 GEMV on the packed codes; others dequantize per call.
  at::Tensor forward(const at::Tensor& x_in, const FrozenInput& in) const override {
    std::vector<int64_t> out_shape(x_in.sizes().begin(), x_in.sizes().end());
    out_shape.back() = N_;
    const at::Tensor x = fake_quantize_input(in, x_in).to(at::kFloat).reshape({-1, K_}).contiguous();
    kernels::RunInfo info;
    return cuda_ops::linear_s4(x, packed_, N_, K_, is_signed_, group_scale_, group_zero_, group_size_, tiled_, bias_,
                               &info)
        .reshape(out_shape);
  }

 private:
  int64_t N_ = 0, K_ = 0, group_size_ = 0;
  bool is_signed_ = true, tiled_ = false;
  at::Tensor packed_, group_scale_, group_zero_;
};

// Codebook, fp4 and dequantize-per-call weights: the dequantized float weight, uploaded once.
class CudaFloatLinear final : public CudaPackedWeight {
 public:
  CudaFloatLinear(PackedWeightPtr host, const at::Device& device) : CudaPackedWeight(std::move(host)) {
    float_weight_ = host_->weight().dequantize().to(device);
    upload_bias(device);
    device_ = float_weight_.device();
  }
  at::Tensor forward(const at::Tensor& x, const FrozenInput& in) const override {
    const at::Tensor xq = fake_quantize_input(in, x);
    // The look-up-table path takes float inputs; the dequantize path passes the input's dtype on.
    const bool float_input = path() == LinearPath::kLutWeightOnly || path() == LinearPath::kFp4WeightOnly ||
                             path() == LinearPath::kS8GroupWeightOnly;
    return at::linear(float_input ? xq.to(at::kFloat) : xq, float_weight_, bias_or(in));
  }

 private:
  at::Tensor float_weight_;
};

}  // namespace

PackedWeightPtr cuda_packed_weight(PackedWeightPtr host, const at::Device& device) {
  QF_REQUIRE(device.is_cuda() && cuda_ops::built(), "cannot move a frozen weight to ", device, ": ",
             cuda_ops::unavailable_reason());
  switch (host->path()) {
    case LinearPath::kS8Dynamic:
    case LinearPath::kS8Static:
    case LinearPath::kS8WeightOnly: return std::make_shared<CudaInt8Linear>(std::move(host), device);
    case LinearPath::kS4Dynamic:
    case LinearPath::kS4Static:
    case LinearPath::kS4WeightOnly: return std::make_shared<CudaInt4Linear>(std::move(host), device);
    case LinearPath::kLutWeightOnly:
    case LinearPath::kFp4WeightOnly:
    case LinearPath::kS8GroupWeightOnly:
    case LinearPath::kDequant: break;
  }
  return std::make_shared<CudaFloatLinear>(std::move(host), device);
}

}  // namespace qforge::nn
