// The graph forms of scripts/torchscript/make_fixtures.py's Chain and MatmulForms: rewritten calls
// that feed each other directly (Conv -> folded BatchNorm -> Conv, Linear -> Linear), and every
// weight x matrix and embedding form the front door takes or keeps float, with its reason.
#include <gtest/gtest.h>

#include <torch/script.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "framework/api/quantize.h"
#include "framework/jit/scripted_model.h"
#include "tests/jit/jit_test_util.h"

using qforge::jit::LayerKind;
using qforge::jit::ScriptedModel;
using qforge::jit_test::fixture;
using qforge::jit_test::layer_paths;

// Each rewritten call reads the value the call before it was rewritten into: the float forward is
// the layers' own weights run by ATen, bit for bit, and the script's within the folding's rounding.
TEST(TorchScriptChain, RewrittenCallsFeedingEachOtherRunBitForBit) {
  torch::manual_seed(5);
  for (const char* form : {"chain_scripted", "chain_traced"}) {
    SCOPED_TRACE(form);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
    EXPECT_EQ(layer_paths(m), (std::vector<std::string>{"conv1", "conv2", "down", "up"}));
    using Fold = std::pair<std::string, std::string>;
    EXPECT_EQ(m->folded(), (std::vector<Fold>{{"bn1", "conv1"}}));
    EXPECT_TRUE(m->kept_float().empty()) << m->describe();
    m->eval();
    torch::NoGradGuard no_grad;
    const at::Tensor x = torch::randn({6, 1, 14, 14});
    const auto& l = m->layers();
    at::Tensor ref = at::conv2d(x, l[0]->weight(), l[0]->bias(), 1, 1);
    ref = at::conv2d(ref, l[1]->weight(), l[1]->bias(), 1, 1);
    ref = at::linear(at::linear(ref.flatten(1), l[2]->weight(), l[2]->bias()), l[3]->weight(), l[3]->bias());
    const at::Tensor y = m->forward(x);
    EXPECT_TRUE(at::equal(y, ref));
    torch::jit::Module original = torch::jit::load(fixture(form));
    original.eval();
    const at::Tensor want = original.forward({x}).toTensor();
    EXPECT_LE((y - want).abs().max().item<double>(), 1e-5 * want.abs().max().item<double>());

    // The whole path: W8A8, calibrated, frozen (integer kernels), run.
    qforge::quantize(*m, qforge::jit_test::w8a8());
    {
      qforge::Calibration calibration(*m);
      m->forward(x);
    }
    qforge::freeze(*m);
    const at::Tensor frozen = m->forward(x);
    const double error = (frozen - want).abs().max().item<double>() / want.abs().max().item<double>();
    std::printf("%s: frozen W8A8 relative error %.4f\n", form, error);
    EXPECT_LE(error, 0.05);
  }
}

// Layers found, calls kept float with their reasons, and the rewritten graph's float forward equal
// to the script's bit for bit.
TEST(TorchScriptForms, WeightMatrixAndEmbeddingFormsTakenOrKeptFloatWithAReason) {
  ScriptedModel m = qforge::jit::load_torchscript(fixture("matmul_forms_scripted"));
  // mm(x, t(W)), addmm(b, x, t(W)), matmul(x, W.T), x @ W.transpose(0, 1), x @ W.transpose(-1, 0),
  // x @ W with W [in, out], mm(W, x.t()) (the weight on the left: qforge::linear_left), and
  // nn.Embedding(padding_idx=0).
  ASSERT_EQ(layer_paths(m),
            (std::vector<std::string>{"w_mm", "w_addmm", "w_T", "w_tr", "w_tr_neg", "w_in_out", "w_left", "emb"}))
      << m->describe();
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(m->layers()[i]->spec().kind, LayerKind::kLinear);
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(m->layers()[i]->spec().weight_transposed, i == 5);
  EXPECT_EQ(m->layers()[6]->spec().out, 8);  // W [out, in] as a Linear holds it
  EXPECT_FALSE(m->layers()[0]->spec().bias);
  EXPECT_TRUE(m->layers()[1]->spec().bias);
  EXPECT_EQ(m->layers()[7]->spec().kind, LayerKind::kEmbedding);
  EXPECT_EQ(m->layers()[7]->spec().padding_idx, 0);
  EXPECT_NE(m->script().get_method("forward").graph()->toString().find("qforge::linear_left"), std::string::npos);
  std::map<std::string, std::string> reasons;  // name (first attribute read) -> reason
  std::map<std::string, int> twice;
  for (const auto& f : m->kept_float()) {
    if (f.reason.find("aten::t of a module attribute") != std::string::npos) ++twice[f.op];
    else reasons[f.name] = f.reason;
  }
  EXPECT_EQ(m->kept_float().size(), 8u) << m->describe();
  EXPECT_EQ(twice, (std::map<std::string, int>{{"aten::mm", 2}}));  // t(w_twice) read by two mm
  const std::map<std::string, std::string> want{
      {"b_scaled", "addmm with beta or alpha other than the constant 1"},
      {"b_bcast", "the added term has 1 values for 8 outputs"},
      {"emb_sparse", "scale_grad_by_freq / sparse gradients"},
      {"w_freq", "scale_grad_by_freq / sparse gradients"},
      {"w_pad_past", "padding_idx 25 is past the table's 20 rows"},
      // Not done: F.embedding's scripted padding_idx check reads weight.size(0), a second read.
      {"emb_pad2", "its weight is read 2 times in the graph, 1 of them by other ops"}};
  for (const auto& [name, reason] : want) {
    ASSERT_TRUE(reasons.count(name)) << name << "\n" << m->describe();
    EXPECT_NE(reasons.at(name).find(reason), std::string::npos) << name << ": " << reasons.at(name);
  }
  m->eval();
  torch::jit::Module original = torch::jit::load(fixture("matmul_forms_scripted"));
  original.eval();
  torch::NoGradGuard no_grad;
  torch::manual_seed(6);
  const at::Tensor x = torch::randn({5, 16});
  const at::Tensor want_y = original.forward({x}).toTensor();
  EXPECT_TRUE(at::equal(m->forward(x), want_y));
  EXPECT_FALSE(at::equal(want_y, original.forward({2 * x}).toTensor()));  // the check can fail
  // Every form taken, W @ x included, calibrated, frozen, saved and loaded both ways.
  const double error = qforge::jit_test::static_w8a8_round_trip("matmul_forms_scripted", {torch::randn({32, 16})}, {x});
  std::printf("matmul_forms_scripted: static W8A8 frozen relative error %.4f\n", error);
  EXPECT_LE(error, 0.1);
}

// x @ W with W stored [in, out] (GPT-2's Conv1D addmm, mm, matmul): a qforge Linear holding W's
// transpose as a view of W, so the float forward is the script's bit for bit and a QAT step on the
// model's trainable parameters updates the script's own W; frozen, saved and loaded both ways.
TEST(TorchScriptForms, XTimesWInOutIsALinearHoldingWTransposedBoundToW) {
  torch::manual_seed(7);
  for (const char* form : {"in_out_forms_scripted", "in_out_forms_traced"}) {
    SCOPED_TRACE(form);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
    ASSERT_EQ(layer_paths(m), (std::vector<std::string>{"c_fc", "w_mm", "w_matmul"})) << m->describe();
    EXPECT_TRUE(m->kept_float().empty()) << m->describe();
    const std::vector<std::vector<int64_t>> in_out{{16, 24}, {24, 24}, {24, 8}};
    for (size_t i = 0; i < 3; ++i) {
      const auto& spec = m->layers()[i]->spec();
      EXPECT_TRUE(spec.weight_transposed);
      EXPECT_EQ((std::vector<int64_t>{spec.in, spec.out}), in_out[i]);
      EXPECT_EQ(spec.bias, i == 0);
    }
    torch::jit::Module& script = m->script();
    const at::Tensor w = script.attr("c_fc").toModule().attr("weight").toTensor();
    EXPECT_EQ(m->layers()[0]->weight().data_ptr(), w.data_ptr());  // the same storage, transposed
    const at::Tensor x = torch::randn({3, 5, 16});
    m->eval();
    torch::jit::Module original = torch::jit::load(fixture(form));
    original.eval();
    {
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(at::equal(m->forward(x), original.forward({x}).toTensor()));
    }

    // W8A8, calibrated, one SGD step: the loss goes down and the script's own W moved with the layer.
    qforge::quantize(*m, qforge::jit_test::w8a8());
    {
      torch::NoGradGuard no_grad;
      qforge::Calibration calibration(*m);
      m->forward(x);
    }
    const at::Tensor target = torch::randn({3, 5, 8});
    m->train();
    torch::optim::SGD opt(m->trainable_parameters(), torch::optim::SGDOptions(0.05));
    const at::Tensor w_before = w.clone();
    const auto loss = [&] { return (m->forward(x) - target).pow(2).mean(); };
    const at::Tensor l0 = loss();
    opt.zero_grad();
    l0.backward();
    opt.step();
    EXPECT_LT(loss().item<double>(), l0.item<double>());
    const at::Tensor w_now = script.attr("c_fc").toModule().attr("weight").toTensor();
    EXPECT_FALSE(at::equal(w_now, w_before));
    EXPECT_TRUE(at::equal(w_now, m->layers()[0]->weight().t()));

    m->eval();
    qforge::freeze(*m);
    torch::NoGradGuard no_grad;
    const at::Tensor frozen = m->forward(x);
    const auto reloaded = qforge::jit_test::save_and_reload(m, x);
    EXPECT_TRUE(at::equal(reloaded.plain, frozen));
    EXPECT_TRUE(at::equal(reloaded.again, frozen));
  }
}

// Saved before freezing, the file's layers come back bound to the script's W again (a view).
TEST(TorchScriptForms, XTimesWInOutSavedCalibratedRebindsToW) {
  torch::manual_seed(8);
  ScriptedModel m = qforge::jit::load_torchscript(fixture("in_out_forms_scripted"));
  m->eval();
  qforge::quantize(*m, qforge::jit_test::w8a8());
  const at::Tensor x = torch::randn({3, 5, 16});
  torch::NoGradGuard no_grad;
  {
    qforge::Calibration calibration(*m);
    m->forward(x);
  }
  const at::Tensor y = m->forward(x);
  const auto reloaded = qforge::jit_test::save_and_reload(m, x);
  EXPECT_TRUE(at::equal(reloaded.again, y));
  ScriptedModel again = reloaded.model;
  for (const char* name : {"w_mm", "w_matmul"}) {
    const at::Tensor w = again->script().attr(name).toTensor();
    const auto& layers = again->layers();
    const auto l = std::find_if(layers.begin(), layers.end(), [&](const auto& p) { return p->path() == name; });
    ASSERT_NE(l, layers.end()) << name;
    EXPECT_EQ((*l)->weight().data_ptr(), w.data_ptr()) << name;
    EXPECT_TRUE(at::equal((*l)->weight().t(), w)) << name;
  }
}

// x @ B on a registered buffer is a fixed matrix, not a weight: kept float with the reason; x @ W on
// the parameter after it still becomes a Linear, and the float forward is the script's.
TEST(TorchScriptForms, XTimesBufferKeptFloatParameterTaken) {
  torch::manual_seed(8);
  for (const char* form : {"buffer_matmul_scripted", "buffer_matmul_traced"}) {
    SCOPED_TRACE(form);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
    EXPECT_EQ(layer_paths(m), (std::vector<std::string>{"w"})) << m->describe();
    ASSERT_EQ(m->kept_float().size(), 1u) << m->describe();
    EXPECT_NE(m->kept_float()[0].reason.find("on a buffer"), std::string::npos) << m->describe();
    const at::Tensor x = torch::randn({2, 5, 16});
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(at::equal(m->forward(x), torch::jit::load(fixture(form)).forward({x}).toTensor()));
  }
}

// make_fixtures.py's ProductForms: products of two activations named by the module whose forward
// makes them, also when the root's unrolled loop calls each block's child (one call site for both
// blocks), beside the layer of a module whose own weight is called `weight` (that layer has the
// module's path and holds no children: the module's child Linear and other parameter go beside it
// too), and at the root; a bmm writing an out= tensor stays float.
TEST(TorchScriptForms, ProductsNamedByTheirModuleBesideALayerOfThatPathOutFormsKeptFloat) {
  torch::manual_seed(8);
  // Each block: q @ attn.weight (the Linear "attn"), attn.gate (a child of a layer's module: beside
  // it), attn's product (beside it too), the root's bmm, proj, and the two products of sdpa, a
  // module without attributes called in the loop: named by the blocks' common path.
  const std::vector<std::string> want{
      "blocks.0.attn", "blocks.0.attn_gate", "blocks.0.attn_matmul_0", "matmul_0", "blocks.0.proj", "blocks.matmul_0",
      "blocks.matmul_1", "blocks.1.attn", "blocks.1.attn_gate", "blocks.1.attn_matmul_0", "matmul_1", "blocks.1.proj",
      "blocks.matmul_2", "blocks.matmul_3"};
  for (const char* form : {"product_forms_scripted", "product_forms_traced"}) {
    SCOPED_TRACE(form);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
    ASSERT_EQ(layer_paths(m), want) << m->describe();
    for (size_t i : {2, 3, 5, 6, 9, 10, 12, 13}) EXPECT_EQ(m->layers()[i]->spec().kind, LayerKind::kMatMul) << want[i];
    EXPECT_TRUE(m->layers()[0]->spec().weight_transposed);  // q @ self.weight, stored [in, out]
    // The attention module's other parameter is the model's, beside its layer (which holds no
    // children: a saved file's layer state stays the layer's own).
    EXPECT_TRUE(m->named_parameters().contains("blocks.0.attn_temperature"));
    EXPECT_FALSE(m->named_parameters().contains("blocks.0.attn.temperature"));
    ASSERT_EQ(m->kept_float().size(), 1u) << m->describe();
    EXPECT_EQ(m->kept_float()[0].op, "aten::bmm");
    EXPECT_NE(m->kept_float()[0].reason.find("out= tensor"), std::string::npos) << m->kept_float()[0].reason;
    m->eval();
    const at::Tensor x = torch::randn({3, 6, 8});
    {
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(at::equal(m->forward(x), qforge::jit_test::original_call(form, {x}, false).toTensor()));
    }
    const double error = qforge::jit_test::static_w8a8_round_trip(form, {torch::randn({4, 6, 8})}, {x});
    std::printf("%s: static W8A8 frozen relative error %.4f\n", form, error);
    EXPECT_LE(error, 0.1);
  }
}

// make_fixtures.py's EinsumAttention: torch.einsum("bhid,bhjd->bhij", q, k) and ("bhij,bhjd->bhid",
// att, v) are MatMuls on the operands permuted to [b, h, i, d] x [b, h, d, j] (and back); a dot
// product per token ("bti,bti->bt": no free index) stays float with the reason.
TEST(TorchScriptForms, EinsumMatrixProductsAreMatMulsOtherEquationsKeptFloat) {
  torch::manual_seed(9);
  for (const char* form : {"einsum_attention_scripted", "einsum_attention_traced"}) {
    SCOPED_TRACE(form);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
    // ... and "ij,jk" (its implicit output "ik") after out.
    ASSERT_EQ(layer_paths(m), (std::vector<std::string>{"qkv", "matmul_0", "matmul_1", "out", "matmul_2"}))
        << m->describe();
    EXPECT_EQ(m->layers()[1]->spec().kind, LayerKind::kMatMul);
    ASSERT_EQ(m->kept_float().size(), 1u) << m->describe();
    EXPECT_EQ(m->kept_float()[0].op, "aten::einsum");
    EXPECT_NE(m->kept_float()[0].reason.find("'bti,bti->bt' is not a batched matrix product"), std::string::npos)
        << m->kept_float()[0].reason;
    m->eval();
    const at::Tensor x = torch::randn({3, 7, 16});
    {
      torch::NoGradGuard no_grad;
      const at::Tensor y = m->forward(x), ref = qforge::jit_test::original_call(form, {x}, false).toTensor();
      std::printf("%s: float forward against the file's, relative %.3g\n", form, qforge::jit_test::relative_error(y, ref));
      EXPECT_LE(qforge::jit_test::relative_error(y, ref), 1e-6);
    }
    const double error = qforge::jit_test::static_w8a8_round_trip(form, {torch::randn({8, 7, 16})}, {x});
    std::printf("%s: static W8A8 frozen relative error %.4f\n", form, error);
    EXPECT_LE(error, 0.08);
    EXPECT_LE(qforge::jit_test::dynamic_int8_error(form, {x}), 0.03);
  }
}
