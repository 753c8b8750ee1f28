// Transformer-shaped TorchScript models: a BERT-like encoder scripted and traced in PyTorch
// (scripts/torchscript/make_fixtures.py, TinyEncoder) with nn.Linear, x @ W^T on bare parameters,
// an nn.Embedding and LayerNorms. Its Linear / matmul / embedding calls become qforge layers (the
// attention's activation x activation matmuls qforge MatMuls), the LayerNorms stay float and are listed; the
// quantized logits are compared with the float script's and with PyTorch's own dynamic int8
// quantization of the same model on the same inputs (encoder_data.safetensors).
#include <gtest/gtest.h>

#include <torch/script.h>

#include <string>
#include <vector>

#include "framework/api/quantize.h"
#include "framework/format/safetensors.h"
#include "framework/jit/scripted_model.h"
#include "tests/jit/jit_test_util.h"
#include "tests/paths.h"

using qforge::jit::LayerKind;
using qforge::jit::ScriptedModel;
using qforge::jit_test::fixture;
using qforge::jit_test::relative_error;
using qforge::jit_test::TempDir;

namespace {

const std::vector<std::string> kEncoderLayers{
    "tok",          "blocks.0.q",          "blocks.0.k",   "blocks.0.v",   "blocks.0.matmul_0", "blocks.0.matmul_1",
    "blocks.0.out_weight", "blocks.0.ff1", "blocks.0.ff2", "blocks.1.q",   "blocks.1.k",        "blocks.1.v",
    "blocks.1.matmul_0",   "blocks.1.matmul_1", "blocks.1.out_weight", "blocks.1.ff1", "blocks.1.ff2", "head"};

qforge::io::SafetensorsFile encoder_data() {
  return qforge::io::read_safetensors(std::string(QFORGE_TORCHSCRIPT_FIXTURES) + "/encoder_data.safetensors");
}

double top1_agreement(const at::Tensor& y, const at::Tensor& ref) {
  return y.argmax(1).eq(ref.argmax(1)).to(at::kFloat).mean().item<double>();
}

}  // namespace

TEST(TorchScriptTransformer, LinearMatmulAndEmbeddingBecomeQforgeLayersLayerNormIsListed) {
  for (const char* form : {"encoder_scripted", "encoder_traced"}) {
    SCOPED_TRACE(form);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
    std::vector<std::string> paths;
    for (const auto& l : m->layers()) paths.push_back(l->path());
    EXPECT_EQ(paths, kEncoderLayers);
    EXPECT_EQ(m->layers()[0]->spec().kind, LayerKind::kEmbedding);
    EXPECT_EQ(m->layers()[0]->spec().padding_idx, 0);
    EXPECT_EQ(m->layers()[4]->spec().kind, LayerKind::kMatMul);  // q @ k^T
    EXPECT_EQ(m->layers()[5]->spec().kind, LayerKind::kMatMul);  // att @ v
    EXPECT_EQ(m->layers()[6]->spec().kind, LayerKind::kLinear);  // x @ out_weight.t()
    EXPECT_FALSE(m->layers()[6]->spec().bias);                   // out_bias is added by the graph
    int layer_norms = 0;
    for (const auto& f : m->kept_float())
      if (f.op == "aten::layer_norm" && f.reason.find("kept float by design") == 0) ++layer_norms;
    EXPECT_EQ(layer_norms, 5);
    EXPECT_EQ(m->kept_float().size(), 5u);
    EXPECT_NE(m->describe().find("aten::layer_norm: kept float by design"), std::string::npos) << m->describe();
    // The float forward of the rewritten graph is the script's, bit for bit, on this machine; the
    // logits PyTorch stored on the machine that wrote the fixture differ from it in the last bits
    // only (its GEMM kernels, and so their summation order, follow the CPU).
    const auto data = encoder_data();
    const at::Tensor ids = data.tensors.at("input_ids");
    m->eval();
    torch::NoGradGuard no_grad;
    const at::Tensor y = m->forward(ids);
    EXPECT_TRUE(at::equal(y, qforge::jit_test::original_call(form, {ids}, false).toTensor()));
    EXPECT_LT(relative_error(y, data.tensors.at("float_logits")), 1e-5);
  }
}

// W8 with dynamic per-token int8 activations is the fair peer of PyTorch's dynamic quantization
// (int8 weights, int8 activations computed per call); qforge also quantizes the x @ W^T
// projections (bare parameters, which quantize_dynamic leaves float) and the embedding table.
TEST(TorchScriptTransformer, DynamicInt8CloseToFloatAndToPyTorchsDynamicInt8FrozenSavedLoaded) {
  const auto data = encoder_data();
  const at::Tensor ids = data.tensors.at("input_ids"), ref = data.tensors.at("float_logits");
  const double torch_error = relative_error(data.tensors.at("dynamic_int8_logits"), ref);
  TempDir tmp;
  for (const char* form : {"encoder_scripted", "encoder_traced"}) {
    SCOPED_TRACE(form);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
    m->eval();
    qforge::quantize(*m, qforge::jit_test::dynamic_int8());
    torch::NoGradGuard no_grad;
    const at::Tensor fake = m->forward(ids);
    const double error = relative_error(fake, ref);
    std::printf("%s: dynamic int8 relative error qforge %.4f, torch.ao %.4f; top-1 agreement %.3f\n", form, error,
                torch_error, top1_agreement(fake, ref));
    EXPECT_LT(error, torch_error);  // README: closer to the float logits than quantize_dynamic on this model
    EXPECT_GE(top1_agreement(fake, ref), 0.95);

    qforge::freeze(*m);
    for (const auto& l : m->layers()) {
      EXPECT_TRUE(l->layer().frozen()) << l->path();
      if (l->spec().kind == LayerKind::kLinear) {
        EXPECT_EQ(l->layer().plan().path, qforge::LinearPath::kS8Dynamic) << l->path();
      }
    }
    // The integer kernels against fake-quant: per-token int8 activations round a value the other
    // way where float summation orders differ, and 14 layers carry such flips on (measured 0.0056).
    const at::Tensor frozen = m->forward(ids);
    EXPECT_LE((frozen - fake).abs().max().item<double>(), 1e-2 * ref.abs().max().item<double>());
    EXPECT_LE(relative_error(frozen, ref), 1.5 * torch_error);
    const std::string path = (tmp.path / (std::string(form) + "_int8.pt")).string();
    m->save(path);
    torch::jit::Module plain = torch::jit::load(path);
    plain.eval();
    EXPECT_TRUE(at::equal(plain.forward({ids}).toTensor(), frozen));
    ScriptedModel again = qforge::jit::load_torchscript(path);
    again->eval();
    EXPECT_TRUE(at::equal(again->forward(ids), frozen));
  }
}

// Static W8A8: calibrated on the first half of the inputs, measured on the other half; the
// embedding table weight-only int4 (per-group of 16) by a Scheme rule on its module path.
TEST(TorchScriptTransformer, StaticW8A8CalibratedWithAnInt4EmbeddingTable) {
  const auto data = encoder_data();
  const at::Tensor ids = data.tensors.at("input_ids"), ref = data.tensors.at("float_logits");
  ScriptedModel m = qforge::jit::load_torchscript(fixture("encoder_scripted"));
  m->eval();
  const int64_t float_bytes = qforge::model_size(*m).total_bytes;
  qforge::Scheme scheme = qforge::jit_test::w8a8();
  qforge::LayerRule table;
  table.pattern = "tok";
  table.weights = qforge::qint4;
  table.weight_granularity = qforge::Granularity::kPerGroup;
  table.group_size = 16;
  scheme.rules.push_back(table);
  qforge::quantize(*m, scheme);
  torch::NoGradGuard no_grad;
  {
    qforge::Calibration calibration(*m);
    m->forward(ids.narrow(0, 0, 32));
  }
  qforge::freeze(*m);
  const at::Tensor held_out = ids.narrow(0, 32, 32), y = m->forward(held_out), y_ref = ref.narrow(0, 32, 32);
  const double error = relative_error(y, y_ref);
  std::printf("static W8A8, int4 table: relative error %.4f, top-1 agreement %.3f, %lld -> %lld bytes\n", error,
              top1_agreement(y, y_ref), static_cast<long long>(float_bytes),
              static_cast<long long>(qforge::model_size(*m).total_bytes));
  EXPECT_LE(error, 0.1);
  EXPECT_GE(top1_agreement(y, y_ref), 0.9);
  EXPECT_EQ(m->layers()[0]->layer().frozen_weight().qtype().name, std::string("qint4"));
  EXPECT_LT(qforge::model_size(*m).total_bytes, float_bytes / 2);
}

// The attention's q @ k^T and att @ v (torch.matmul of two activations) are qforge MatMuls: a
// quantizer on each operand, calibrated like any activation, frozen onto the int8 x int8 batched
// kernel (static per-tensor or dynamic per token), saved and loaded with the file; a Scheme rule on
// their module paths keeps them float.
TEST(TorchScriptTransformer, AttentionProductsAreQforgeMatMulsOnTheIntegerKernelSavedAndRuleable) {
  const auto data = encoder_data();
  const at::Tensor ids = data.tensors.at("input_ids"), ref = data.tensors.at("float_logits");
  const at::Tensor calib = ids.narrow(0, 0, 32), held_out = ids.narrow(0, 32, 32), y_ref = ref.narrow(0, 32, 32);
  TempDir tmp;
  // Static W8A8 with and without the products quantized.
  std::vector<double> errors;
  for (const bool products : {true, false}) {
    SCOPED_TRACE(products ? "products quantized" : "products float");
    ScriptedModel m = qforge::jit::load_torchscript(fixture("encoder_scripted"));
    m->eval();
    qforge::Scheme scheme = qforge::jit_test::w8a8();
    if (!products) {
      qforge::LayerRule keep;
      keep.pattern = "*.matmul_*";
      keep.keep_float = true;
      scheme.rules.push_back(keep);
    }
    qforge::quantize(*m, scheme);
    torch::NoGradGuard no_grad;
    {
      qforge::Calibration calibration(*m);
      m->forward(calib);
    }
    const at::Tensor fake = m->forward(held_out);
    qforge::freeze(*m);
    const at::Tensor frozen = m->forward(held_out);
    int matmuls = 0;
    for (const auto& l : m->layers()) {
      if (l->spec().kind != LayerKind::kMatMul) continue;
      ++matmuls;
      EXPECT_EQ(l->layer().quantizers().size(), products ? 2u : 0u) << l->path();
      if (products) {
        EXPECT_TRUE(l->layer().frozen()) << l->path();
        EXPECT_EQ(l->layer().plan().path, qforge::LinearPath::kS8Static) << l->path();
      }
    }
    EXPECT_EQ(matmuls, 4);
    // int32 sums of int8 codes against float sums of the same dequantized codes: rounding only.
    EXPECT_LE((frozen - fake).abs().max().item<double>(), 1e-4 * fake.abs().max().item<double>());
    errors.push_back(relative_error(frozen, y_ref));
    const std::string path = (tmp.path / (products ? "products.pt" : "float_products.pt")).string();
    m->save(path);
    torch::jit::Module plain = torch::jit::load(path);
    plain.eval();
    EXPECT_TRUE(at::equal(plain.forward({held_out}).toTensor(), frozen));
    EXPECT_EQ(qforge::jit::rewritten_layers(plain).size(), kEncoderLayers.size());
    ScriptedModel again = qforge::jit::load_torchscript(path);
    again->eval();
    EXPECT_TRUE(at::equal(again->forward(held_out), frozen));
    EXPECT_EQ(again->layers()[4]->path(), "blocks.0.matmul_0");
    EXPECT_EQ(again->layers()[4]->layer().frozen(), products);
  }
  std::printf("static W8A8 relative error: products int8 %.4f, products float %.4f\n", errors[0], errors[1]);
  EXPECT_LE(errors[0], 0.1);
  EXPECT_NE(errors[0], errors[1]);  // the products' quantization is not a no-op

  // Dynamic per-token int8: one scale per row of q and of att, per column of k^T and of v.
  ScriptedModel m = qforge::jit::load_torchscript(fixture("encoder_traced"));
  m->eval();
  qforge::quantize(*m, qforge::jit_test::dynamic_int8());
  torch::NoGradGuard no_grad;
  const at::Tensor fake = m->forward(held_out);
  qforge::freeze(*m);
  for (const auto& l : m->layers())
    if (l->spec().kind == LayerKind::kMatMul) {
      EXPECT_EQ(l->layer().plan().path, qforge::LinearPath::kS8Dynamic) << l->path();
    }
  EXPECT_LE((m->forward(held_out) - fake).abs().max().item<double>(), 1e-2 * ref.abs().max().item<double>());
}

// A tied token table (scripts/torchscript/make_fixtures.py, TiedLm): the embedding, an nn.Linear
// head whose weight *is* the table, and F.linear on the table with a bias. One qforge layer holds
// the table: quantized once, run by all three calls, saved once.
TEST(TorchScriptTied, OneTableQuantizedOnceRunTwiceSavedOnce) {
  TempDir tmp;
  for (const char* form : {"tied_lm_scripted", "tied_lm_traced"}) {
    SCOPED_TRACE(form);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
    std::vector<std::string> paths;
    for (const auto& l : m->layers()) paths.push_back(l->path());
    EXPECT_EQ(paths, (std::vector<std::string>{"tok", "mix"}));
    ASSERT_EQ(m->tied().size(), 2u);
    for (const auto& t : m->tied()) EXPECT_EQ(t.layer, "tok");
    ASSERT_EQ(m->kept_float().size(), 1u);  // the LayerNorm
    EXPECT_NE(m->describe().find("aten::linear runs the qforge layer tok"), std::string::npos) << m->describe();
    m->eval();
    torch::jit::Module original = torch::jit::load(fixture(form));
    original.eval();
    torch::NoGradGuard no_grad;
    const at::Tensor ids = at::randint(0, 48, {4, 8}, at::kLong);
    EXPECT_TRUE(at::equal(m->forward(ids), original.forward({ids}).toTensor()));

    qforge::Scheme scheme(qforge::qint8);  // int8 per-row table, float activations
    qforge::LayerRule keep;
    keep.pattern = "mix";
    keep.keep_float = true;
    scheme.rules.push_back(keep);
    qforge::quantize(*m, scheme);
    qforge::freeze(*m);
    ASSERT_TRUE(m->layers()[0]->layer().frozen());
    const at::Tensor frozen = m->forward(ids);
    // The reference: the float script with its one table replaced by the frozen table's values.
    original.attr("tok").toModule().attr("weight").toTensor().copy_(m->layers()[0]->layer().frozen_weight().dequantize());
    const at::Tensor ref = original.forward({ids}).toTensor();
    EXPECT_LE((frozen - ref).abs().max().item<double>(), 1e-6 * ref.abs().max().item<double>());

    const std::string path = (tmp.path / (std::string(form) + "_int8.pt")).string();
    m->save(path);
    torch::jit::Module plain = torch::jit::load(path);
    plain.eval();
    EXPECT_TRUE(at::equal(plain.forward({ids}).toTensor(), frozen));
    // Saved once: no float copy of the table under either name, one qforge layer holding it.
    EXPECT_EQ(plain.attr("tok").toModule().attr("weight").toTensor().numel(), 0);
    EXPECT_EQ(plain.attr("lm_head").toModule().attr("weight").toTensor().numel(), 0);
    EXPECT_EQ(qforge::jit::rewritten_layers(plain).size(), 2u);  // tok (frozen) and mix (float)
  }
}
