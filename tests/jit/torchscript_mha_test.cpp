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
using qforge::jit_test::fixture;
using qforge::jit_test::layer_paths;
using qforge::jit_test::relative_error;

namespace {

// The file's own forward in eval mode: with gradients enabled PyTorch runs the composite path (the
// one the rewritten graph keeps), under no_grad its fused fast path.
at::Tensor original_forward(const std::string& form, const at::Tensor& x, bool grad) {
  torch::jit::Module original = torch::jit::load(fixture(form));
  original.eval();
  if (grad) return original.forward({x}).toTensor().detach();
  torch::NoGradGuard no_grad;
  return original.forward({x}).toTensor();
}

int count_ops(const ScriptedModel& m, const std::string& op) {
  int n = 0;
  for (const auto& f : m->kept_float()) n += f.op == op;
  return n;
}

// Every call left float is one the composite path has no weight for: the attention's activation x
// activation products, LayerNorm, and (scripted) the other branches' Linear calls on slices of the
// packed weight, which read it from the qforge layer.
void expect_only_weightless_float_calls(const ScriptedModel& m) {
  for (const auto& f : m->kept_float()) {
    const bool weightless = f.op == "aten::bmm" || f.op == "aten::baddbmm" || f.op == "aten::layer_norm" ||
                            (f.op == "aten::linear" && f.reason.find("computed in the graph") != std::string::npos);
    EXPECT_TRUE(weightless) << f.name << " " << f.op << ": " << f.reason;
  }
}

int sliced_reads(const ScriptedModel& m) {
  int n = 0;
  for (const auto& t : m->tied()) n += t.slice;
  return n;
}

// The float forward equals the file's composite path bit for bit and its fast path within 1e-6.
void expect_float_forward(ScriptedModel& m, const std::string& form, const at::Tensor& x) {
  m->eval();
  const at::Tensor composite = original_forward(form, x, true), fast = original_forward(form, x, false);
  torch::NoGradGuard no_grad;
  const at::Tensor y = m->forward(x);
  EXPECT_TRUE(at::equal(y, composite)) << form << ": " << relative_error(y, composite);
  EXPECT_LE(relative_error(y, fast), 1e-6) << form;
  EXPECT_FALSE(at::equal(y, m->forward(x * 1.5)));  // the check can fail
}

// Static W8A8 (calibrated on `calib`), frozen, saved and loaded back in C++ both ways: returns the
// frozen model's relative error on x against the float forward.
double static_w8a8_round_trip(const std::string& form, const at::Tensor& calib, const at::Tensor& x) {
  ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
  m->eval();
  const at::Tensor ref = original_forward(form, x, true);
  qforge::quantize(*m, qforge::jit_test::w8a8());
  torch::NoGradGuard no_grad;
  {
    qforge::Calibration calibration(*m);
    m->forward(calib);
  }
  qforge::freeze(*m);
  for (const auto& l : m->layers()) EXPECT_TRUE(l->layer().frozen()) << l->path();
  const at::Tensor frozen = m->forward(x);
  const auto reloaded = qforge::jit_test::save_and_reload(m, x);
  EXPECT_TRUE(at::equal(reloaded.plain, frozen)) << form;
  EXPECT_TRUE(at::equal(reloaded.again, frozen)) << form;
  EXPECT_EQ(qforge::model_size(*reloaded.model).total_bytes, qforge::model_size(*m).total_bytes);
  return relative_error(frozen, ref);
}

// Bounds below: dynamic int8 0.02, static W8A8 (minmax, per-tensor activations calibrated on one
// random batch, measured on another) 0.08 of the largest float output; measured up to 0.0082 and
// 0.061 (docs/torchscript.md).

// Dynamic int8 (weights per channel, activations per token, computed per call): relative error.
double dynamic_int8_error(const std::string& form, const at::Tensor& x) {
  ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
  m->eval();
  qforge::Scheme scheme(qforge::qint8);
  scheme.activations = qforge::ActivationMode::kDynamicPerToken;
  qforge::quantize(*m, scheme);
  torch::NoGradGuard no_grad;
  return relative_error(m->forward(x), original_forward(form, x, true));
}

}  // namespace

TEST(TorchScriptMha, PackedProjectionIsOneLayerFastPathUnreachableFloatForwardEqual) {
  torch::manual_seed(11);
  for (const char* form : {"mha_bf_scripted", "mha_bf_traced", "mha_sf_scripted", "mha_sf_traced"}) {
    SCOPED_TRACE(form);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
    EXPECT_EQ(layer_paths(m), (std::vector<std::string>{"attn.in_proj_weight", "attn.out_proj", "head"}))
        << m->describe();
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
        EXPECT_EQ(layer_paths(m), (std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.out_proj",
                                                              "linear1", "linear2"}))
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
    for (const char* l : {".self_attention.in_proj_weight", ".self_attention.out_proj", ".mlp.0", ".mlp.3"})
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
