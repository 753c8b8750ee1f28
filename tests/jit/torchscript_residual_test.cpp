// Residual connections in TorchScript graphs (framework/jit/conv_chain.h, fuse_residual_adds):
// ResNet's `out += identity; relu(out)`, a downsampling block's `relu(out + shortcut)` and
// MobileNetV2's `x + conv(x)` become qforge::conv2d_add, whose frozen layer adds the residual (and
// applies the ReLU) in its epilogue with the values of ATen's add and ReLU.
#include <gtest/gtest.h>

#include <torch/script.h>

#include <string>
#include <utility>
#include <vector>

#include "framework/api/quantize.h"
#include "framework/jit/scripted_model.h"
#include "framework/nn/conv.h"
#include "tests/jit/jit_test_util.h"

namespace {

using qforge::jit::ScriptedModel;
using qforge::jit_test::fixture;
using qforge::jit_test::layer_paths;
using qforge::jit_test::TempDir;
using qforge::jit_test::w8a8;

// ResidualCnn's forward (make_fixtures.py) with its layers called one by one and ATen's add / ReLU.
at::Tensor one_by_one(const ScriptedModel& m, const at::Tensor& x) {
  const auto& L = m->layers();  // stem, conv1, conv2, conv3, conv4, down, project, fc
  const at::Tensor h = at::max_pool2d(at::relu(L[0]->forward(x)), 3, 1, 1);
  const at::Tensor x1 = at::relu(at::add(L[2]->forward(at::relu(L[1]->forward(h))), h));
  const at::Tensor x2 = at::relu(at::add(L[4]->forward(at::relu(L[3]->forward(x1))), L[5]->forward(x1)));
  const at::Tensor x3 = at::add(x2, L[6]->forward(x2));
  return L[7]->forward(x3.flatten(1));
}

}  // namespace

TEST(TorchScript, ResidualAddsRunInTheConvolutionEpilogueOnceFrozen) {
  for (const char* name : {"residual_cnn_scripted", "residual_cnn_traced"}) {
    SCOPED_TRACE(name);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(name));
    ASSERT_EQ(layer_paths(m), (std::vector<std::string>{"stem", "conv1", "conv2", "conv3", "conv4", "down",
                                                        "project", "fc"}));
    // A scripted BatchNorm keeps its input-shape checks (aten::dim / aten::size of the conv's
    // output) after the fold, so conv2's output has other uses there and stays unfused.
    const bool traced = std::string(name).find("traced") != std::string::npos;
    std::vector<std::pair<std::string, bool>> want{{"conv4", true}, {"project", false}};
    if (traced) want.insert(want.begin(), {"conv2", true});
    std::vector<std::pair<std::string, bool>> got;
    for (const auto& a : m->residual_adds()) got.emplace_back(a.layer, a.relu);
    EXPECT_EQ(got, want) << m->graph_notes();
    EXPECT_NE(m->graph_notes().find("residual  conv4 + aten::add -> aten::relu: in its epilogue"), std::string::npos)
        << m->graph_notes();
    EXPECT_NE(m->graph_notes().find("residual  project + aten::add: in its epilogue"), std::string::npos);
    EXPECT_EQ(m->max_pools(), 1);
    EXPECT_NE(m->graph_notes().find("pooled  aten::max_pool2d (1 call)"), std::string::npos);

    torch::manual_seed(0);
    const at::Tensor x = torch::randn({3, 1, 14, 14});
    m->eval();
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(at::equal(m->forward(x), one_by_one(m, x)));  // float: ATen's add and ReLU
    qforge::quantize(*m, w8a8());
    {
      qforge::Calibration calib(*m);
      for (int i = 0; i < 4; ++i) m->forward(torch::randn({8, 1, 14, 14}));
    }
    qforge::freeze(*m);
    const at::Tensor frozen = m->forward(x);
    EXPECT_TRUE(at::equal(frozen, one_by_one(m, x)));

    // The layer's own call: residuals channels last (as integer convolutions leave them), NCHW
    // contiguous (copied to channels last) and one that broadcasts (added after the convolution).
    auto* conv2 = dynamic_cast<qforge::nn::Conv2dImpl*>(m->layers()[2]->module().get());
    ASSERT_NE(conv2, nullptr);
    ASSERT_TRUE(conv2->integer_frozen());
    const at::Tensor in = at::relu(torch::randn({3, 8, 14, 14}));
    const at::Tensor y = conv2->forward(in);
    for (const at::Tensor& r : {m->layers()[0]->forward(x), torch::randn({3, 8, 14, 14}), torch::randn({1, 8, 1, 1})}) {
      for (bool relu : {false, true}) {
        const at::Tensor want = relu ? at::relu(at::add(y, r)) : at::add(y, r);
        EXPECT_TRUE(at::equal(conv2->forward_add(in, r, relu), want)) << r.sizes() << " relu " << relu;
      }
    }
    // The graph's add_ keeps the convolution output's type (a double residual), aten::add promotes.
    const at::Tensor r64 = torch::randn({3, 8, 14, 14}, at::kDouble);
    EXPECT_TRUE(at::equal(conv2->forward_add(in, r64, true, /*in_place=*/true), at::relu(y.clone().add_(r64))));
    EXPECT_EQ(conv2->forward_add(in, r64, true, /*in_place=*/false).scalar_type(), at::kDouble);

    // A saved file keeps the fused calls: C++ runs it without qforge's model around it.
    TempDir dir;
    const std::string path = (dir.path / "residual_frozen.pt").string();
    m->save(path);
    ScriptedModel back = qforge::jit::load_torchscript(path);
    EXPECT_EQ(back->residual_adds().size(), want.size());
    torch::jit::Module plain = torch::jit::load(path);
    plain.eval();
    EXPECT_TRUE(at::equal(plain.forward({x}).toTensor(), frozen));
  }
}
