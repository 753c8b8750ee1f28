// PyTorch's nn.TransformerEncoder (the stack of two nn.TransformerEncoderLayer) through the
// TorchScript front door, scripted and traced (scripts/torchscript/make_fixtures.py,
// write_encoder_stack): the stack's nested-tensor fast path and each layer's fused op are made
// unreachable at load (graph_passes.h), every Linear of both layers becomes a qforge layer, and the
// float forward is PyTorch's composite path, with and without a key padding mask.
#include <gtest/gtest.h>

#include <torch/script.h>

#include <cmath>
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

struct StackForm {
  const char* name;
  bool batch_first;
  bool final_norm;     // a LayerNorm after the last layer
  bool mask_input;     // the traced wrapper takes (x, key_padding_mask); the others take src first
  const char* prefix;  // module path of the nn.TransformerEncoder in the file
};

// nested: batch first, post-norm, final LayerNorm, enable_nested_tensor=True (PyTorch's nested path
// exists for it); plain: sequence first, norm_first, no final norm, enable_nested_tensor=False.
const StackForm kForms[] = {{"encoder_stack_nested_scripted", true, true, false, ""},
                            {"encoder_stack_nested_traced", true, true, true, "encoder."},
                            {"encoder_stack_plain_scripted", false, false, false, ""},
                            {"encoder_stack_plain_traced", false, false, false, ""}};

bool scripted(const StackForm& f) { return std::string(f.name).find("scripted") != std::string::npos; }

std::vector<std::string> stack_layers(const std::string& prefix) {
  std::vector<std::string> out;
  for (const char* layer : {"layers.0.", "layers.1."})
    for (const char* l : {"self_attn.in_proj_weight", "self_attn.matmul_0", "self_attn.matmul_1", "self_attn.out_proj",
                          "linear1", "linear2"})
      out.push_back(prefix + layer + l);
  return out;
}

// Random input of `batch` sequences of `seq` tokens of width 16 in the form's layout.
at::Tensor input(const StackForm& f, int64_t batch, int64_t seq) {
  return f.batch_first ? torch::randn({batch, seq, 16}) : torch::randn({seq, batch, 16});
}

// Pads the tails of sequences 1 and 2 (left aligned, as PyTorch's nested path requires).
at::Tensor padding_mask(int64_t batch, int64_t seq) {
  at::Tensor kpm = torch::zeros({batch, seq}, torch::kBool);
  kpm.index_put_({1, torch::indexing::Slice(seq - 2)}, true);
  kpm.index_put_({2, torch::indexing::Slice(seq / 2)}, true);
  return kpm;
}

// The form's inputs: (x, mask) for the traced wrapper, (src, None, key_padding_mask) scripted,
// src alone without a mask.
std::vector<c10::IValue> inputs(const StackForm& f, const at::Tensor& x, const at::Tensor& kpm) {
  if (!kpm.defined()) return {x};
  if (f.mask_input) return {x, kpm};
  return {x, c10::IValue(), kpm};
}

}  // namespace

TEST(TorchScriptTransformerEncoder, EveryLinearOfTheStackIsALayerFastPathsUnreachableFloatForwardEqual) {
  torch::manual_seed(21);
  for (const StackForm& f : kForms) {
    SCOPED_TRACE(f.name);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(f.name));
    EXPECT_EQ(layer_paths(m), stack_layers(f.prefix)) << m->describe();
    EXPECT_EQ(count_ops(m, "aten::layer_norm"), f.final_norm ? 5 : 4) << m->describe();
    expect_only_weightless_float_calls(m);
    EXPECT_EQ(sliced_reads(m), scripted(f) ? 8 : 0) << m->describe();
    const std::string graph = m->script().get_method("forward").graph()->toString();
    for (const char* op : {"aten::_nested_tensor_from_mask(", "aten::_transformer_encoder_layer_fwd(", "to_padded_tensor("})
      EXPECT_EQ(graph.find(op), std::string::npos) << op;
    m->eval();
    const at::Tensor x = input(f, 3, 7);
    const auto run = inputs(f, x, f.mask_input ? torch::zeros({3, 7}, torch::kBool) : at::Tensor());
    const at::Tensor y = m->forward(run).toTensor();
    EXPECT_TRUE(at::equal(y, original_call(f.name, run, true).toTensor())) << f.name;
    // Without gradients, batch first, PyTorch runs each layer's fused op: the same within 1e-6.
    const at::Tensor fast = original_call(f.name, run, false).toTensor();
    EXPECT_LE(relative_error(y.detach(), fast), 1e-6);
    if (f.batch_first && scripted(f)) {
      EXPECT_FALSE(at::equal(y, fast));  // the fused path ran: the bound is not vacuous
    }
    EXPECT_FALSE(at::equal(y, m->forward(inputs(f, x * 1.5, f.mask_input ? torch::zeros({3, 7}, torch::kBool)
                                                                         : at::Tensor()))
                                  .toTensor()));
  }
}

// A key padding mask (and a causal src mask): PyTorch's composite path bit for bit; where PyTorch
// takes its nested-tensor path (batch first, enable_nested_tensor, eval, no gradients), the kept
// positions within 1e-6: that path returns zeros at padded positions, the composite path values.
TEST(TorchScriptTransformerEncoder, KeyPaddingMaskAgreesWithPyTorchsCompositeAndNestedPaths) {
  torch::manual_seed(22);
  const at::Tensor kpm = padding_mask(4, 9);
  const at::Tensor causal = torch::triu(torch::full({9, 9}, -INFINITY), 1);
  for (const StackForm& f : kForms) {
    if (!scripted(f) && !f.mask_input) continue;  // a trace of src alone has no mask input
    SCOPED_TRACE(f.name);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(f.name));
    m->eval();
    const at::Tensor x = input(f, 4, 9);
    const auto run = inputs(f, x, kpm);
    const at::Tensor y = m->forward(run).toTensor();
    EXPECT_TRUE(at::equal(y, original_call(f.name, run, true).toTensor()));
    EXPECT_FALSE(at::equal(y, m->forward(inputs(f, x, torch::zeros({4, 9}, torch::kBool))).toTensor()));
    if (f.batch_first && scripted(f)) {
      const at::Tensor nested = original_call(f.name, run, false).toTensor();
      const at::Tensor padded = nested.index({kpm}), keep = kpm.logical_not();
      EXPECT_TRUE(at::equal(padded, torch::zeros_like(padded)));  // PyTorch took its nested path
      EXPECT_FALSE(at::equal(y.index({kpm}).detach(), padded));   // the composite path computes them
      EXPECT_LE(relative_error(y.index({keep}).detach(), nested.index({keep})), 1e-6);
    }
    if (!scripted(f)) continue;
    for (const c10::IValue& mask : {c10::IValue(causal), c10::IValue()}) {
      for (const c10::IValue& key : {c10::IValue(kpm), c10::IValue()}) {
        const std::vector<c10::IValue> masked{x, mask, key};
        EXPECT_TRUE(at::equal(m->forward(masked).toTensor(), original_call(f.name, masked, true).toTensor()));
      }
    }
  }
}

// Train mode with gradients: the same seed gives the same dropout masks on both sides.
TEST(TorchScriptTransformerEncoder, TrainModeEqualsPyTorchWithTheSameSeed) {
  torch::manual_seed(23);
  for (const char* form : {"encoder_stack_nested_scripted", "encoder_stack_plain_scripted"})
    qforge::jit_test::expect_train_mode_equals_pytorch(form, torch::randn({4, 9, 16}));
}

// Bounds: dynamic int8 (per-channel weights, per-token activations) 0.02, static W8A8 (minmax,
// per-tensor activations calibrated on one random batch, measured on another) 0.08 of the largest
// float output, as for one encoder layer; measured values in docs/torchscript.md.
TEST(TorchScriptTransformerEncoder, DynamicAndStaticW8A8ErrorBoundsFrozenSavedLoaded) {
  torch::manual_seed(24);
  const at::Tensor kpm = padding_mask(8, 12);
  for (const StackForm& f : kForms) {
    for (const bool masked : {false, true}) {
      if (masked != f.mask_input && !(masked && scripted(f))) continue;
      SCOPED_TRACE(std::string(f.name) + (masked ? " with a key padding mask" : ""));
      const auto calib = inputs(f, input(f, 8, 12), masked ? kpm : at::Tensor());
      const auto run = inputs(f, input(f, 8, 12), masked ? kpm : at::Tensor());
      const double dynamic = qforge::jit_test::dynamic_int8_error(f.name, run);
      const double frozen = qforge::jit_test::static_w8a8_round_trip(f.name, calib, run);
      std::printf("%s%s: relative error dynamic int8 %.4f, static W8A8 frozen %.4f\n", f.name,
                  masked ? " (key padding mask)" : "", dynamic, frozen);
      EXPECT_LE(dynamic, 0.02);
      EXPECT_LE(frozen, 0.08);
    }
  }
}

// A trace made under torch.no_grad() with a key padding mask records PyTorch's nested path: the
// fused layers read the weights themselves, so nothing is quantized and each is listed with why.
TEST(TorchScriptTransformerEncoder, NoGradTraceKeepsTheFusedLayersFloatWithTheReason) {
  ScriptedModel m = qforge::jit::load_torchscript(fixture("encoder_stack_nograd_traced"));
  EXPECT_TRUE(m->layers().empty()) << m->describe();
  EXPECT_EQ(count_ops(m, "aten::_transformer_encoder_layer_fwd"), 2) << m->describe();
  EXPECT_NE(m->describe().find("trace with gradients enabled, or script"), std::string::npos) << m->describe();
  torch::manual_seed(25);
  const at::Tensor x = torch::randn({4, 9, 16}), kpm = padding_mask(4, 9);
  m->eval();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(m->forward({x, kpm}).toTensor(),
                        original_call("encoder_stack_nograd_traced", {x, kpm}, false).toTensor()));
}
