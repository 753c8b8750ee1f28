// Kernel plans on a CUDA device, decided on the host (no GPU needed): which frozen Linear runs
// the cuBLASLt int8 GEMM, which falls back and why; a frozen layer refusing a device this build
// has no kernels for, unchanged; and the CPU weight-only plans' large-M kernel.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "framework/cuda/linear_cuda.h"
#include "framework/api/kernel_plan.h"
#include "framework/nn/layer_norm.h"
#include "framework/nn/linear.h"
#include "framework/api/quantize.h"
#include "kernels/cpu/gemv_s4.h"
#include "kernels/cpu/linear_weight_only.h"

namespace qforge {
namespace {

QSpec int8_per_channel() {
  QSpec s;
  s.qtype = qint8;
  s.granularity = Granularity::kPerChannel;
  s.symmetric = true;
  return s;
}

QSpec int4_per_group() {
  QSpec s;
  s.qtype = qint4;
  s.granularity = Granularity::kPerGroup;
  s.group_size = 128;
  s.symmetric = true;
  return s;
}

QSpec dynamic_act() {
  QSpec s;
  s.qtype = qint8;
  s.symmetric = true;
  s.narrow_range = true;
  return s;
}

TEST(KernelPlanCuda, Int8LinearRunsCublasLtWhereTheImmaRulesHold) {
  const KernelPlan p = plan_linear_cuda(int8_per_channel(), ActivationMode::kDynamicPerToken, dynamic_act(), 768, 3072);
  EXPECT_EQ(p.path, LinearPath::kS8Dynamic);
  EXPECT_EQ(p.kernel, "gemm_s8s8s32_cublaslt");
  EXPECT_EQ(p.fallback, "");
  const KernelPlan st = plan_linear_cuda(int8_per_channel(), ActivationMode::kStatic, dynamic_act(), 3072, 768);
  EXPECT_EQ(st.path, LinearPath::kS8Static);
  EXPECT_EQ(st.kernel, "gemm_s8s8s32_cublaslt");
}

TEST(KernelPlanCuda, BrokenImmaRuleFallsBackWithTheRule) {
  const KernelPlan n = plan_linear_cuda(int8_per_channel(), ActivationMode::kDynamicPerToken, dynamic_act(), 768, 1001);
  EXPECT_EQ(n.path, LinearPath::kS8Dynamic);
  EXPECT_EQ(n.kernel, "gemm_s8s8s32_cuda");
  EXPECT_EQ(n.fallback, "gemm_s8s8s32_cublaslt: N=1001 not a multiple of 4 (cuBLASLt IMMA m)");
  const KernelPlan k = plan_linear_cuda(int8_per_channel(), ActivationMode::kDynamicPerToken, dynamic_act(), 10, 64);
  EXPECT_EQ(k.fallback, "gemm_s8s8s32_cublaslt: K=10 not a multiple of 4 (cuBLASLt IMMA k)");
}

TEST(KernelPlanCuda, OtherPathsSayWhatTheGpuRunsInstead) {
  const QSpec w4 = int4_per_group();
  const KernelPlan s4 = plan_linear_cuda(w4, ActivationMode::kDynamicPerToken, dynamic_act(), 768, 768);
  EXPECT_EQ(s4.path, LinearPath::kS4Dynamic);
  EXPECT_EQ(s4.kernel, "gemv_f32s4_mma_cuda");
  EXPECT_EQ(s4.fallback, "");
  EXPECT_EQ(s4.large_m, 17);
  EXPECT_EQ(s4.large_m_kernel, "dequantize_s4_cuda+at::linear");
  // M = 2..16 run the tensor-core GEMV with x staged once per call.
  EXPECT_EQ(s4.mid_m, 2);
  EXPECT_EQ(s4.mid_m_kernel, "gemv_f32s4_mma_staged_cuda");
  EXPECT_EQ(plan_kernel_text(s4), "gemv_f32s4_mma_cuda | gemv_f32s4_mma_staged_cuda at M 2..16");  // describe()
  // At M = 1 the staged launcher from N or K = 8192 on (the H200's Llama-3-8B shapes); then every
  // decode-sized M runs it, and describe() names it once.
  for (const auto& [in, out] : {std::pair<int64_t, int64_t>{4096, 14336}, {14336, 4096}, {768, 8192}}) {
    const KernelPlan big = plan_linear_cuda(w4, ActivationMode::kNone, dynamic_act(), in, out);
    EXPECT_EQ(big.kernel, "gemv_f32s4_mma_staged_cuda") << in << " x " << out;
    EXPECT_EQ(big.mid_m, 0);
    EXPECT_EQ(big.large_m, 17);
    EXPECT_EQ(plan_kernel_text(big), "gemv_f32s4_mma_staged_cuda");
  }
  EXPECT_EQ(plan_linear_cuda(w4, ActivationMode::kNone, dynamic_act(), 4096, 4096).kernel, "gemv_f32s4_mma_cuda");
  EXPECT_EQ(plan_linear_cuda(w4, ActivationMode::kNone, dynamic_act(), 8064, 4096).kernel, "gemv_f32s4_mma_cuda");
  // Groups of 64: the CUDA-core GEMV, and why not the tensor-core one.
  QSpec g64 = w4;
  g64.group_size = 64;
  const KernelPlan s4g64 = plan_linear_cuda(g64, ActivationMode::kNone, dynamic_act(), 768, 768);
  EXPECT_EQ(s4g64.kernel, "gemv_f32s4_cuda");
  EXPECT_EQ(s4g64.fallback, "gemv_f32s4_mma_cuda: group_size=64 not a multiple of 128");
  EXPECT_EQ(s4g64.large_m, 17);
  EXPECT_EQ(s4g64.mid_m, 0);
  EXPECT_EQ(s4g64.mid_m_kernel, "");
  EXPECT_EQ(plan_kernel_text(s4g64), "gemv_f32s4_cuda");
  // A K the GEMV cannot take (not a multiple of 8) dequantizes at every M, and says why.
  QSpec odd = w4;
  odd.group_size = 12;
  const KernelPlan s4odd = plan_linear_cuda(odd, ActivationMode::kNone, dynamic_act(), 36, 768);
  EXPECT_EQ(s4odd.kernel, "dequantize_s4_cuda+at::linear");
  EXPECT_NE(s4odd.fallback.find("gemv_f32s4_cuda: K=36 not a positive multiple of 8"), std::string::npos)
      << s4odd.fallback;
  const KernelPlan wo = plan_linear_cuda(int8_per_channel(), ActivationMode::kNone, dynamic_act(), 768, 768);
  EXPECT_EQ(wo.path, LinearPath::kS8WeightOnly);
  // Weight-only int8: the GEMV on the codes up to M = 16, dequantize + at::linear above.
  EXPECT_EQ(wo.kernel, "gemv_f32s8_cuda");
  EXPECT_EQ(wo.fallback, "");
  EXPECT_EQ(wo.large_m, 17);
  EXPECT_EQ(wo.large_m_kernel, "dequantize+at::linear");
  EXPECT_EQ(plan_kernel_text(wo), "gemv_f32s8_cuda");
  // A K the GEMV cannot take (not a multiple of 4) dequantizes at every M, and says why.
  const KernelPlan wo_odd = plan_linear_cuda(int8_per_channel(), ActivationMode::kNone, dynamic_act(), 766, 768);
  EXPECT_EQ(wo_odd.kernel, "dequantize+at::linear");
  EXPECT_EQ(wo_odd.fallback, "gemv_f32s8_cuda: K=766 not a positive multiple of 4: the int8 weight is dequantized to "
                             "float per call, then at::linear");
  QSpec affine = dynamic_act();
  affine.symmetric = false;
  const KernelPlan af = plan_linear_cuda(int8_per_channel(), ActivationMode::kStatic, affine, 768, 768);
  EXPECT_EQ(af.path, LinearPath::kDequant);
  EXPECT_EQ(af.kernel, "dequantize+at::linear");
  EXPECT_EQ(af.fallback, "affine static activations (zero point) have no integer kernel (on CUDA: the dequantized "
                         "float weight stays on the device)");
  const KernelPlan fl = plan_linear_cuda(std::nullopt, ActivationMode::kNone, dynamic_act(), 768, 768);
  EXPECT_EQ(fl.kernel, "at::linear");
  EXPECT_EQ(fl.fallback, "float weights");
}

TEST(KernelPlanCuda, FrozenLayerRefusesADeviceWithoutKernelsAndStaysUsable) {
  if (cuda_ops::built()) GTEST_SKIP() << "this build has CUDA kernels (tests/cuda covers it on a GPU)";
  torch::manual_seed(0);
  nn::Linear lin(16, 8);
  Scheme scheme(qint8);
  scheme.activations = ActivationMode::kDynamicPerToken;
  quantize(lin, scheme);
  freeze(lin);
  const at::Tensor x = at::randn({3, 16});
  const at::Tensor before = lin->forward(x);
  try {
    lin->to(torch::Device(torch::kCUDA, 0));
    ADD_FAILURE() << "moving a frozen layer to CUDA in a build without CUDA kernels must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rebuild against a CUDA-enabled LibTorch"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(at::equal(lin->forward(x), before));
  EXPECT_EQ(lin->report().kernel, plan_linear(int8_per_channel(), ActivationMode::kDynamicPerToken, dynamic_act(), 16).kernel);
}

TEST(KernelPlan, WeightOnlyPathsNameTheFloatGemmAboveTheRowThreshold) {
  const KernelPlan wo = plan_linear(int8_per_channel(), ActivationMode::kNone, dynamic_act(), 768, Isa::kAvx512Vnni);
  EXPECT_EQ(wo.path, LinearPath::kS8WeightOnly);
  EXPECT_EQ(wo.large_m, kernels::kWeightOnlyMaxM + 1);
  EXPECT_EQ(wo.large_m_kernel, kernels::kDequantGemmKernel);
  EXPECT_NE(wo.kernel, kernels::kDequantGemmKernel);
  const KernelPlan dyn = plan_linear(int8_per_channel(), ActivationMode::kDynamicPerToken, dynamic_act(), 768);
  EXPECT_EQ(dyn.large_m, 0);
  EXPECT_EQ(dyn.large_m_kernel, "");
  // On CUDA the int8 GEMV serves M <= 16 and the dequantized weight larger M.
  const KernelPlan gpu = plan_linear_cuda(int8_per_channel(), ActivationMode::kNone, dynamic_act(), 768, 768);
  EXPECT_EQ(gpu.large_m, 17);
  EXPECT_EQ(gpu.large_m_kernel, "dequantize+at::linear");
}

// Issue 39 item 3: the dry run's plan showed float bytes ("0 frozen"); planned reports give each
// quantized layer the bytes freeze() leaves it, exactly, before anything is calibrated.
TEST(KernelPlan, Item3PlannedBytesAreTheBytesFreezeLeaves) {
  torch::manual_seed(3);
  // The LayerNorm quantizes its activations only: its bytes count in the total as they are.
  auto net = torch::nn::Sequential(nn::Linear(64, 128), nn::LayerNorm(torch::nn::LayerNormOptions({128})),
                                   torch::nn::ReLU(), nn::Linear(128, 32), torch::nn::ReLU(), nn::Linear(32, 8));
  Scheme s(qint4);
  s.weight_granularity = Granularity::kPerGroup;
  s.group_size = 32;
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  s.rules.push_back(LayerRule{"5", false, qint8, Granularity::kPerChannel, std::nullopt, std::nullopt});
  quantize(net, s);
  const std::vector<LayerReport> planned = layer_reports(net, /*planned=*/true);
  const std::string dry = describe(net, /*planned=*/true);
  {
    Calibration calib(net);
    net->forward(torch::randn({16, 64}));
  }
  freeze(net);
  const std::vector<LayerReport> frozen = layer_reports(net);
  ASSERT_EQ(planned.size(), frozen.size());
  for (size_t i = 0; i < planned.size(); ++i) EXPECT_EQ(planned[i].bytes, frozen[i].bytes) << planned[i].name;
  const ModelSize size = model_size(net);
  EXPECT_NE(dry.find("total " + std::to_string(size.total_bytes) + " bytes once frozen"), std::string::npos)
      << dry << "frozen: " << size.total_bytes;
  EXPECT_EQ(dry.find(" 0 in quantized layers"), std::string::npos) << dry;
}

// The int4 dynamic Linear switches to the VNNI panel GEMM at kS4PanelMinM rows; below VNNI one
// kernel serves every M.
TEST(KernelPlan, Int4DynamicSwitchesToThePanelGemmAtItsRowThresholdOnVnniOnly) {
  const QSpec w4 = int4_per_group();
  const KernelPlan vnni = plan_linear(w4, ActivationMode::kDynamicPerToken, dynamic_act(), 768, Isa::kAvx512Vnni);
  EXPECT_EQ(vnni.path, LinearPath::kS4Dynamic);
  EXPECT_EQ(vnni.large_m, kernels::kS4PanelMinM);
  EXPECT_NE(vnni.large_m_kernel.find("gemm_s8s4f32_n16k8_avx512vnni"), std::string::npos) << vnni.large_m_kernel;
  for (const Isa below : {Isa::kAvx512, Isa::kAvx2, Isa::kReference}) {
    const KernelPlan p = plan_linear(w4, ActivationMode::kDynamicPerToken, dynamic_act(), 768, below);
    EXPECT_EQ(p.path, LinearPath::kS4Dynamic);
    EXPECT_EQ(p.large_m, 0) << p.kernel;
    EXPECT_EQ(p.large_m_kernel, "");
  }
}

// set_cuda_linear_s8_fused(true): the int8 paths plan the one-launch kernel where its rules hold
// (K a multiple of 32), else the chain with the fused kernel's rule first in the reason.
TEST(KernelPlanCuda, FusedInt8LinearWhenSwitchedOnAndItsRulesHold) {
  struct Restore {
    bool was = cuda_linear_s8_fused();
    ~Restore() { set_cuda_linear_s8_fused(was); }
  } restore;
  EXPECT_EQ(cuda_linear_s8_fused(), kCudaLinearS8FusedDefault);
  set_cuda_linear_s8_fused(true);
  for (const ActivationMode act : {ActivationMode::kDynamicPerToken, ActivationMode::kStatic}) {
    const KernelPlan p = plan_linear_cuda(int8_per_channel(), act, dynamic_act(), 768, 3072);
    EXPECT_EQ(p.kernel, "linear_s8_fused_cuda");
    EXPECT_EQ(p.fallback, "");
  }
  const KernelPlan k = plan_linear_cuda(int8_per_channel(), ActivationMode::kDynamicPerToken, dynamic_act(), 100, 72);
  EXPECT_EQ(k.kernel, "gemm_s8s8s32_cublaslt");
  EXPECT_EQ(k.fallback, "linear_s8_fused_cuda: K=100 not a positive multiple of 32");
  const KernelPlan n = plan_linear_cuda(int8_per_channel(), ActivationMode::kDynamicPerToken, dynamic_act(), 10, 64);
  EXPECT_EQ(n.kernel, "gemm_s8s8s32_cuda");
  EXPECT_EQ(n.fallback,
            "linear_s8_fused_cuda: K=10 not a positive multiple of 32; gemm_s8s8s32_cublaslt: K=10 not a multiple of 4 "
            "(cuBLASLt IMMA k)");
  set_cuda_linear_s8_fused(false);
  EXPECT_EQ(plan_linear_cuda(int8_per_channel(), ActivationMode::kDynamicPerToken, dynamic_act(), 768, 3072).kernel,
            "gemm_s8s8s32_cublaslt");
}

// Issue 38: the plan names n16b32 for symmetric qint4 groups of 32 where the decode table has an
// n16b32 GEMV (AVX2 and up), and otherwise carries why not in its fallback (zero points; the ISA).
TEST(KernelPlan, Int4Groups32NameTheOneStreamFormOrSayWhyNot) {
  QSpec w4 = int4_per_group();
  w4.group_size = 32;
  const QSpec none = dynamic_act();
  for (const DecodeActivations d : {DecodeActivations::kExact, DecodeActivations::kQ8Block32}) {
    const KernelPlan yes = plan_linear(w4, ActivationMode::kNone, none, 768, Isa::kAvx512Vnni, d);
    EXPECT_EQ(yes.path, LinearPath::kS4WeightOnly);
    EXPECT_NE(yes.kernel.find("n16b32"), std::string::npos) << yes.kernel;
    EXPECT_EQ(yes.fallback.find("n16b32"), std::string::npos) << yes.fallback;
    QSpec affine = w4;
    affine.symmetric = false;
    const KernelPlan zp = plan_linear(affine, ActivationMode::kNone, none, 768, Isa::kAvx512Vnni, d);
    EXPECT_EQ(zp.kernel.find("n16b32"), std::string::npos) << zp.kernel;
    EXPECT_NE(zp.fallback.find("zero points beside the codes"), std::string::npos) << zp.fallback;
    if (kernels::isa_compiled(Isa::kAvx2) && d == DecodeActivations::kQ8Block32) {  // the exact path there: reference
      const KernelPlan avx2 = plan_linear(w4, ActivationMode::kNone, none, 768, Isa::kAvx2, d);
      EXPECT_NE(avx2.kernel.find("n16b32"), std::string::npos) << avx2.kernel;
    }
    const KernelPlan scalar = plan_linear(w4, ActivationMode::kNone, none, 768, Isa::kReference, d);
    EXPECT_EQ(scalar.kernel.find("n16b32"), std::string::npos) << scalar.kernel;
    EXPECT_NE(scalar.fallback.find("no n16b32 decode kernel at reference"), std::string::npos) << scalar.fallback;
  }
  std::string why;
  EXPECT_TRUE(s4_one_stream(w4, 768, Isa::kAvx512Vnni, &why));
  EXPECT_EQ(why, "");
  EXPECT_EQ(s4_one_stream(w4, 768, Isa::kAvx2, &why), kernels::isa_compiled(Isa::kAvx2));
  EXPECT_FALSE(s4_one_stream(w4, 768, Isa::kReference, &why));
  EXPECT_NE(why.find("no n16b32 decode kernel at reference"), std::string::npos) << why;
  // The packer's half ignores the symmetry: zero points 0 / -1 may fold into the stream.
  QSpec affine = w4;
  affine.symmetric = false;
  EXPECT_FALSE(s4_one_stream(affine, 768, Isa::kAvx512Vnni, &why));
  EXPECT_TRUE(s4_one_stream_packing(affine, 768, Isa::kAvx512Vnni, &why));
}

// A frozen int4 layer is described by its packed layout at the ISA usable now: packed n16k8 under
// a reference cap it never names n16b32; packed n16b32 and run under a cap below VNNI it names the
// entry that serves n16b32 there (the AVX2 GEMV under an AVX-512 cap, reference under a reference
// cap, at M = 1 as linear_q8b32s4f32 dispatches), with the same output.
TEST(KernelPlan, FrozenInt4LayerIsDescribedByItsPackedLayoutNotTheIsaNow) {
  if (usable_isa() < Isa::kAvx512Vnni) GTEST_SKIP() << "n16b32 is packed where avx512vnni is usable";
  const auto frozen_net = [](bool capped) {
    torch::manual_seed(7);
    auto net = torch::nn::Sequential(nn::Linear(64, 48));
    Scheme s(qint4);
    s.weight_granularity = Granularity::kPerGroup;
    s.group_size = 32;
    quantize(net, s);
    if (capped) {
      ScopedMaxIsa cap(Isa::kReference);
      freeze(net);
    } else {
      freeze(net);
    }
    nn::set_decode_activations(*net, DecodeActivations::kQ8Block32);
    return net;
  };
  const auto n16k8 = frozen_net(true);
  const LayerReport k8 = layer_reports(n16k8).at(0);
  EXPECT_EQ(k8.kernel.find("n16b32"), std::string::npos) << k8.kernel;
  EXPECT_NE(k8.kernel.find("n16k8"), std::string::npos) << k8.kernel;
  EXPECT_NE(k8.fallback_reason.find("no n16b32 decode kernel at reference"), std::string::npos) << k8.fallback_reason;

  auto b32 = frozen_net(false);
  EXPECT_NE(layer_reports(b32).at(0).kernel.find("gemv_q8s4f32_n16b32_avx512vnni"), std::string::npos);
  const at::Tensor x = torch::randn({1, 64});
  const at::Tensor y = b32->forward(x);
  {
    ScopedMaxIsa cap(Isa::kAvx512);
    EXPECT_EQ(layer_reports(b32).at(0).kernel, "gemv_q8s4f32_n16b32_avx2");
    EXPECT_TRUE(at::equal(b32->forward(x), y));
  }
  ScopedMaxIsa cap(Isa::kReference);
  EXPECT_EQ(layer_reports(b32).at(0).kernel, "reference");
  EXPECT_TRUE(at::equal(b32->forward(x), y));
}

}  // namespace
}  // namespace qforge
