// PyTorch's own transformer layers through the TorchScript front door: nn.MultiheadAttention
// (MhaNet), nn.TransformerEncoderLayer (batch_first and norm_first both ways) and torchvision's
// VisionTransformer, scripted and traced (scripts/torchscript/make_fixtures.py). The fast-path
// branches are made unreachable at load (graph_passes.h), the packed q / k / v projection becomes
// one qforge Linear, and the other branches' chunk / split read its weight from that layer.
#include <gtest/gtest.h>

#include <torch/script.h>

#include <cstdio>
#include <string>
#include <vector>

#include "framework/api/quantize.h"
#include "framework/jit/scripted_model.h"
#include "tests/jit/jit_test_util.h"

using qforge::jit::ScriptedModel;
using qforge::jit_test::count_ops;
using qforge::jit_test::expect_only_weightless_float_calls;
using qforge::jit_test::fixture;
using qforge::jit_test::layer_paths;
using qforge::jit_test::original_call;
using qforge::jit_test::relative_error;
using qforge::jit_test::sliced_reads;

namespace {

// MhaNet's qforge layers: the packed projection, q @ k^T and att @ v (two activations each), the
// output projection and the classifier.
const std::vector<std::string> kMhaNetLayers{"attn.in_proj_weight", "attn.matmul_0", "attn.matmul_1", "attn.out_proj",
                                             "head"};

// The file's own forward in eval mode: with gradients enabled PyTorch runs the composite path (the
// one the rewritten graph keeps), under no_grad its fused fast path.
at::Tensor original_forward(const std::string& form, const at::Tensor& x, bool grad) {
  return original_call(form, {x}, grad).toTensor().detach();
}

// The float forward equals the file's composite path bit for bit and its fast path within 1e-6.
void expect_float_forward(ScriptedModel& m, const std::string& form, const at::Tensor& x) {
  m->eval();
  const at::Tensor composite = original_forward(form, x, true), fast = original_forward(form, x, false);
  torch::NoGradGuard no_grad;
  const at::Tensor y = m->forward(x);
  EXPECT_TRUE(at::equal(y, composite)) << form << ": " << relative_error(y, composite);
  EXPECT_LE(relative_error(y, fast), 1e-6) << form;
  // Batch first and scripted, PyTorch's no_grad run takes the fused path: the 1e-6 check is not vacuous.
  if (form.find("scripted") != std::string::npos && form.find("_sf_") == std::string::npos) {
    EXPECT_FALSE(at::equal(composite, fast)) << form;
  }
  EXPECT_FALSE(at::equal(y, m->forward(x * 1.5)));  // the check can fail
}

// Bounds below: dynamic int8 0.02, static W8A8 (minmax, per-tensor activations calibrated on one
// random batch, measured on another) 0.08 of the largest float output; measured up to 0.0082 and
// 0.061 (docs/torchscript.md).

double static_w8a8_round_trip(const std::string& form, const at::Tensor& calib, const at::Tensor& x) {
  return qforge::jit_test::static_w8a8_round_trip(form, {calib}, {x});
}

double dynamic_int8_error(const std::string& form, const at::Tensor& x) {
  return qforge::jit_test::dynamic_int8_error(form, {x});
}

}  // namespace

TEST(TorchScriptMha, PackedProjectionIsOneLayerFastPathUnreachableFloatForwardEqual) {
  torch::manual_seed(11);
  for (const char* form : {"mha_bf_scripted", "mha_bf_traced", "mha_sf_scripted", "mha_sf_traced"}) {
    SCOPED_TRACE(form);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
    EXPECT_EQ(layer_paths(m), kMhaNetLayers) << m->describe();
    EXPECT_EQ(m->layers()[1]->spec().kind, qforge::jit::LayerKind::kMatMul);
    EXPECT_EQ(m->layers()[0]->spec().out, 48);  // q, k and v of width 16 in one projection
    EXPECT_TRUE(m->layers()[0]->spec().bias);
    expect_only_weightless_float_calls(m);
    const bool scripted = std::string(form).find("scripted") != std::string::npos;
    // Scripted, the unbatched / cross-attention branches chunk and split the packed weight and bias.
    EXPECT_EQ(sliced_reads(m), scripted ? 4 : 0) << m->describe();
    const bool bf = std::string(form).find("_bf_") != std::string::npos;
    const at::Tensor x = bf ? torch::randn({3, 7, 16}) : torch::randn({7, 3, 16});
    expect_float_forward(m, form, x);
  }
}

// Scripted, an unbatched input runs the branch that chunks the packed weight: it reads the qforge
// layer's weight, float then dequantized after freeze, also from a saved file whose float weight is gone.
TEST(TorchScriptMha, UnbatchedInputReadsTheLayersWeightFloatAndFrozen) {
  torch::manual_seed(12);
  const at::Tensor x = torch::randn({16, 16});
  ScriptedModel m = qforge::jit::load_torchscript(fixture("mha_bf_scripted"));
  m->eval();
  const at::Tensor ref = original_forward("mha_bf_scripted", x, true);
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(at::equal(m->forward(x), ref));
  }
  const double error = static_w8a8_round_trip("mha_bf_scripted", torch::randn({8, 16, 16}), x);
  std::printf("mha_bf_scripted unbatched: frozen W8A8 relative error %.4f\n", error);
  EXPECT_LE(error, 0.05);
}

TEST(TorchScriptMha, DynamicAndStaticW8A8ErrorBoundsFrozenSavedLoaded) {
  torch::manual_seed(13);
  for (const char* form : {"mha_bf_scripted", "mha_bf_traced", "mha_sf_scripted", "mha_sf_traced"}) {
    SCOPED_TRACE(form);
    const bool bf = std::string(form).find("_bf_") != std::string::npos;
    const at::Tensor calib = bf ? torch::randn({16, 8, 16}) : torch::randn({8, 16, 16});
    const at::Tensor x = bf ? torch::randn({16, 8, 16}) : torch::randn({8, 16, 16});
    const double dynamic = dynamic_int8_error(form, x), frozen = static_w8a8_round_trip(form, calib, x);
    std::printf("%s: relative error dynamic int8 %.4f, static W8A8 frozen %.4f\n", form, dynamic, frozen);
    EXPECT_LE(dynamic, 0.02);
    EXPECT_LE(frozen, 0.08);
  }
}

// A trace made under torch.no_grad() records PyTorch's fused op, which reads the weights itself.
TEST(TorchScriptMha, FusedOpOfANoGradTraceStaysFloatWithTheReason) {
  ScriptedModel m = qforge::jit::load_torchscript(fixture("mha_nograd_traced"));
  EXPECT_EQ(layer_paths(m), (std::vector<std::string>{"head"})) << m->describe();
  ASSERT_EQ(count_ops(m, "aten::_native_multi_head_attention"), 1) << m->describe();
  EXPECT_NE(m->describe().find("trace with gradients enabled, or script"), std::string::npos) << m->describe();
}

TEST(TorchScriptEncoderLayer, BatchFirstAndNormFirstBothWaysLayersFloatForwardQuantized) {
  torch::manual_seed(14);
  for (const char* order : {"bf", "sf"}) {
    for (const char* norm : {"pre", "post"}) {
      for (const char* how : {"scripted", "traced"}) {
        const std::string form = std::string("encoder_layer_") + order + "_" + norm + "_" + how;
        SCOPED_TRACE(form);
        ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
        EXPECT_EQ(layer_paths(m), (std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.matmul_0",
                                                              "self_attn.matmul_1", "self_attn.out_proj", "linear1",
                                                              "linear2"}))
            << m->describe();
        EXPECT_EQ(count_ops(m, "aten::layer_norm"), 2) << m->describe();
        expect_only_weightless_float_calls(m);
        EXPECT_EQ(sliced_reads(m), std::string(how) == "scripted" ? 4 : 0) << m->describe();
        const at::Tensor x = torch::randn({4, 9, 16});  // [batch, seq] or [seq, batch]
        expect_float_forward(m, form, x);
        const double dynamic = dynamic_int8_error(form, x);
        const double frozen = static_w8a8_round_trip(form, torch::randn({4, 9, 16}), x);
        std::printf("%s: relative error dynamic int8 %.4f, static W8A8 frozen %.4f\n", form.c_str(), dynamic, frozen);
        EXPECT_LE(dynamic, 0.02);
        EXPECT_LE(frozen, 0.08);
      }
    }
  }
}

TEST(TorchScriptVit, TorchvisionVisionTransformerThroughTheSamePath) {
  torch::manual_seed(15);
  std::vector<std::string> want{"conv_proj"};
  for (const char* block : {"encoder.layers.encoder_layer_0", "encoder.layers.encoder_layer_1"})
    for (const char* l : {".self_attention.in_proj_weight", ".self_attention.matmul_0", ".self_attention.matmul_1",
                          ".self_attention.out_proj", ".mlp.0", ".mlp.3"})
      want.push_back(std::string(block) + l);
  want.push_back("heads.head");
  for (const char* form : {"vit_scripted", "vit_traced"}) {
    SCOPED_TRACE(form);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
    EXPECT_EQ(layer_paths(m), want) << m->describe();
    EXPECT_EQ(count_ops(m, "aten::layer_norm"), 5) << m->describe();
    expect_only_weightless_float_calls(m);
    const at::Tensor x = torch::randn({4, 3, 28, 28});
    expect_float_forward(m, form, x);
    const double frozen = static_w8a8_round_trip(form, torch::randn({16, 3, 28, 28}), x);
    std::printf("%s: static W8A8 frozen relative error %.4f\n", form, frozen);
    EXPECT_LE(frozen, 0.05);
  }
}

// MHA's defaults: need_weights=True (the averaged weights come back too) and a key padding mask.
TEST(TorchScriptMha, KeyPaddingMaskAndNeedWeightsAgreeWithBothPyTorchPaths) {
  torch::manual_seed(16);
  const at::Tensor x = torch::randn({3, 7, 16});
  at::Tensor kpm = torch::zeros({3, 7}, torch::kBool);
  kpm.index_put_({1, torch::indexing::Slice(5)}, true);
  kpm.index_put_({2, torch::indexing::Slice(2)}, true);
  for (const char* form : {"mha_kpm_scripted", "mha_kpm_traced"}) {
    SCOPED_TRACE(form);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
    EXPECT_EQ(layer_paths(m), kMhaNetLayers) << m->describe();
    expect_only_weightless_float_calls(m);
    // Scripted, q @ k^T is a baddbmm where a mask is given and a bmm where none is: one MatMul for
    // both (the trace recorded the masked branch only).
    int shared_products = 0;
    for (const auto& t : m->tied()) shared_products += t.layer == "attn.matmul_0";
    EXPECT_EQ(shared_products, std::string(form).find("scripted") != std::string::npos ? 1 : 0) << m->describe();
    m->eval();
    const auto composite = original_call(form, {x, kpm}, true).toTuple()->elements();
    const auto fast = original_call(form, {x, kpm}, false).toTuple()->elements();
    const auto y = m->forward({x, kpm}).toTuple()->elements();  // gradients enabled: no guard
    ASSERT_EQ(y.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(at::equal(y[i].toTensor(), composite[i].toTensor())) << i;
      EXPECT_LE(relative_error(y[i].toTensor().detach(), fast[i].toTensor()), 1e-6) << i;
    }
    const auto unmasked = m->forward({x, torch::zeros({3, 7}, torch::kBool)}).toTuple()->elements();
    EXPECT_FALSE(at::equal(unmasked[0].toTensor(), y[0].toTensor()));  // the mask is read
  }
}

// The encoder layer's src_mask and src_key_padding_mask inputs (scripted: a trace takes x only).
TEST(TorchScriptEncoderLayer, MasksAgreeWithPyTorch) {
  torch::manual_seed(17);
  const at::Tensor x = torch::randn({4, 9, 16});
  const at::Tensor src_mask = torch::triu(torch::full({9, 9}, -INFINITY), 1);
  for (const char* order : {"bf", "sf"}) {
    at::Tensor kpm = torch::zeros({4, 9}, torch::kBool);
    kpm.index_put_({order[0] == 'b' ? 1 : 3, torch::indexing::Slice(6)}, true);
    for (const char* norm : {"pre", "post"}) {
      const std::string form = std::string("encoder_layer_") + order + "_" + norm + "_scripted";
      SCOPED_TRACE(form);
      ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
      m->eval();
      const at::Tensor in = order[0] == 'b' ? x : x.transpose(0, 1).contiguous();
      const at::Tensor y = m->forward({in, src_mask, kpm}).toTensor();
      EXPECT_TRUE(at::equal(y, original_call(form, {in, src_mask, kpm}, true).toTensor()));
      const at::Tensor y_kpm = m->forward({in, c10::IValue(), kpm}).toTensor();
      EXPECT_TRUE(at::equal(y_kpm, original_call(form, {in, c10::IValue(), kpm}, true).toTensor()));
      EXPECT_FALSE(at::equal(y, y_kpm));
      EXPECT_FALSE(at::equal(y_kpm, m->forward(in)));  // the key padding mask is read
    }
  }
}

// q @ k^T is one MatMul for both of its calls (scripted: a baddbmm where a mask is given, a bmm
// where none is): calibrated through either branch, the frozen layer serves the other.
TEST(TorchScriptEncoderLayer, ASharedProductCalibratedThroughOneBranchServesTheOther) {
  torch::manual_seed(20);
  const std::string form = "encoder_layer_bf_post_scripted";
  const at::Tensor calib = torch::randn({4, 9, 16}), x = torch::randn({4, 9, 16});
  at::Tensor kpm = torch::zeros({4, 9}, torch::kBool);
  kpm.index_put_({1, torch::indexing::Slice(6)}, true);
  for (const bool masked_calibration : {true, false}) {
    SCOPED_TRACE(masked_calibration ? "calibrated with a mask" : "calibrated without");
    ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
    int shared = 0;
    for (const auto& t : m->tied()) shared += t.layer == "self_attn.matmul_0";
    EXPECT_EQ(shared, 1) << m->describe();
    m->eval();
    qforge::quantize(*m, qforge::jit_test::w8a8());
    torch::NoGradGuard no_grad;
    {
      qforge::Calibration calibration(*m);
      if (masked_calibration) {
        m->forward({calib, c10::IValue(), kpm});
      } else {
        m->forward({calib});
      }
    }
    qforge::freeze(*m);
    const std::vector<c10::IValue> other =
        masked_calibration ? std::vector<c10::IValue>{x} : std::vector<c10::IValue>{x, c10::IValue(), kpm};
    const double error = relative_error(m->forward(other).toTensor(), original_call(form, other, true).toTensor());
    std::printf("%s, the other branch frozen: relative error %.4f\n", masked_calibration ? "masked" : "unmasked", error);
    EXPECT_LE(error, 0.08);
  }
}

// Train mode, gradients enabled: the same seed gives the same dropout masks on both sides.
TEST(TorchScriptEncoderLayer, TrainModeEqualsPyTorchWithTheSameSeed) {
  torch::manual_seed(18);
  for (const char* form : {"mha_bf_scripted", "mha_sf_scripted", "encoder_layer_bf_pre_scripted",
                           "encoder_layer_bf_post_scripted", "encoder_layer_sf_post_scripted"}) {
    qforge::jit_test::expect_train_mode_equals_pytorch(form, torch::randn({4, 9, 16}));
  }
}

// One Linear over the packed [3E, E] weight: per-channel int8 gives each q / k / v row its own scale.
TEST(TorchScriptMha, PackedProjectionFrozenPerChannelHasOneScalePerQkvRow) {
  torch::manual_seed(19);
  ScriptedModel m = qforge::jit::load_torchscript(fixture("mha_bf_scripted"));
  m->eval();
  qforge::quantize(*m, qforge::jit_test::w8a8());
  torch::NoGradGuard no_grad;
  {
    qforge::Calibration calibration(*m);
    m->forward(torch::randn({4, 7, 16}));
  }
  qforge::freeze(*m);
  ASSERT_EQ(m->layers()[0]->path(), "attn.in_proj_weight");
  const at::Tensor scale = m->layers()[0]->layer().frozen_weight().scale.flatten();
  ASSERT_EQ(scale.numel(), 48);
  const at::Tensor q = scale.slice(0, 0, 16), k = scale.slice(0, 16, 32), v = scale.slice(0, 32, 48);
  EXPECT_FALSE(at::equal(q, k));
  EXPECT_FALSE(at::equal(k, v));
  EXPECT_GT(q.max().item<double>(), q.min().item<double>());  // per row, not per third
}
