// The frozen form of the RPQ layers (framework/nn/packed_weight_rpq.cpp): freeze() computes the
// same bits as the trained layer (the same kernels run), its tensors leave the module, describe()
// and model_size() report it, device moves off the CPU are refused, and checkpoints round trip
// (frozen ones rebuild frozen; the unfrozen fixture written before the frozen form still loads).
// Not covered: freeze() refusing an RPQ layer on a GPU (the suite runs without a CUDA device).
#include <gtest/gtest.h>
#include <torch/nn/modules/conv.h>

#include <cmath>
#include <cstdlib>

#include "framework/api/quantize.h"
#include "framework/format/safetensors.h"
#include "framework/io/checkpoint.h"
#include "framework/io/model_file.h"
#include "framework/io/model_io.h"
#include "framework/nn/rpq.h"
#include "tests/error_of.h"
#include "tests/io/io_test_util.h"
#include "tests/paths.h"

using namespace qforge;
using qforge::io::testing::same_tensor;
using qforge::io::testing::TempDir;
using qforge::testing::error_of;

namespace {

// The model of tests/fixtures/rpq_v1.h5 (written unfrozen, before RPQ layers had a frozen form).
struct RpqV1Net : torch::nn::Module {
  RpqV1Net() {
    fc = register_module("fc", nn::RPQLinear(24, 8, 2));
    emb = register_module("emb", nn::RPQEmbedding(40, 8, 4));
    conv = register_module("conv", nn::RPQConv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1), 2));
  }
  nn::RPQLinear fc{nullptr};
  nn::RPQEmbedding emb{nullptr};
  nn::RPQConv2d conv{nullptr};
};

// Fixed inputs: 1 and 5 rows (look-up sums), 40 rows (expanded weight), ids, an image.
struct RpqInputs {
  at::Tensor x1 = at::randn({1, 24}), x5 = at::randn({5, 24}), x40 = at::randn({2, 20, 24});
  at::Tensor ids = at::randint(40, {3, 7}, at::kLong);
  at::Tensor img = at::randn({2, 3, 6, 6});
};

std::vector<at::Tensor> rpq_outputs(RpqV1Net& m, const RpqInputs& in) {
  at::NoGradGuard g;
  return {m.fc(in.x1), m.fc(in.x5), m.fc(in.x40), m.emb(in.ids), m.emb(in.ids.to(at::kInt)), m.conv(in.img)};
}

void expect_same_rpq_outputs(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_tensor(a[i], b[i])) << what << ": output " << i;
}

}  // namespace

TEST(RPQFrozen, EveryLayerComputesTheSameBitsAndHoldsNoParameters) {
  at::manual_seed(3);
  RpqV1Net m;
  const RpqInputs in;
  const std::vector<at::Tensor> before = rpq_outputs(m, in);
  const int64_t bytes = model_size(m).total_bytes;
  const at::Tensor fc_weight = m.fc->weight().detach();
  freeze(m);
  EXPECT_TRUE(m.fc->frozen() && m.emb->frozen() && m.conv->frozen());
  expect_same_rpq_outputs(before, rpq_outputs(m, in), "frozen RpqV1Net");
  EXPECT_TRUE(same_tensor(m.fc->weight(), fc_weight));
  // Codebooks and biases left the parameters: nothing trains them any more. The indices buffers
  // share the packed weights' storage.
  EXPECT_EQ(m.parameters().size(), 0u);
  ASSERT_EQ(m.buffers().size(), 3u);
  EXPECT_EQ(m.named_buffers()["fc.indices"].data_ptr(), m.fc->indices().data_ptr());
  EXPECT_FALSE(m.fc(in.x1).requires_grad());
  // The packed weights hold exactly what the layers held.
  EXPECT_EQ(model_size(m).total_bytes, bytes);
  EXPECT_EQ(m.fc->packed_weight()->bytes(), 2 * 256 * 4 * 4 + 2 * 24 + 8 * 4);
  EXPECT_EQ(m.fc->storage_bytes(), m.fc->packed_weight()->bytes());
  EXPECT_TRUE(same_tensor(m.fc->packed_weight()->bias(), m.fc->bias()));
  EXPECT_FALSE(m.fc->packed_weight()->weight().defined());  // codebooks are no QuantizedTensor grid
  EXPECT_TRUE(m.fc->packed_weight()->device().is_cpu());
  // Freezing again changes nothing; a frozen layer's codebooks cannot be replaced.
  freeze(m);
  expect_same_rpq_outputs(before, rpq_outputs(m, in), "frozen twice");
  EXPECT_NE(error_of([&] { m.fc->set_rpq_state(m.fc->codebooks(), m.fc->indices(), at::Tensor()); })
                .find("RPQLinear: set_rpq_state on a frozen layer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { m.fc->reset(); }).find("frozen"), std::string::npos);
  // Bad input keeps its error.
  EXPECT_NE(error_of([&] { m.fc(at::randn({2, 23})); }).find("RPQLinear: input has 23 features, expected 24"),
            std::string::npos);
  EXPECT_NE(error_of([&] { m.emb(at::full({2}, 40, at::kLong)); }).find("index 40 is out of range [0, 40)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { m.emb(at::zeros({2})); }).find("indices must be integers"), std::string::npos);
}

TEST(RPQFrozen, TransposedConvolutionsBilinearAndPaddingIdxFreezeToTheSameBits) {
  at::manual_seed(4);
  nn::RPQConvTranspose1d ct(torch::nn::ConvTranspose1dOptions(4, 6, 3).stride(2).groups(2), 3);
  nn::RPQConv3d c3(torch::nn::Conv3dOptions(2, 4, 2).bias(false), 2);
  nn::RPQBilinear bl(torch::nn::BilinearOptions(5, 6, 4), 2);
  nn::RPQEmbedding pad(torch::nn::EmbeddingOptions(10, 6).padding_idx(-1), 3);
  nn::RPQLinear nobias(torch::nn::LinearOptions(300, 16).bias(false), 4);  // more columns than codes
  const at::Tensor x = at::randn({2, 4, 7}), v = at::randn({1, 2, 3, 4, 4}), a = at::randn({3, 5}), b = at::randn({3, 6});
  const at::Tensor ids = at::tensor({0, 9, 3, 9}, at::kLong), xs = at::randn({3, 300}), xl = at::randn({17, 300});
  at::NoGradGuard g;
  const std::vector<at::Tensor> before{ct(x), c3(v), bl(a, b), pad(ids), nobias(xs), nobias(xl)};
  for (nn::RPQLayer* l : std::vector<nn::RPQLayer*>{ct.get(), c3.get(), bl.get(), pad.get(), nobias.get()}) l->freeze();
  expect_same_rpq_outputs(before, {ct(x), c3(v), bl(a, b), pad(ids), nobias(xs), nobias(xl)}, "frozen layers");
  EXPECT_EQ(nobias->kernel(3), "rpq_lut");
  EXPECT_EQ(nobias->kernel(17), "rpq_expand+at::linear");
  EXPECT_FALSE(c3->packed_weight()->bias().defined());
  // Convolutions and Bilinear run their ATen op on the expanded weight: the packed weight has no forward of its own.
  EXPECT_NE(error_of([&] { ct->packed_weight()->forward(x, nn::FrozenInput{}); }).find("no packed forward"),
            std::string::npos);
}

TEST(RPQFrozen, DescribeAndModelSizeListFrozenLayers) {
  at::manual_seed(5);
  RpqV1Net m;
  freeze(m);
  const std::vector<LayerReport> rows = layer_reports(m);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].name, "fc");
  EXPECT_EQ(rows[0].type, "RPQLinear");
  EXPECT_EQ(rows[0].weights, "rpq 2 codebooks x 256 x 4 (uint8 indices, frozen)");
  EXPECT_EQ(rows[0].activations, "float");
  EXPECT_EQ(rows[0].kernel, "rpq_lut");
  EXPECT_EQ(rows[0].fallback_reason, "");
  EXPECT_EQ(rows[0].bytes, 2 * 256 * 4 * 4 + 2 * 24 + 8 * 4);
  EXPECT_EQ(rows[1].kernel, "rpq_gather_rows");
  EXPECT_EQ(rows[2].weights, "rpq 2 codebooks x 256 x 2 (uint8 indices, frozen)");
  EXPECT_EQ(rows[2].kernel, "rpq_expand+dense");
  EXPECT_EQ(rows[2].fallback_reason, "the weight is expanded from the codebooks per call");
  const ModelSize s = model_size(m);
  for (const auto& l : s.layers) EXPECT_EQ(l.kind, "rpq") << l.name;
  EXPECT_EQ(s.quantized_bytes, s.total_bytes);
  EXPECT_NE(describe(m).find("(uint8 indices, frozen)"), std::string::npos);
  // A model root that is itself an RPQ layer is listed and frozen too.
  nn::RPQLinear root(8, 4, 2);
  freeze(root);
  EXPECT_TRUE(root->frozen());
  ASSERT_EQ(layer_reports(root).size(), 1u);
  EXPECT_EQ(layer_reports(root)[0].name, "(root)");
}

TEST(RPQFrozen, DeviceMovesOffTheCpuAreRefused) {
  at::manual_seed(6);
  RpqV1Net m;
  freeze(m);
  const RpqInputs in;
  const std::vector<at::Tensor> before = rpq_outputs(m, in);
  const std::string why = error_of([&] { m.fc->to(at::Device(at::kCUDA, 0)); });
  EXPECT_NE(why.find("RPQLinear: a frozen RPQ layer runs on the CPU only (its packed weight has no CUDA form)"),
            std::string::npos)
      << why;
  EXPECT_NE(error_of([&] { m.conv->to(at::Device(at::kCUDA, 0), at::kFloat); }).find("runs on the CPU only"),
            std::string::npos);
  EXPECT_NE(error_of([&] { m.emb->packed_weight()->to(at::Device(at::kCUDA, 0)); }).find("CPU only"),
            std::string::npos);
  // The CPU is fine, and nothing changed.
  m.to(at::kCPU);
  EXPECT_EQ(m.fc->packed_weight()->to(at::kCPU), m.fc->packed_weight());
  expect_same_rpq_outputs(before, rpq_outputs(m, in), "after refused moves");
}

TEST(RPQFrozen, CheckpointRoundTripRebuildsTheFrozenModelBitForBit) {
  at::manual_seed(8);
  RpqV1Net a;
  const RpqInputs in;
  freeze(a);
  const std::vector<at::Tensor> want = rpq_outputs(a, in);
  TempDir dir;
  const std::string path = dir.file("frozen.h5");
  io::save_model(a, path);
  // The file holds the unfrozen layer's datasets: codebooks and bias as parameters, indices as a buffer.
  const io::CheckpointReader r(path);
  EXPECT_TRUE(same_tensor(r.read_tensor("fc.codebooks", io::Section::kParameters), a.fc->codebooks()));
  EXPECT_TRUE(same_tensor(r.read_tensor("fc.bias", io::Section::kParameters), a.fc->bias()));
  EXPECT_TRUE(same_tensor(r.read_tensor("emb.indices", io::Section::kBuffers), a.emb->indices()));
  // A freshly built model loads it frozen and computes the same bits, holding the same bytes.
  at::manual_seed(9);
  RpqV1Net b;
  const io::LoadReport rep = io::load_model(b, path);
  EXPECT_EQ(rep.frozen_layers, (std::vector<std::string>{"fc", "emb", "conv"}));
  EXPECT_TRUE(b.fc->frozen() && b.emb->frozen() && b.conv->frozen());
  expect_same_rpq_outputs(want, rpq_outputs(b, in), "loaded frozen");
  EXPECT_EQ(model_size(b).total_bytes, model_size(a).total_bytes);
  EXPECT_EQ(model_size(b).total_bytes, (2 * 256 * 4 * 4 + 2 * 24 + 8 * 4) + (4 * 256 * 2 * 4 + 4 * 40) +
                                           (2 * 256 * 2 * 4 + 2 * 27 + 4 * 4));
  // Saved again: the same datasets.
  const std::string again = dir.file("again.h5");
  io::save_model(b, again);
  const io::CheckpointReader r2(again);
  ASSERT_EQ(r.entries().size(), r2.entries().size());
  for (const io::EntryInfo& e : r.entries())
    EXPECT_TRUE(same_tensor(r.read_tensor(e.key, e.section), r2.read_tensor(e.key, e.section))) << e.key;
  // The dequantized load leaves the layers unfrozen with the same tensors.
  RpqV1Net c;
  io::LoadModelOptions deq;
  deq.dequantize = true;
  EXPECT_TRUE(io::load_model(c, path, deq).frozen_layers.empty());
  EXPECT_FALSE(c.fc->frozen());
  expect_same_rpq_outputs(want, rpq_outputs(c, in), "dequantized load");
  // safetensors: the same tensors under the same names.
  const std::string st = dir.file("frozen.safetensors");
  io::export_safetensors(a, st);
  const io::SafetensorsFile f = io::read_safetensors(st);
  EXPECT_TRUE(same_tensor(f.tensors.at("conv.codebooks"), a.conv->codebooks()));
  EXPECT_TRUE(same_tensor(f.tensors.at("conv.bias"), a.conv->bias()));
  EXPECT_NE(f.metadata.at("qforge.rpq").find("\"conv\""), std::string::npos);
}

TEST(RPQFrozen, FailedLoadsLeaveTheModelUntouched) {
  at::manual_seed(10);
  RpqV1Net a;
  freeze(a);
  TempDir dir;
  const std::string path = dir.file("frozen.h5");
  io::save_model(a, path);
  const RpqInputs in;
  // Into a frozen model: refused, nothing changes.
  RpqV1Net b;
  freeze(b);
  const std::vector<at::Tensor> b_out = rpq_outputs(b, in);
  EXPECT_NE(error_of([&] { io::load_model(b, path); }).find("layer 'fc': the model's RPQLinear is frozen; load into a freshly built model"),
            std::string::npos);
  expect_same_rpq_outputs(b_out, rpq_outputs(b, in), "frozen model after a refused load");
  // A model without the frozen layer (strict): refused before anything loads.
  struct RpqNoConvNet : torch::nn::Module {
    RpqNoConvNet() {
      fc = register_module("fc", nn::RPQLinear(24, 8, 2));
      emb = register_module("emb", nn::RPQEmbedding(40, 8, 4));
      conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)));
    }
    nn::RPQLinear fc{nullptr};
    nn::RPQEmbedding emb{nullptr};
    torch::nn::Conv2d conv{nullptr};
  } n;
  const at::Tensor fc_codebooks = n.fc->codebooks().detach().clone();
  EXPECT_NE(error_of([&] { io::load_model(n, path); })
                .find("layer 'conv' is a frozen RPQ layer; the model has no RPQ layer there (strict load)"),
            std::string::npos);
  EXPECT_TRUE(same_tensor(n.fc->codebooks(), fc_codebooks));
  EXPECT_FALSE(n.fc->frozen());
  // NaN codebooks in the file: refused by name, the fresh model neither loaded nor frozen.
  a.emb->codebooks().view({-1})[5] = std::nanf("");
  const std::string bad = dir.file("nan.h5");
  io::save_model(a, bad);
  RpqV1Net c;
  const std::vector<at::Tensor> c_out = rpq_outputs(c, in);
  EXPECT_NE(error_of([&] { io::load_model(c, bad); }).find("/parameters/emb/codebooks' holds 1 NaN/inf values"),
            std::string::npos);
  EXPECT_FALSE(c.fc->frozen() || c.emb->frozen() || c.conv->frozen());
  expect_same_rpq_outputs(c_out, rpq_outputs(c, in), "fresh model after a refused load");
}

TEST(RPQFrozen, TrainingFunctionsRefuseAFrozenLayer) {
  at::manual_seed(12);
  RpqV1Net m;
  freeze(m);
  const at::Tensor codebooks = m.fc->codebooks().clone();
  const at::Tensor w = at::randn({8, 24}), b = at::randn({8});
  EXPECT_NE(error_of([&] { nn::rpq_load_from_float(*m.fc, w, b); })
                .find("RPQLinear: rpq_load_from_float on a frozen layer (its codebooks are packed and fixed"),
            std::string::npos);
  EXPECT_NE(error_of([&] { nn::rpq_refine_codebooks(*m.fc, w, at::randn({16, 24})); })
                .find("RPQLinear: rpq_refine_codebooks on a frozen layer"),
            std::string::npos);
  EXPECT_TRUE(same_tensor(m.fc->codebooks(), codebooks));
}

// A layer the load freezes is frozen with the file's codebooks, indices and bias, never its own.
TEST(RPQFrozen, LoadsFreezeOnlyWithTheFilesTensors) {
  at::manual_seed(14);
  RpqV1Net a;
  freeze(a);
  const RpqInputs in;
  const std::vector<at::Tensor> want = rpq_outputs(a, in);
  TempDir dir;
  const std::string path = dir.file("frozen.h5");
  io::save_model(a, path);
  // parameters_only still loads the indices buffer: it is the frozen layer's weight.
  at::manual_seed(15);
  RpqV1Net b;
  io::LoadModelOptions po;
  po.parameters_only = true;
  EXPECT_EQ(io::load_model(b, path, po).frozen_layers, (std::vector<std::string>{"fc", "emb", "conv"}));
  EXPECT_TRUE(same_tensor(b.emb->indices(), a.emb->indices()));
  expect_same_rpq_outputs(want, rpq_outputs(b, in), "parameters_only load");
  // A file lacking a frozen layer's indices: refused by name, strict or not, the model untouched.
  io::model_file::ModelFileData f = io::model_file::collect(a, io::SaveOptions{});
  f.data.buffers.erase("emb.indices");
  const std::string lacking = dir.file("no_indices.h5");
  io::model_file::write_model_file(lacking, f);
  RpqV1Net c;
  const std::vector<at::Tensor> c_out = rpq_outputs(c, in);
  for (const bool strict : {true, false}) {
    io::LoadModelOptions o;
    o.strict = strict;
    EXPECT_NE(error_of([&] { io::load_model(c, lacking, o); })
                  .find("layer 'emb' was saved frozen, and the file has no buffer 'emb.indices'"),
              std::string::npos)
        << "strict " << strict;
  }
  EXPECT_FALSE(c.fc->frozen() || c.emb->frozen() || c.conv->frozen());
  expect_same_rpq_outputs(c_out, rpq_outputs(c, in), "fresh model after a refused load");
  // A path listed twice in frozen_rpq_layers is frozen (and reported) once.
  io::model_file::ModelFileData twice = io::model_file::collect(a, io::SaveOptions{});
  twice.meta.frozen_rpq.push_back("fc");
  io::model_file::write_model_file(dir.file("twice.h5"), twice);
  RpqV1Net d;
  EXPECT_EQ(io::load_model(d, dir.file("twice.h5")).frozen_layers, (std::vector<std::string>{"fc", "emb", "conv"}));
  expect_same_rpq_outputs(want, rpq_outputs(d, in), "frozen_rpq_layers listing a path twice");
}

// tests/fixtures/rpq_v1.h5: an unfrozen RpqV1Net (at::manual_seed(31), step 5) written by qforge
// before RPQ layers had a frozen form. QFORGE_WRITE_RPQ_FIXTURE=<path> writes the same model with
// this build (the committed file came from the build before; never regenerate it).
TEST(RPQFrozen, UnfrozenFixtureLoadsAndFreezesToTheSameBits) {
  const char* out = std::getenv("QFORGE_WRITE_RPQ_FIXTURE");
  if (out && *out) {
    at::manual_seed(31);
    RpqV1Net m;
    io::save_model(m, out, io::SaveOptions{nullptr, 5, "fixture: rpq_v1 (unfrozen RPQ layers)"});
    GTEST_SKIP() << "wrote " << out;
  }
  const std::string fixture = std::string(QFORGE_FIXTURES_DIR) + "/rpq_v1.h5";
  RpqV1Net m;
  const io::LoadReport rep = io::load_model(m, fixture);
  EXPECT_EQ(rep.step, 5);
  EXPECT_TRUE(rep.frozen_layers.empty());
  EXPECT_FALSE(m.fc->frozen());
  const io::CheckpointReader r(fixture);
  EXPECT_TRUE(same_tensor(m.fc->codebooks(), r.read_tensor("fc.codebooks", io::Section::kParameters)));
  EXPECT_TRUE(same_tensor(m.emb->indices(), r.read_tensor("emb.indices", io::Section::kBuffers)));
  EXPECT_TRUE(same_tensor(m.conv->bias(), r.read_tensor("conv.bias", io::Section::kParameters)));
  at::manual_seed(0);
  const RpqInputs in;
  const std::vector<at::Tensor> before = rpq_outputs(m, in);
  freeze(m);
  expect_same_rpq_outputs(before, rpq_outputs(m, in), "fixture frozen");
  // Frozen and saved, the file holds the fixture's datasets plus the frozen marker.
  TempDir dir;
  io::save_model(m, dir.file("frozen.h5"), io::SaveOptions{nullptr, 5, "fixture: rpq_v1 (unfrozen RPQ layers)"});
  const io::CheckpointReader f(dir.file("frozen.h5"));
  ASSERT_EQ(f.entries().size(), r.entries().size());
  for (const io::EntryInfo& e : r.entries())
    EXPECT_TRUE(same_tensor(r.read_tensor(e.key, e.section), f.read_tensor(e.key, e.section))) << e.key;
}
