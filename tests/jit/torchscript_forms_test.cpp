// The graph forms of scripts/torchscript/make_fixtures.py's Chain and MatmulForms: rewritten calls
// that feed each other directly (Conv -> folded BatchNorm -> Conv, Linear -> Linear), and every
// weight x matrix and embedding form the front door takes or keeps float, with its reason.
#include <gtest/gtest.h>

#include <torch/script.h>

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
  // mm(x, t(W)), addmm(b, x, t(W)), matmul(x, W.T), x @ W.transpose(0, 1), x @ W.transpose(-1, 0)
  // and nn.Embedding(padding_idx=0).
  ASSERT_EQ(layer_paths(m), (std::vector<std::string>{"w_mm", "w_addmm", "w_T", "w_tr", "w_tr_neg", "emb"}))
      << m->describe();
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(m->layers()[i]->spec().kind, LayerKind::kLinear);
  EXPECT_FALSE(m->layers()[0]->spec().bias);
  EXPECT_TRUE(m->layers()[1]->spec().bias);
  EXPECT_EQ(m->layers()[5]->spec().kind, LayerKind::kEmbedding);
  EXPECT_EQ(m->layers()[5]->spec().padding_idx, 0);
  std::map<std::string, std::string> reasons;  // name (first attribute read) -> reason
  std::map<std::string, int> twice;
  for (const auto& f : m->kept_float()) {
    if (f.reason.find("aten::t of a module attribute") != std::string::npos) ++twice[f.op];
    else reasons[f.name] = f.reason;
  }
  EXPECT_EQ(m->kept_float().size(), 10u) << m->describe();
  EXPECT_EQ(twice, (std::map<std::string, int>{{"aten::mm", 2}}));  // t(w_twice) read by two mm
  const std::map<std::string, std::string> want{
      {"b_scaled", "addmm with beta or alpha other than the constant 1"},
      {"b_bcast", "the added term has 1 values for 8 outputs"},
      {"w_in_out", "the weight is used as [in, out] (x @ W)"},
      {"w_left", "the weight is the left operand (W @ x)"},
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
}
