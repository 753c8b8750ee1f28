// cuda_framework_test: qforge's own API on CUDA tensors, against the same calls on the CPU.
// fake_quantize (every granularity, float8, the STE gradient), the learnable (LSQ) ops, a QAT
// step of a model of qforge layers, and a frozen model moved to the GPU (describe() plans, the
// forward's kernels and results). Needs a CUDA-enabled LibTorch and a GPU: labelled "gpu", run by
// scripts/gpu-check; built everywhere so it keeps compiling against every LibTorch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <limits>
#include <string>

#include "fake_quant/cuda/fake_quantize_op.h"
#include "fake_quant/fake_quantize.h"
#include "fake_quant/lsq.h"
#include "framework/api/kernel_plan.h"
#include "framework/core/error.h"
#include "framework/core/qparams.h"
#include "framework/cuda/cuda_graph.h"
#include "framework/cuda/nonfinite_check.h"
#include "framework/models/bert.h"
#include "framework/models/kv_cache.h"
#include "framework/models/llama.h"
#include "framework/nn/conv.h"
#include "framework/nn/linear.h"
#include "framework/api/quantize.h"
#include "kernels/cuda/linear_s8_fused_rules.h"

namespace qforge {
namespace {

class CudaApi : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fq::cuda_fake_quantize_built())
        << "this qforge build has no CUDA override (built against a LibTorch without CUDA)";
    ASSERT_TRUE(torch::cuda::is_available()) << "no CUDA device visible to LibTorch";
  }
  const at::Device cuda{at::kCUDA, 0};
};

// Bitwise equality of two float tensors (NaN payloads included), whatever their devices.
::testing::AssertionResult bit_equal(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.detach().to(at::kCPU).contiguous(), w = want.detach().to(at::kCPU).contiguous();
  if (g.sizes() != w.sizes() || g.scalar_type() != w.scalar_type())
    return ::testing::AssertionFailure() << "shape/dtype " << g.sizes() << " " << g.scalar_type() << " vs "
                                         << w.sizes() << " " << w.scalar_type();
  if (g.scalar_type() == at::kBool) {
    if (!at::equal(g, w)) return ::testing::AssertionFailure() << "bool tensors differ";
    return ::testing::AssertionSuccess();
  }
  // A NaN matches any NaN (payloads are not part of the formulas; see cuda_kernels_test).
  const at::Tensor gi = g.view(at::kInt), wi = w.view(at::kInt);
  const at::Tensor diff = at::logical_and(at::ne(gi, wi), at::logical_not(at::logical_and(g.isnan(), w.isnan())));
  const int64_t n = diff.sum().item<int64_t>();
  if (n == 0) return ::testing::AssertionSuccess();
  const int64_t first = diff.flatten().nonzero()[0][0].item<int64_t>();
  return ::testing::AssertionFailure() << n << " of " << g.numel() << " elements differ; first at " << first
                                       << ": GPU " << g.flatten()[first].item<float>() << " vs CPU "
                                       << w.flatten()[first].item<float>();
}

QParams qparams_for(const at::Tensor& x, const QSpec& spec) {
  at::Tensor lo, hi;
  switch (spec.granularity) {
    case Granularity::kPerTensor:
      lo = x.min();
      hi = x.max();
      break;
    case Granularity::kPerChannel: {
      const at::Tensor m = x.movedim(spec.axis, 0).reshape({x.size(spec.axis), -1});
      lo = std::get<0>(m.min(1));
      hi = std::get<0>(m.max(1));
      break;
    }
    case Granularity::kPerGroup: {
      std::vector<int64_t> shape = x.sizes().vec();
      shape.back() /= spec.group_size;
      shape.push_back(spec.group_size);
      const at::Tensor g = x.reshape(shape);
      lo = std::get<0>(g.min(-1));
      hi = std::get<0>(g.max(-1));
      break;
    }
  }
  return calculate_qparams(lo.cpu(), hi.cpu(), spec);
}

TEST_F(CudaApi, FakeQuantizeMatchesCpuBitForBit) {
  torch::manual_seed(1);
  const at::Tensor x = at::randn({64, 96, 33}) * 3;
  struct Case {
    const char* name;
    QSpec spec;
  };
  std::vector<Case> cases;
  {
    QSpec s;
    s.qtype = qint8;
    cases.push_back({"per_tensor qint8 affine", s});
    s.symmetric = true;
    s.qtype = qint4;
    cases.push_back({"per_tensor qint4 symmetric", s});
    QSpec c;
    c.qtype = quint8;
    c.granularity = Granularity::kPerChannel;
    c.axis = 1;
    cases.push_back({"per_channel(axis=1) quint8", c});
    c.axis = 2;
    cases.push_back({"per_channel(axis=2) quint8 (channels last)", c});
    QSpec g;
    g.qtype = qint4;
    g.granularity = Granularity::kPerGroup;
    g.group_size = 11;
    g.symmetric = true;
    cases.push_back({"per_group(11) qint4", g});
    QSpec f;
    f.qtype = qfloat8_e4m3fn;
    f.symmetric = true;
    cases.push_back({"float8 e4m3 per_tensor", f});
    f.qtype = qfloat8_e5m2;
    f.granularity = Granularity::kPerChannel;
    f.axis = 0;
    cases.push_back({"float8 e5m2 per_channel", f});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const QParams qp = qparams_for(x, c.spec);
    const auto [y_cpu, m_cpu] = fake_quantize_cachemask(x, qp);
    const auto [y_gpu, m_gpu] = fake_quantize_cachemask(x.to(cuda), qp);
    EXPECT_TRUE(y_gpu.is_cuda());
    EXPECT_TRUE(bit_equal(y_gpu, y_cpu));
    EXPECT_TRUE(bit_equal(m_gpu, m_cpu));
    // qparams on the GPU too, as a model moved with ->to(cuda) has them.
    QParams qg = qp;
    qg.scale = qp.scale.to(cuda);
    qg.zero_point = qp.zero_point.to(cuda);
    EXPECT_TRUE(bit_equal(fake_quantize_forward(x.to(cuda), qg), y_cpu));
  }
}

TEST_F(CudaApi, StraightThroughGradientMatchesCpu) {
  torch::manual_seed(2);
  const at::Tensor x0 = at::randn({128, 300}) * 2;
  const at::Tensor dy = at::randn({128, 300});
  const at::Tensor scale = at::rand({128}) * 0.02 + 0.005;
  const at::Tensor zp = at::randint(-20, 20, {128}, at::kInt);
  at::Tensor xc = x0.clone().requires_grad_(true);
  at::Tensor xg = x0.to(cuda).requires_grad_(true);
  qforge::fake_quantize_per_channel_affine(xc, scale, zp, 0, -128, 127).backward(dy);
  qforge::fake_quantize_per_channel_affine(xg, scale.to(cuda), zp.to(cuda), 0, -128, 127).backward(dy.to(cuda));
  ASSERT_TRUE(xg.grad().defined());
  EXPECT_TRUE(xg.grad().is_cuda());
  EXPECT_TRUE(bit_equal(xg.grad(), xc.grad()));
  // Half-precision inputs come back in their dtype, on the device.
  const at::Tensor h = qforge::fake_quantize_per_tensor_affine(x0.to(cuda).to(at::kHalf), 0.05, 3, -128, 127);
  EXPECT_EQ(h.scalar_type(), at::kHalf);
  EXPECT_TRUE(h.is_cuda());
}

// Per channel (rows of x2 / dy2 [C, inner]), the sums of |dScale| and |dZeroPoint| terms of LSQ's
// backward (lsq_run_reference's formulas, in double): the scale of their rounding errors.
std::pair<at::Tensor, at::Tensor> lsq_term_magnitudes(const at::Tensor& x2, const at::Tensor& dy2,
                                                      const at::Tensor& scale, const at::Tensor& zero_point,
                                                      double qmin, double qmax, double gf) {
  const at::Tensor x = x2.to(at::kDouble), d = dy2.to(at::kDouble).abs();
  const at::Tensor s = scale.detach().cpu().to(at::kDouble).reshape({-1, 1});
  const at::Tensor z = zero_point.detach().cpu().to(at::kDouble).round().clamp(qmin, qmax).reshape({-1, 1});
  const at::Tensor q = (z + x / s).round();
  const at::Tensor out = at::logical_or(q < qmin, q > qmax);
  const at::Tensor bound = at::where(q < qmin, (qmin - z).abs(), (qmax - z).abs());
  const at::Tensor ts = at::where(out, d * bound, d * ((q - z) * s - x).abs() / s) * gf;
  const at::Tensor tz = at::where(out, d * s, at::zeros_like(d)) * gf;
  return {ts.sum(1), tz.sum(1)};
}

// Output and the gradient of x bit for bit after backward of dy; the gradients of scale and
// zero_point are sums over the elements, which the CPU adds in float lanes flushed to double every
// 64 vectors (fake_quantize_simd.h) and the GPU in double (fake_quant/cuda/lsq_backward_cuda.h):
// they agree within 2^-16 of the sums of |terms| (mags: {dScale's, dZeroPoint's} per channel).
void expect_same_learnable(const at::Tensor& y_cpu, const at::Tensor& y_gpu, const at::Tensor& dy,
                           const std::vector<at::Tensor>& leaves_cpu, const std::vector<at::Tensor>& leaves_gpu,
                           const std::pair<at::Tensor, at::Tensor>& mags) {
  EXPECT_TRUE(bit_equal(y_gpu, y_cpu));
  y_cpu.backward(dy);
  y_gpu.backward(dy.to(y_gpu.device()));
  EXPECT_TRUE(bit_equal(leaves_gpu[0].grad(), leaves_cpu[0].grad()));
  for (size_t i = 1; i < leaves_cpu.size(); ++i) {
    const at::Tensor g = leaves_gpu[i].grad(), c = leaves_cpu[i].grad();
    EXPECT_TRUE(g.device() == leaves_gpu[i].device()) << "leaf " << i;
    const at::Tensor err = (g.cpu().to(at::kDouble) - c.to(at::kDouble)).abs().reshape({-1});
    const at::Tensor bound = (i == 1 ? mags.first : mags.second) * std::ldexp(1.0, -16) + 1e-30;
    EXPECT_TRUE(at::all(err <= bound).item<bool>()) << "leaf " << i << ": |GPU - CPU| " << err << " bound " << bound;
  }
}

TEST_F(CudaApi, LearnableFakeQuantizeMatchesCpu) {
  torch::manual_seed(3);
  const at::Tensor x0 = at::randn({32, 64});
  const at::Tensor dy = at::randn({32, 64});
  const double gf = lsq_grad_factor(x0.numel(), 127);
  // Per tensor.
  {
    at::Tensor xc = x0.clone().requires_grad_(true), sc = at::full({1}, 0.03).requires_grad_(true),
               zc = at::full({1}, 1.3).requires_grad_(true);
    at::Tensor xg = x0.to(cuda).requires_grad_(true), sg = at::full({1}, 0.03, at::TensorOptions(cuda)).requires_grad_(true),
               zg = at::full({1}, 1.3, at::TensorOptions(cuda)).requires_grad_(true);
    expect_same_learnable(fake_quantize_learnable_per_tensor_affine(xc, sc, zc, -128, 127, gf),
                          fake_quantize_learnable_per_tensor_affine(xg, sg, zg, -128, 127, gf), dy, {xc, sc, zc},
                          {xg, sg, zg}, lsq_term_magnitudes(x0.reshape({1, -1}), dy.reshape({1, -1}), sc, zc, -128, 127, gf));
  }
  // Per channel.
  {
    const at::Tensor s0 = at::rand({32}) * 0.05 + 0.01, z0 = at::randn({32}) * 3;
    at::Tensor xc = x0.clone().requires_grad_(true), sc = s0.clone().requires_grad_(true),
               zc = z0.clone().requires_grad_(true);
    at::Tensor xg = x0.to(cuda).requires_grad_(true), sg = s0.to(cuda).requires_grad_(true),
               zg = z0.to(cuda).requires_grad_(true);
    expect_same_learnable(fake_quantize_learnable_per_channel_affine(xc, sc, zc, 0, -128, 127, gf),
                          fake_quantize_learnable_per_channel_affine(xg, sg, zg, 0, -128, 127, gf), dy, {xc, sc, zc},
                          {xg, sg, zg}, lsq_term_magnitudes(x0, dy, sc, zc, -128, 127, gf));
  }
}

TEST_F(CudaApi, BadQParamsAreRefusedOnTheGpuToo) {
  const at::Tensor x = at::randn({4, 8}, at::TensorOptions(cuda));
  EXPECT_THROW(qforge::fake_quantize_per_channel_affine(x, at::full({4}, -1.0f, at::TensorOptions(cuda)),
                                                at::zeros({4}, at::TensorOptions(cuda).dtype(at::kInt)), 0, -128, 127),
               Error);
  EXPECT_THROW(qforge::fake_quantize_per_channel_affine(x, at::full({3}, 0.1f), at::zeros({3}, at::kInt), 0, -128, 127),
               Error);
}

// ---- frozen layers on the GPU ----

// ||got - want|| / ||want|| (both moved to the CPU, float64).
double rel_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.detach().to(at::kCPU, at::kDouble), w = want.detach().to(at::kCPU, at::kDouble);
  return (g - w).norm().item<double>() / std::max(w.norm().item<double>(), 1e-30);
}

struct FrozenPair {
  nn::Linear cpu{nullptr}, gpu{nullptr};
};

// Two identical layers (same seed), quantized with `scheme`, calibrated on the same data when the
// activations are static, frozen on the CPU; the second is then moved to the GPU.
FrozenPair frozen_pair(int64_t in, int64_t out, const Scheme& scheme, const at::Tensor& calib, const at::Device& dev) {
  FrozenPair p;
  for (nn::Linear* l : {&p.cpu, &p.gpu}) {
    torch::manual_seed(7);
    *l = nn::Linear(in, out);
    quantize(*l, scheme);
    if (scheme.activations == ActivationMode::kStatic) {
      Calibration c(*l);
      (*l)->forward(calib);
    }
    freeze(*l);
  }
  p.gpu->to(dev);
  return p;
}

TEST_F(CudaApi, FrozenInt8LinearRunsCublasLtBitForBit) {
  torch::manual_seed(11);
  const at::Tensor x = at::randn({37, 768}) * 2;
  for (const ActivationMode act : {ActivationMode::kDynamicPerToken, ActivationMode::kStatic}) {
    SCOPED_TRACE(to_string(act));
    Scheme scheme(qint8);
    scheme.activations = act;
    scheme.observer = "minmax";
    FrozenPair p = frozen_pair(768, 3072, scheme, x, cuda);
    EXPECT_EQ(p.gpu->report().kernel, "gemm_s8s8s32_cublaslt");
    EXPECT_EQ(p.gpu->report().fallback_reason, "");
    const at::Tensor want = p.cpu->forward(x);
    const at::Tensor got = p.gpu->forward(x.to(cuda));
    EXPECT_TRUE(got.is_cuda());
    EXPECT_TRUE(bit_equal(got, want));
    // A 3-D input (batch, tokens, features) keeps its leading shape.
    const at::Tensor x3 = x.reshape({1, 37, 768});
    EXPECT_EQ(p.gpu->forward(x3.to(cuda)).sizes(), at::IntArrayRef({1, 37, 3072}));
    // Back on the CPU, the CPU kernels again.
    p.gpu->to(torch::kCPU);
    EXPECT_NE(p.gpu->report().kernel, "gemm_s8s8s32_cublaslt");
    EXPECT_TRUE(bit_equal(p.gpu->forward(x), want));
  }
}

TEST_F(CudaApi, FrozenInt8LinearFallsBackWhereCublasLtCannotRun) {
  torch::manual_seed(12);
  const at::Tensor x = at::randn({5, 768});
  Scheme scheme(qint8);
  scheme.activations = ActivationMode::kDynamicPerToken;
  FrozenPair p = frozen_pair(768, 1001, scheme, x, cuda);
  EXPECT_EQ(p.gpu->report().kernel, "gemm_s8s8s32_cuda");
  EXPECT_EQ(p.gpu->report().fallback_reason, "gemm_s8s8s32_cublaslt: N=1001 not a multiple of 4 (cuBLASLt IMMA m)");
  EXPECT_TRUE(bit_equal(p.gpu->forward(x.to(cuda)), p.cpu->forward(x)));
  // describe() of the model says the same.
  EXPECT_NE(describe(*p.gpu).find("gemm_s8s8s32_cuda"), std::string::npos) << describe(*p.gpu);
}

TEST_F(CudaApi, FrozenInt4AndWeightOnlyLinearOnTheGpu) {
  torch::manual_seed(13);
  struct Case {
    const char* name;
    Scheme scheme;
    const char* kernel;
    const char* mid_kernel;  // M = 2..16
    bool fallback;
  };
  Scheme w4(qint4);  // groups of 128
  w4.activations = ActivationMode::kDynamicPerToken;
  Scheme w4_only(qint4);
  Scheme w8_only(qint8);
  const char* staged = "gemv_f32s4_mma_staged_cuda";
  for (const Case& c : {Case{"int4 dynamic", w4, "gemv_f32s4_mma_cuda", staged, false},
                        Case{"int4 weight-only", w4_only, "gemv_f32s4_mma_cuda", staged, false},
                        Case{"int8 weight-only", w8_only, "gemv_f32s8_cuda", "", false}}) {
    SCOPED_TRACE(c.name);
    // M = 1 runs the int4 GEMV, M = 9 its staged form (plan: mid_m = 2; int8: gemv_f32s8_cuda at
    // every M <= 16), M = 40 dequantizes per call (plan: large_m = 17).
    const at::Tensor x = at::randn({9, 512});
    FrozenPair p = frozen_pair(512, 256, c.scheme, x, cuda);
    // describe() names both: the M = 1 kernel, then the staged one with its rows.
    const std::string mid = c.mid_kernel;
    EXPECT_EQ(p.gpu->report().kernel, mid.empty() ? c.kernel : std::string(c.kernel) + " | " + mid + " at M 2..16");
    EXPECT_EQ(p.gpu->report().fallback_reason != "", c.fallback) << p.gpu->report().fallback_reason;
    EXPECT_EQ(p.gpu->plan().mid_m_kernel, c.mid_kernel);
    // Same quantized weights and activation codes; only float summation order differs.
    for (const int64_t M : {1, 9, 40}) {
      const at::Tensor xm = at::randn({M, 512});
      EXPECT_LT(rel_error(p.gpu->forward(xm.to(cuda)), p.cpu->forward(xm)), 1e-5) << "M=" << M;
    }
    // A 3-D decode step [batch 2, 1 token, features] keeps its shape.
    EXPECT_EQ(p.gpu->forward(at::randn({2, 1, 512}).to(cuda)).sizes(), at::IntArrayRef({2, 1, 256}));
  }
}

TEST_F(CudaApi, FreezingOnTheGpuKeepsTheModelThere) {
  torch::manual_seed(14);
  const at::Tensor x = at::randn({16, 256});
  Scheme scheme(qint8);
  scheme.activations = ActivationMode::kStatic;
  scheme.observer = "minmax";
  torch::manual_seed(7);
  nn::Linear cpu(256, 128);
  torch::manual_seed(7);
  nn::Linear gpu(256, 128);
  gpu->to(cuda);
  quantize(cpu, scheme);
  quantize(gpu, scheme);
  {
    Calibration c(cpu);
    cpu->forward(x);
  }
  {
    Calibration c(gpu);
    gpu->forward(x.to(cuda));
  }
  freeze(cpu);
  freeze(gpu);
  EXPECT_EQ(gpu->report().kernel, "gemm_s8s8s32_cublaslt");
  EXPECT_TRUE(bit_equal(gpu->forward(x.to(cuda)), cpu->forward(x)));
  // The input must be where the frozen weight is.
  EXPECT_THROW(gpu->forward(x), Error);
  // Back on the CPU the CPU kernels run (the bias they hold is a host copy).
  gpu->to(torch::kCPU);
  EXPECT_TRUE(bit_equal(gpu->forward(x), cpu->forward(x)));
}

TEST_F(CudaApi, ToCudaWithoutAnIndexAndCheckpointLoadsWork) {
  torch::manual_seed(17);
  const at::Tensor x = at::randn({4, 256});
  Scheme scheme(qint8);
  scheme.activations = ActivationMode::kDynamicPerToken;
  FrozenPair p = frozen_pair(256, 128, scheme, x, at::Device(at::kCUDA));  // torch::kCUDA, no index
  EXPECT_TRUE(bit_equal(p.gpu->forward(x.to(cuda)), p.cpu->forward(x)));
  // A frozen weight installed into a layer already on the GPU (what checkpoint loading does).
  torch::manual_seed(7);
  nn::Linear fresh(256, 128);
  fresh->to(cuda);
  quantize(fresh, scheme);
  fresh->install_frozen(p.cpu->frozen_weight());
  EXPECT_EQ(fresh->report().kernel, "gemm_s8s8s32_cublaslt");
  EXPECT_TRUE(bit_equal(fresh->forward(x.to(cuda)), p.cpu->forward(x)));
}

TEST_F(CudaApi, QatStepOnTheGpuMatchesTheCpu) {
  torch::manual_seed(15);
  const at::Tensor x = at::randn({32, 64}), target = at::randn({32, 16});
  Scheme scheme(qint8);
  scheme.activations = ActivationMode::kStatic;
  scheme.observer = "minmax";
  std::vector<at::Tensor> weights;
  std::vector<std::vector<at::Tensor>> outputs(2), grads(2);
  int run = 0;
  for (const at::Device dev : {at::Device(at::kCPU), cuda}) {
    torch::manual_seed(7);
    nn::Linear lin(64, 16);
    lin->to(dev);
    quantize(lin, scheme);
    {
      Calibration c(lin);
      lin->forward(x.to(dev));
    }
    torch::optim::SGD opt(lin->parameters(), torch::optim::SGDOptions(0.1));
    QatController qat(*lin, QatOptions{});
    qat.begin_epoch();
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      const at::Tensor y = lin->forward(x.to(dev));
      const at::Tensor loss = at::mse_loss(y, target.to(dev));
      loss.backward();
      outputs[run].push_back(y.detach().cpu());
      grads[run].push_back(lin->weight.grad().detach().cpu());
      opt.step();
      qat.step();
    }
    weights.push_back(lin->weight.detach().cpu());
    ++run;
  }
  // The fake-quant forward and STE backward are bit-exact; the float GEMMs around them differ by
  // summation order, which can move a value across a rounding boundary now and then.
  for (size_t i = 0; i < outputs[0].size(); ++i) {
    EXPECT_LT(rel_error(outputs[1][i], outputs[0][i]), 1e-5) << "forward of step " << i;
    EXPECT_LT(rel_error(grads[1][i], grads[0][i]), 1e-4) << "weight gradient of step " << i;
  }
  EXPECT_LT(rel_error(weights[1], weights[0]), 1e-5);
}

TEST_F(CudaApi, FrozenConvRunsOnTheGpuThroughItsDequantizedWeight) {
  torch::manual_seed(16);
  const at::Tensor x = at::randn({2, 3, 16, 16});
  std::vector<at::Tensor> outs;
  for (const at::Device dev : {at::Device(at::kCPU), cuda}) {
    torch::manual_seed(7);
    nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).padding(1));
    quantize(conv, Scheme(qint8));
    freeze(conv);
    conv->to(dev);
    outs.push_back(conv->forward(x.to(dev)));
  }
  EXPECT_TRUE(outs[1].is_cuda());
  EXPECT_LT(rel_error(outs[1], outs[0]), 1e-5);
}

// Turns the one-launch int8 Linear on for a test and restores the switch after it.
struct FusedSwitchOn {
  bool was = cuda_linear_s8_fused();
  FusedSwitchOn() { set_cuda_linear_s8_fused(true); }
  ~FusedSwitchOn() { set_cuda_linear_s8_fused(was); }
};

// The one-launch int8 Linear (set_cuda_linear_s8_fused): the plan and describe() name it, every M
// equals the CPU frozen Linear bit for bit (dynamic and static activations), a shape its rules
// refuse runs the chain with the reason, and a non-finite input is refused as on the CPU.
TEST_F(CudaApi, FrozenInt8LinearRunsTheFusedKernelBitForBitCuda) {
  const FusedSwitchOn fused_on;
  torch::manual_seed(19);
  const at::Tensor calib = at::randn({64, 768}) * 2;
  for (const ActivationMode act : {ActivationMode::kDynamicPerToken, ActivationMode::kStatic}) {
    SCOPED_TRACE(to_string(act));
    Scheme scheme(qint8);
    scheme.activations = act;
    scheme.observer = "minmax";
    FrozenPair p = frozen_pair(768, 3072, scheme, calib, cuda);
    EXPECT_EQ(p.gpu->report().kernel, "linear_s8_fused_cuda");
    EXPECT_EQ(p.gpu->report().fallback_reason, "");
    EXPECT_NE(describe(*p.gpu).find("linear_s8_fused_cuda"), std::string::npos) << describe(*p.gpu);
    for (const int64_t M : {1, 3, 16, 37, 300}) {
      const at::Tensor x = at::randn({M, 768}) * 2;
      EXPECT_TRUE(bit_equal(p.gpu->forward(x.to(cuda)), p.cpu->forward(x))) << "M=" << M;
    }
  }
  Scheme dynamic(qint8);
  dynamic.activations = ActivationMode::kDynamicPerToken;
  const at::Tensor x = at::randn({5, 100});
  FrozenPair q = frozen_pair(100, 72, dynamic, x, cuda);
  EXPECT_EQ(q.gpu->report().kernel, "gemm_s8s8s32_cublaslt");
  EXPECT_EQ(q.gpu->report().fallback_reason, "linear_s8_fused_cuda: K=100 not a positive multiple of 32");
  EXPECT_TRUE(bit_equal(q.gpu->forward(x.to(cuda)), q.cpu->forward(x)));
  FrozenPair r = frozen_pair(768, 768, dynamic, calib, cuda);
  const CudaNonfiniteCheck saved_mode = cuda_nonfinite_check();
  set_cuda_nonfinite_check(CudaNonfiniteCheck::kSynchronous);  // raised by the bad call itself
  at::Tensor bad = at::randn({4, 768});
  bad[2][700] = std::numeric_limits<float>::quiet_NaN();
  try {
    r.gpu->forward(bad.to(cuda));
    ADD_FAILURE() << "a NaN input was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("activation row 2 column 700 is not finite"), std::string::npos) << e.what();
  }
  set_cuda_nonfinite_check(saved_mode);
}

// The fused kernel's split-K path through the framework: at M <= 16 BERT's FFN-down shape runs
// in K slices (fused_splits_for), and repeated calls of two layers on one stream (shared tickets,
// fresh workspaces) stay bit for bit the CPU frozen Linear's.
TEST_F(CudaApi, FusedInt8LinearSplitKRepeatsBitForBitCuda) {
  const FusedSwitchOn fused_on;
  ASSERT_GT(cuda::fused_splits_for(cuda::FusedTile::k16x64, 768, 3072), 1);
  torch::manual_seed(23);
  Scheme scheme(qint8);
  scheme.activations = ActivationMode::kDynamicPerToken;
  const at::Tensor calib = at::randn({32, 3072});
  FrozenPair down = frozen_pair(3072, 768, scheme, calib, cuda);
  FrozenPair up = frozen_pair(768, 3072, scheme, at::randn({32, 768}), cuda);
  for (int round = 0; round < 3; ++round)
    for (const int64_t M : {1, 7, 16}) {
      const at::Tensor xd = at::randn({M, 3072}) * 3, xu = at::randn({M, 768});
      EXPECT_TRUE(bit_equal(down.gpu->forward(xd.to(cuda)), down.cpu->forward(xd))) << "down M=" << M;
      EXPECT_TRUE(bit_equal(up.gpu->forward(xu.to(cuda)), up.cpu->forward(xu))) << "up M=" << M;
    }
}

// ---- the non-finite check of dynamic quantization (framework/cuda/nonfinite_check.h) ----

// Restores the process's check mode when a test ends.
struct NonfiniteModeGuard {
  CudaNonfiniteCheck saved = cuda_nonfinite_check();
  ~NonfiniteModeGuard() { set_cuda_nonfinite_check(saved); }
};

// The qforge::Error message f throws ("" when it throws none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A dynamic int8 Linear (cuBLASLt path) and an input with one NaN at row 2, column 5.
struct NanCase {
  FrozenPair p;
  at::Tensor clean, bad;
};
NanCase nan_case(const at::Device& cuda) {
  torch::manual_seed(21);
  Scheme scheme(qint8);
  scheme.activations = ActivationMode::kDynamicPerToken;
  NanCase c{frozen_pair(256, 128, scheme, at::Tensor(), cuda), at::randn({7, 256}), at::Tensor()};
  c.bad = c.clean.clone();
  c.bad[2][5] = std::numeric_limits<float>::quiet_NaN();
  return c;
}

TEST_F(CudaApi, DeferredNonfiniteCheckReportsAtTheExplicitCheck) {
  NonfiniteModeGuard mode;
  set_cuda_nonfinite_check(CudaNonfiniteCheck::kDeferred);
  EXPECT_EQ(error_of([] { cuda_check_nonfinite(); }), "");  // nothing left over from earlier tests
  NanCase c = nan_case(cuda);
  EXPECT_EQ(error_of([&] { c.p.gpu->forward(c.bad.to(cuda)); }), "");  // the call itself does not wait
  const std::string err = error_of([] { cuda_check_nonfinite(); });
  EXPECT_NE(err.find("row 2 column 5 is not finite"), std::string::npos) << err;
  // Reported once; the layer then runs as before.
  EXPECT_EQ(error_of([] { cuda_check_nonfinite(); }), "");
  EXPECT_TRUE(bit_equal(c.p.gpu->forward(c.clean.to(cuda)), c.p.cpu->forward(c.clean)));
  EXPECT_EQ(error_of([] { cuda_check_nonfinite(); }), "");
}

TEST_F(CudaApi, DeferredNonfiniteCheckRaisesAtTheNextCallOnTheDevice) {
  NonfiniteModeGuard mode;
  set_cuda_nonfinite_check(CudaNonfiniteCheck::kDeferred);
  NanCase c = nan_case(cuda);
  EXPECT_EQ(error_of([&] { c.p.gpu->forward(c.bad.to(cuda)); }), "");
  torch::cuda::synchronize();  // the async read has landed
  const at::Tensor x = c.clean.to(cuda);
  const std::string err = error_of([&] { c.p.gpu->forward(x); });
  EXPECT_NE(err.find("row 2 column 5 is not finite"), std::string::npos) << err;
  EXPECT_TRUE(bit_equal(c.p.gpu->forward(x), c.p.cpu->forward(c.clean)));
  EXPECT_EQ(error_of([] { cuda_check_nonfinite(); }), "");
}

TEST_F(CudaApi, SynchronousNonfiniteCheckRaisesAtOnce) {
  NonfiniteModeGuard mode;
  set_cuda_nonfinite_check(CudaNonfiniteCheck::kSynchronous);
  NanCase c = nan_case(cuda);
  const std::string err = error_of([&] { c.p.gpu->forward(c.bad.to(cuda)); });
  EXPECT_NE(err.find("row 2 column 5 is not finite"), std::string::npos) << err;
  EXPECT_TRUE(bit_equal(c.p.gpu->forward(c.clean.to(cuda)), c.p.cpu->forward(c.clean)));
  EXPECT_EQ(error_of([] { cuda_check_nonfinite(); }), "");
}

// ---- CUDA graphs (framework/cuda/cuda_graph.h) ----

// Three frozen Linears, one per CUDA path: int8 dynamic (cuBLASLt), int4 weight-only (the GEMV
// at M <= 16, dequantize + at::linear above), int8 static.
struct FrozenStack {
  nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
  at::Tensor forward(const at::Tensor& x) { return c->forward(at::relu(b->forward(a->forward(x)))); }
};
FrozenStack frozen_stack(const at::Device& dev) {
  torch::manual_seed(23);
  FrozenStack s{nn::Linear(256, 512), nn::Linear(512, 384), nn::Linear(384, 256)};
  Scheme dynamic(qint8);
  dynamic.activations = ActivationMode::kDynamicPerToken;
  Scheme static8(qint8);
  static8.activations = ActivationMode::kStatic;
  static8.observer = "minmax";
  quantize(s.a, dynamic);
  quantize(s.b, Scheme(qint4));
  quantize(s.c, static8);
  {
    Calibration cal(s.c);
    s.c->forward(at::randn({16, 384}));
  }
  for (nn::Linear* l : {&s.a, &s.b, &s.c}) {
    freeze(*l);
    (*l)->to(dev);
  }
  return s;
}

TEST_F(CudaApi, CapturedFrozenLinearsReplayTheEagerOutputsBitForBit) {
  FrozenStack s = frozen_stack(cuda);
  for (const int64_t M : {1, 9, 40}) {  // the GEMV, its staged form, dequantize + at::linear
    SCOPED_TRACE("M=" + std::to_string(M));
    at::Tensor x = at::randn({M, 256}).to(cuda);  // the graph's input, refilled in place
    CudaGraphStep graph;
    const std::vector<at::Tensor> out = graph.capture([&] { return std::vector<at::Tensor>{s.forward(x)}; });
    ASSERT_EQ(out.size(), 1u);
    for (int replay = 0; replay < 3; ++replay) {
      const at::Tensor fresh = at::randn({M, 256});
      x.copy_(fresh.to(cuda));
      out[0].fill_(std::numeric_limits<float>::quiet_NaN());  // an unwritten element fails
      graph.replay();
      const at::Tensor want = s.forward(fresh.to(cuda));  // eager, same kernels
      EXPECT_TRUE(bit_equal(out[0], want)) << "replay " << replay;
    }
  }
  EXPECT_THROW(CudaGraphStep().replay(), Error);
}

TEST_F(CudaApi, NonfiniteInputOfAReplayIsReportedByTheExplicitCheck) {
  NonfiniteModeGuard mode;
  for (const CudaNonfiniteCheck m : {CudaNonfiniteCheck::kDeferred, CudaNonfiniteCheck::kSynchronous}) {
    set_cuda_nonfinite_check(m);
    EXPECT_EQ(error_of([] { cuda_check_nonfinite(); }), "");
    FrozenStack s = frozen_stack(cuda);
    at::Tensor x = at::randn({7, 256}).to(cuda);
    CudaGraphStep graph;
    const std::vector<at::Tensor> out = graph.capture([&] { return std::vector<at::Tensor>{s.forward(x)}; });
    graph.replay();
    EXPECT_EQ(error_of([] { cuda_check_nonfinite(); }), "");  // clean replays record nothing
    at::Tensor bad = at::randn({7, 256});
    bad[4][17] = std::numeric_limits<float>::infinity();
    x.copy_(bad.to(cuda));
    EXPECT_EQ(error_of([&] { graph.replay(); }), "");  // a replay never waits
    const std::string err = error_of([] { cuda_check_nonfinite(); });
    EXPECT_NE(err.find("row 4 column 17 is not finite"), std::string::npos) << err;
    EXPECT_NE(err.find("CUDA graph replay"), std::string::npos) << err;
    // The slot was reset: a clean replay after it reports nothing.
    x.copy_(at::randn({7, 256}).to(cuda));
    graph.replay();
    EXPECT_EQ(error_of([] { cuda_check_nonfinite(); }), "");
  }
}

// ---- whole models on the GPU ----

// Every qforge Linear under root quantized with `scheme` and frozen (norms, embeddings and the
// attention products stay float), as qbench_gpu_models runs them.
void freeze_every_linear(torch::nn::Module& root, const Scheme& scheme) {
  for (const auto& m : root.modules(/*include_self=*/true)) {
    if (auto* lin = m->as<nn::LinearImpl>()) {
      quantize(*lin, scheme);
      freeze(*lin);
    }
  }
}

Scheme w8a8_dynamic() {
  Scheme s(qint8);
  s.activations = ActivationMode::kDynamicPerToken;
  return s;
}

models::LlamaConfig llama_small() {
  models::LlamaConfig c;
  c.vocab_size = 64, c.hidden_size = 256, c.intermediate_size = 512, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 64;
  return c;
}

TEST_F(CudaApi, FrozenBertOnTheGpuMatchesTheCpu) {
  models::BertConfig c;
  c.vocab_size = 100, c.hidden_size = 128, c.num_hidden_layers = 2, c.num_attention_heads = 4;
  c.intermediate_size = 256, c.max_position_embeddings = 64;
  std::vector<at::Tensor> outs;
  const at::Tensor ids = at::randint(0, c.vocab_size, {3, 19}, at::kLong);
  at::Tensor mask = at::ones({3, 19}, at::kLong);
  mask[2].narrow(0, 12, 7).zero_();  // a padded sequence
  for (const at::Device dev : {at::Device(at::kCPU), cuda}) {
    torch::manual_seed(31);
    models::BertModel m(c);
    m->eval();
    freeze_every_linear(*m, w8a8_dynamic());
    m->to(dev);
    const at::NoGradGuard no_grad;
    outs.push_back(m->forward(ids.to(dev), mask.to(dev)).last_hidden_state);
  }
  EXPECT_TRUE(outs[1].is_cuda());
  // The int8 Linears are bit-exact across devices; LayerNorm, GELU, softmax and the attention
  // products sum in another order, which can move a dynamic activation code by one step.
  EXPECT_LT(rel_error(outs[1], outs[0]), 1e-2);
}

TEST_F(CudaApi, FrozenLlamaDecodesOnTheGpuAsOnTheCpu) {
  const models::LlamaConfig c = llama_small();
  std::vector<at::Tensor> logits;
  const at::Tensor prompt = at::randint(0, c.vocab_size, {1, 7}, at::kLong);
  for (const at::Device dev : {at::Device(at::kCPU), cuda}) {
    torch::manual_seed(32);
    models::LlamaForCausalLM m(c);
    m->eval();
    freeze_every_linear(*m, Scheme(qint4));  // weight-only int4, groups of 128
    m->to(dev);
    const at::NoGradGuard no_grad;
    models::KvCache cache;
    at::Tensor all = m->forward(prompt.to(dev), &cache);
    // Four decode steps fed the same tokens on both devices (an argmax could differ on a near tie).
    for (int64_t t = 0; t < 4; ++t) all = at::cat({all, m->forward(prompt.narrow(1, t, 1).to(dev), &cache)}, 1);
    logits.push_back(all);
  }
  EXPECT_TRUE(logits[1].is_cuda());
  // The int4 GEMV (its own bound, 1e-5 a layer) and the float ops differ from the CPU's by
  // summation order only; a wrong mask, RoPE position or cache slot would be off by O(1).
  EXPECT_LT(rel_error(logits[1], logits[0]), 1e-3);
}

// A decode step of the layers of `m` (the input and the RoPE tables held outside it, as a graph needs).
at::Tensor llama_layers_step(models::LlamaForCausalLM& m, const at::Tensor& x, const models::RopeTables& rope,
                             models::KvCache& cache) {
  at::Tensor h = x;
  for (const auto& l : *m->model->layers) h = l->as<models::LlamaDecoderLayerImpl>()->forward(h, rope, &cache);
  return h;
}

TEST_F(CudaApi, CapturedLlamaDecodeStepReplaysTheEagerStep) {
  const models::LlamaConfig c = llama_small();
  for (const char* name : {"w4", "w8a8"}) {
    SCOPED_TRACE(name);
    torch::manual_seed(33);
    models::LlamaForCausalLM m(c);
    m->eval();
    freeze_every_linear(*m, std::string(name) == "w4" ? Scheme(qint4) : w8a8_dynamic());
    m->to(cuda);
    const at::NoGradGuard no_grad;
    models::KvCache cache;
    cache.reserve(32);
    cache.resize(static_cast<size_t>(c.num_hidden_layers));
    const models::RopeTables rope = m->model->rope(5, 1, cuda);
    llama_layers_step(m, at::randn({1, 5, c.hidden_size}).to(cuda), m->model->rope(0, 5, cuda), cache);  // prefill
    models::KvCache before = cache;  // 5 positions
    const at::Tensor x0 = at::randn({1, 1, c.hidden_size}).to(cuda);
    at::Tensor x = x0.clone();
    CudaGraphStep graph;
    // The warm-up appends position 5 (from x0), the captured step position 6, which replays rewrite.
    const std::vector<at::Tensor> out = graph.capture([&] { return std::vector<at::Tensor>{llama_layers_step(m, x, rope, cache)}; });
    for (int replay = 0; replay < 2; ++replay) {
      const at::Tensor fresh = at::randn({1, 1, c.hidden_size});
      x.copy_(fresh.to(cuda));
      out[0].fill_(std::numeric_limits<float>::quiet_NaN());
      graph.replay();
      models::KvCache eager = before;
      llama_layers_step(m, x0, rope, eager);  // position 5, as the warm-up wrote it
      const at::Tensor want = llama_layers_step(m, fresh.to(cuda), rope, eager);
      // Same kernels on the same data; the attention products are cuBLAS calls, whose algorithm
      // choice is the one thing that could differ between capture and eager.
      EXPECT_LT(rel_error(out[0], want), 1e-6) << "replay " << replay;
      EXPECT_FALSE(out[0].isnan().any().item<bool>());
    }
    EXPECT_EQ(error_of([] { cuda_check_nonfinite(); }), "");
  }
}

// A replay's bad record also surfaces without the explicit check: each eager Linear call reads the
// slots an earlier call copied back once that copy has landed, and queues the next copy.
TEST_F(CudaApi, NonfiniteInputOfAReplayIsRaisedByALaterEagerCall) {
  NonfiniteModeGuard mode;
  set_cuda_nonfinite_check(CudaNonfiniteCheck::kDeferred);
  EXPECT_EQ(error_of([] { cuda_check_nonfinite(); }), "");
  FrozenStack s = frozen_stack(cuda);
  at::Tensor x = at::randn({7, 256}).to(cuda);
  CudaGraphStep graph;
  graph.capture([&] { return std::vector<at::Tensor>{s.forward(x)}; });
  at::Tensor bad = at::randn({7, 256});
  bad[3][40] = -std::numeric_limits<float>::infinity();
  x.copy_(bad.to(cuda));
  EXPECT_EQ(error_of([&] { graph.replay(); }), "");
  const at::Tensor clean = at::randn({7, 256}).to(cuda);
  std::string err;
  for (int call = 0; call < 4 && err.empty(); ++call) {  // the copy lands by the second synchronized call
    torch::cuda::synchronize();
    err = error_of([&] { s.forward(clean); });
  }
  EXPECT_NE(err.find("row 3 column 40 is not finite"), std::string::npos) << err;
  EXPECT_NE(err.find("(in a CUDA graph replay)"), std::string::npos) << err;
  // Reported once (the slot was reset): clean eager calls and the explicit check then pass.
  for (int call = 0; call < 3; ++call) {
    torch::cuda::synchronize();
    EXPECT_EQ(error_of([&] { s.forward(clean); }), "") << "call " << call;
  }
  EXPECT_EQ(error_of([] { cuda_check_nonfinite(); }), "");
}

}  // namespace
}  // namespace qforge
