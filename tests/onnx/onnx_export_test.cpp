// ONNX QDQ export: the exported scales and codes equal the checkpoint's bit for bit, the graph
// passes libonnx's checker inside export_onnx, and unsupported layers, models and states are
// clear errors that leave an existing file untouched. ONNX Runtime and python3-onnx run the
// exported models in onnx_consumers (tests/onnx/onnx_consumers_test.sh).
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <map>

#include "framework/api/kv_cache_scheme.h"
#include "framework/api/kv_static_scales.h"
#include "framework/core/error.h"
#include "framework/io/model_io.h"
#include "framework/nn/matmul.h"
#include "framework/nn/quantizable.h"
#include "framework/onnx/export.h"
#include "framework/onnx/graph.h"
#include "tests/error_of.h"
#include "tests/onnx/onnx_fixtures.h"

namespace fs = std::filesystem;
using namespace qforge;
using onnx_testing::Fixture;
using qforge::testing::error_of;

namespace {

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("qforge_onnx_test_" + std::to_string(::getpid())) / name;
  fs::create_directories(d);
  return d;
}

onnx::ModelProto read_model(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromIstream(&f)) << p;
  return m;
}

std::map<std::string, const onnx::TensorProto*> initializers(const onnx::ModelProto& m) {
  std::map<std::string, const onnx::TensorProto*> out;
  for (const auto& t : m.graph().initializer()) out[t.name()] = &t;
  return out;
}

// Bytes of `t` (contiguous) equal the initializer's raw data, and its shape the initializer's dims.
void expect_same_bytes(const onnx::TensorProto* init, const at::Tensor& t_in, const std::string& what) {
  ASSERT_NE(init, nullptr) << what << " is not an initializer";
  const at::Tensor t = t_in.contiguous();
  ASSERT_EQ(init->dims_size(), t.dim()) << what;
  for (int64_t i = 0; i < t.dim(); ++i) EXPECT_EQ(init->dims(static_cast<int>(i)), t.size(i)) << what;
  ASSERT_EQ(init->raw_data().size(), static_cast<size_t>(t.numel() * t.element_size())) << what;
  EXPECT_EQ(std::memcmp(init->raw_data().data(), t.data_ptr(), init->raw_data().size()), 0) << what << " differs";
}

}  // namespace

// Each model exported from a fresh model that loaded the checkpoint: every weight's scales, zero
// points and codes, and every static activation scale, are the checkpoint's bytes.
TEST(OnnxExport, ScalesAndCodesEqualTheCheckpointBitForBit) {
  const fs::path dir = temp_dir("bits");
  const auto bert_head = [](bool frozen) { return onnx_testing::bert_fixture(frozen, AttentionScales::kPerHead); };
  const std::vector<std::function<Fixture(bool)>> makers{
      onnx_testing::cnn_fixture, onnx_testing::mlp_fixture, [](bool frozen) { return onnx_testing::bert_fixture(frozen); },
      bert_head, onnx_testing::gpt2_fixture};
  for (const auto& make : makers) {
    at::manual_seed(0);
    Fixture f = make(true);
    const std::string ckpt = (dir / (f.name + ".h5")).string();
    io::save_model(*f.model, ckpt);
    at::manual_seed(1);
    Fixture fresh = make(false);
    io::load_model(*fresh.model, ckpt);
    const fs::path path = dir / (f.name + ".onnx");
    const onnx_export::ExportInfo info = onnx_export::export_onnx(*fresh.model, path.string());
    EXPECT_EQ(info.opset, 17);
    EXPECT_GT(info.dequantize_linear, 0) << f.name;
    EXPECT_EQ(info.file_bytes, static_cast<int64_t>(fs::file_size(path)));
    const onnx::ModelProto m = read_model(path);
    EXPECT_EQ(m.opset_import(0).version(), 17);
    const auto inits = initializers(m);
    int weights = 0, activations = 0;
    for (const auto& [name, layer] : quantizable_layers(*fresh.model)) {
      const QuantizedTensor w = layer->frozen_weight();
      if (w.defined()) {
        ++weights;
        expect_same_bytes(inits.at(name + ".weight_scale"), w.scale.to(at::kFloat), name + " scale");
        const bool is_linear = std::string(layer->layer_type()) == "Linear";
        const at::Tensor codes = is_linear ? w.int_values().t().contiguous() : w.int_values();
        expect_same_bytes(inits.at(name + ".weight_codes"), codes, name + " codes");
        expect_same_bytes(inits.at(name + ".weight_zero_point"),
                          w.zero_point.to(w.spec.qtype.is_signed ? at::kChar : at::kByte), name + " zero point");
      }
      const Quantizer q = layer->input_quantizer();
      if (q && q->mode() == ActivationMode::kStatic) {
        ++activations;
        const std::string who = name + (std::string(layer->layer_type()) == "LayerNorm" ? "/output" : "/input");
        ASSERT_TRUE(inits.count(who + "/scale")) << who;
        // One scale, or one per head (per-head attention products: a 1-D per-axis scale).
        expect_same_bytes(inits.at(who + "/scale"), q->qparams().scale.to(at::kFloat), who + " scale");
        // An attention product's second operand too.
        if (const auto* mm = dynamic_cast<const nn::MatMulImpl*>(layer)) {
          ASSERT_TRUE(inits.count(name + "/other/scale")) << name;
          expect_same_bytes(inits.at(name + "/other/scale"), mm->other_quantizer()->qparams().scale.to(at::kFloat),
                            name + " other scale");
        }
      }
    }
    EXPECT_GT(weights, 0) << f.name;
    if (f.name != "gpt2") {
      EXPECT_GT(activations, 0) << f.name;
    }
    // Every layer is listed with how it was written.
    EXPECT_EQ(info.layers.size(), quantizable_layers(*fresh.model).size()) << f.name;
  }
}

TEST(OnnxExport, FloatModelsExportWithoutQdq) {
  const fs::path dir = temp_dir("float");
  at::manual_seed(0);
  Fixture f = onnx_testing::bert_fixture(false);
  const onnx_export::ExportInfo info = onnx_export::export_onnx(*f.model, (dir / "bert.onnx").string());
  EXPECT_EQ(info.quantize_linear, 0);
  EXPECT_EQ(info.dequantize_linear, 0);
  EXPECT_EQ(info.inputs, (std::vector<std::string>{"input_ids", "attention_mask"}));
}

TEST(OnnxExport, LayersWithoutQdqFormAreErrorsNamingTheLayer) {
  at::manual_seed(0);
  {
    Fixture f = onnx_testing::gpt2_fixture(false);
    Scheme s(qint4);  // per-group 4-bit weights
    s.rules.push_back(LayerRule{"transformer.wte", true});
    quantize(*f.model, s);
    const std::string e = error_of([&] { onnx_export::check_exportable(*f.model); });
    EXPECT_NE(e.find("transformer.h.0.attn.c_attn (Linear)"), std::string::npos) << e;
    EXPECT_NE(e.find("INT4"), std::string::npos) << e;
  }
  {
    Fixture f = onnx_testing::mlp_fixture(false);
    Scheme s(qint8);
    s.weight_granularity = Granularity::kPerGroup;
    s.group_size = 16;
    quantize(*f.model, s);
    const std::string e = error_of([&] { onnx_export::check_exportable(*f.model); });
    EXPECT_NE(e.find("fc1 (Linear)"), std::string::npos) << e;
    EXPECT_NE(e.find("per-group"), std::string::npos) << e;
  }
  {
    // Clipped dynamic rows (QuaRot's clip_ratio) have no QDQ form: refused before anything is written.
    Fixture f = onnx_testing::mlp_fixture(false);
    Scheme s(qint8);
    s.activations = ActivationMode::kDynamicPerToken;
    s.activation_clip_ratio = 0.9f;
    quantize(*f.model, s);
    const std::string e = error_of([&] { onnx_export::check_exportable(*f.model); });
    EXPECT_NE(e.find("fc1 (Linear)"), std::string::npos) << e;
    EXPECT_NE(e.find("clip_ratio 0.9 have no QDQ form"), std::string::npos) << e;
  }
  {
    // GPT-2's tied head reads wte's float weight: a quantized wte is refused at the model level.
    Fixture f = onnx_testing::gpt2_fixture(false);
    quantize(*f.model, Scheme(qint8));
    const std::string e = error_of([&] { onnx_export::check_exportable(*f.model); });
    EXPECT_NE(e.find("transformer.wte (Embedding): quantized, but the tied LM head"), std::string::npos) << e;
  }
  {
    // A quantized KV cache with per-token dynamic scales has no QDQ form: the graph would attend to
    // floats. Static int8 scales per head have one, once calibrated; int4 codes do not.
    Fixture f = onnx_testing::gpt2_fixture(false);
    KvCacheScheme kv;
    kv.qtype = qint8;
    ASSERT_EQ(set_kv_cache_scheme(*f.model, kv), 1);
    std::string e = error_of([&] { onnx_export::check_exportable(*f.model); });
    EXPECT_NE(e.find("config.kv_cache: a qint8 symmetric"), std::string::npos) << e;
    EXPECT_NE(e.find("has no QDQ form: dynamic per-token scales"), std::string::npos) << e;
    kv = onnx_testing::static_int8_kv_cache();
    set_kv_cache_scheme(*f.model, kv);
    e = error_of([&] { onnx_export::check_exportable(*f.model); });
    EXPECT_NE(e.find("static scales are not calibrated"), std::string::npos) << e;
    auto calibrated_with = [&](const QType& q) {
      kv.qtype = q;
      set_kv_cache_scheme(*f.model, kv);
      Calibration c(*f.model);
      f.forward(f.inputs);
    };
    calibrated_with(qint4);
    e = error_of([&] { onnx_export::check_exportable(*f.model); });
    EXPECT_NE(e.find("int4 codes have no QuantizeLinear"), std::string::npos) << e;
    calibrated_with(qint8);
    EXPECT_EQ(error_of([&] { onnx_export::check_exportable(*f.model); }), "");
  }
  {
    Fixture f = onnx_testing::mlp_fixture(false);
    Scheme s(qfloat8_e4m3fn);
    quantize(*f.model, s);
    const std::string e = error_of([&] { onnx_export::check_exportable(*f.model); });
    EXPECT_NE(e.find("float8"), std::string::npos) << e;
  }
}

TEST(OnnxExport, UnfrozenAndUnknownModelsAreErrors) {
  const fs::path dir = temp_dir("errors");
  at::manual_seed(0);
  Fixture f = onnx_testing::mlp_fixture(false);
  quantize(*f.model, Scheme(qint8));
  std::string e = error_of([&] { onnx_export::export_onnx(*f.model, (dir / "m.onnx").string()); });
  EXPECT_NE(e.find("not frozen"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir / "m.onnx"));

  struct Custom : torch::nn::Module {
    Custom() { fc = register_module("fc", nn::Linear(4, 4)); }
    nn::Linear fc{nullptr};
  } custom;
  e = error_of([&] { onnx_export::export_onnx(custom, (dir / "c.onnx").string()); });
  EXPECT_NE(e.find("no ONNX graph for model type"), std::string::npos) << e;
  EXPECT_NE(e.find("BertForSequenceClassification"), std::string::npos) << e;
}

TEST(OnnxExport, FailedExportKeepsThePreviousFile) {
  const fs::path dir = temp_dir("keep");
  const fs::path path = dir / "model.onnx";
  { std::ofstream(path) << "previous"; }
  at::manual_seed(0);
  Fixture f = onnx_testing::mlp_fixture(false);
  quantize(*f.model, Scheme(qint8));  // not frozen: the export fails
  EXPECT_THROW(onnx_export::export_onnx(*f.model, path.string()), Error);
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "previous");
  // A write that fails after the temporary file is complete (the target is a directory, so the
  // final rename fails): an error naming the path, the directory untouched, no temporary left.
  const fs::path taken = dir / "taken.onnx";
  fs::create_directories(taken / "inside");
  Fixture h = onnx_testing::mlp_fixture(true);
  EXPECT_THROW(onnx_export::export_onnx(*h.model, taken.string()), Error);
  EXPECT_TRUE(fs::is_directory(taken / "inside"));
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  // A directory that does not exist is an error naming the path.
  Fixture g = onnx_testing::mlp_fixture(true);
  const std::string bad = (dir / "missing" / "model.onnx").string();
  const std::string e = error_of([&] { onnx_export::export_onnx(*g.model, bad); });
  EXPECT_NE(e.find(bad), std::string::npos) << e;
}

// ONNX Runtime fuses QuantizeLinear -> DequantizeLinear -> Conv / MatMul / Gemm (-> QuantizeLinear)
// into integer ops only when Q and DQ are adjacent, Conv / Gemm biases are int32 codes and a Conv
// or 2-D Gemm's output goes straight into a QuantizeLinear. The export writes exactly that: no op
// between a Q and its DQ, the narrow grid's clamp in float before the Q, int32 biases at
// s_x * s_w within half a step of the float bias, and each CNN layer output requantized at its
// consumer's grid (the codes that reach the consumer are unchanged: docs/onnx.md).
TEST(OnnxExport, QdqPatternsOnnxRuntimeFusesNarrowGridInFloatInt32BiasRequantizedOutputs) {
  const fs::path dir = temp_dir("ort_patterns");
  at::manual_seed(0);
  Fixture f = onnx_testing::cnn_fixture(true);
  const fs::path path = dir / "cnn.onnx";
  const onnx_export::ExportInfo info = onnx_export::export_onnx(*f.model, path.string());
  // conv1 -> Relu -> MaxPool -> conv2's grid; conv2 -> ... -> fc1's; fc1 -> Relu -> fc2's.
  EXPECT_EQ(info.requantized_outputs, 3);
  const onnx::ModelProto m = read_model(path);
  const auto inits = initializers(m);
  std::map<std::string, const onnx::NodeProto*> producer;
  std::map<std::string, std::vector<const onnx::NodeProto*>> consumers;
  for (const auto& n : m.graph().node()) {
    for (const auto& o : n.output()) producer[o] = &n;
    for (const auto& i : n.input()) consumers[i].push_back(&n);
  }
  int q = 0, grid_clips = 0;
  for (const auto& n : m.graph().node()) {
    if (n.op_type() == "QuantizeLinear") {
      ++q;
      for (const auto* c : consumers[n.output(0)]) EXPECT_EQ(c->op_type(), "DequantizeLinear") << n.name() << " -> " << c->name();
    }
    if (n.op_type() == "Clip") {
      ++grid_clips;
      ASSERT_TRUE(producer.count(n.input(0)) || n.input(0) == "input") << n.name();
      if (producer.count(n.input(0))) {
        EXPECT_NE(producer[n.input(0)]->op_type(), "QuantizeLinear") << n.name();
      }
    }
    if (n.op_type() == "Conv") {
      ASSERT_EQ(consumers[n.output(0)].size(), 1u) << n.name();
      EXPECT_EQ(consumers[n.output(0)][0]->op_type(), "QuantizeLinear") << n.name();
    }
  }
  EXPECT_EQ(q, info.quantize_linear);
  EXPECT_EQ(grid_clips, 4);  // one narrow [-127, 127] grid per layer input
  // int32 biases: codes * scale within half a scale step of the float bias; scale = s_x * s_w.
  int biases = 0;
  for (const auto& [name, layer] : quantizable_layers(*f.model)) {
    if (!inits.count(name + ".bias_codes")) continue;
    ++biases;
    const auto* codes = inits.at(name + ".bias_codes");
    const auto* scale = inits.at(name + ".bias_scale");
    ASSERT_EQ(codes->data_type(), onnx::TensorProto::INT32) << name;
    const int64_t n = codes->dims(0);
    const at::Tensor c = at::from_blob(const_cast<char*>(codes->raw_data().data()), {n}, at::kInt).to(at::kDouble);
    const at::Tensor s = at::from_blob(const_cast<char*>(scale->raw_data().data()), {n}, at::kFloat).clone();
    const at::Tensor want_s = layer->input_quantizer()->qparams().scale.to(at::kFloat).reshape({}) *
                              layer->frozen_weight().scale.to(at::kFloat);
    EXPECT_TRUE(at::equal(s, want_s.expand({n}))) << name;
    const at::Tensor b = layer->frozen_bias().to(at::kDouble);
    EXPECT_TRUE(((c * s.to(at::kDouble) - b).abs() <= 0.5 * s.to(at::kDouble) * (1 + 1e-6)).all().item<bool>()) << name;
  }
  EXPECT_EQ(biases, 4);
}

// Dynamic per-token activations: |x| <= amax keeps every code in [-127, 127], so Q -> DQ carry no Clip.
TEST(OnnxExport, DynamicPerTokenQdqHasNoClip) {
  const fs::path dir = temp_dir("ort_dynamic");
  at::manual_seed(0);
  Fixture f = onnx_testing::gpt2_fixture(true);
  const fs::path path = dir / "gpt2.onnx";
  onnx_export::export_onnx(*f.model, path.string());
  const onnx::ModelProto m = read_model(path);
  int clips = 0;
  for (const auto& n : m.graph().node()) clips += n.op_type() == "Clip";
  EXPECT_EQ(clips, 0);
}

// A static int8 KV cache: one QuantizeLinear -> DequantizeLinear pair on each layer's keys and
// values, along the heads axis, with the calibrated scales and zero points of that layer.
TEST(OnnxExport, StaticKvCacheScalesBecomePerHeadQdqPairs) {
  const fs::path dir = temp_dir("static_kv");
  at::manual_seed(0);
  Fixture f = onnx_testing::gpt2_fixture_with_kv(true, onnx_testing::static_int8_kv_cache());
  auto* m = dynamic_cast<models::Gpt2LMHeadModelImpl*>(f.model.get());
  ASSERT_NE(m, nullptr);
  ASSERT_NE(m->config.kv_cache.calibrated, nullptr);
  const fs::path path = dir / "gpt2_kv8.onnx";
  onnx_export::export_onnx(*f.model, path.string());
  const onnx::ModelProto proto = read_model(path);
  std::map<std::string, const onnx::TensorProto*> inits;
  for (const auto& t : proto.graph().initializer()) inits[t.name()] = &t;
  int pairs = 0;
  for (const auto& n : proto.graph().node()) {
    if (n.op_type() != "QuantizeLinear" || n.name().find("_cache/q") == std::string::npos) continue;
    ++pairs;
    ASSERT_EQ(n.attribute_size(), 1);
    EXPECT_EQ(n.attribute(0).name(), "axis");
    EXPECT_EQ(n.attribute(0).i(), 1);
    const onnx::TensorProto* scale = inits.at(n.input(1));
    ASSERT_EQ(scale->dims_size(), 1);
    EXPECT_EQ(scale->dims(0), m->config.n_head);
    const bool values = n.name().find("v_cache") != std::string::npos;
    const int64_t layer = n.name().find("h.1/") != std::string::npos ? 1 : 0;
    const at::Tensor expected = m->config.kv_cache.calibrated->side(layer, values, "test").scale.reshape({-1});
    std::vector<float> got(static_cast<size_t>(scale->dims(0)));
    std::memcpy(got.data(), scale->raw_data().data(), got.size() * 4);
    EXPECT_TRUE(at::equal(at::tensor(got), expected)) << n.name();
  }
  EXPECT_EQ(pairs, 2 * m->config.n_layer) << "keys and values of every layer";
}

// W8A4 (dynamic per-token int4 rows): the graph divides amax by 7, not 127, so ONNX's int8 codes
// stay on [-7, 7] as the fake-quant grid has them.
TEST(OnnxExport, DynamicInt4RowsDivideTheirAmaxBySeven) {
  const fs::path dir = temp_dir("ort_dynamic_int4");
  at::manual_seed(0);
  Fixture f = onnx_testing::gpt2_fixture(false);
  Scheme s(qint8);
  s.activations = ActivationMode::kDynamicPerToken;
  s.activation_qtype = qint4;
  s.rules.push_back(LayerRule{"transformer.wte", true});
  onnx_testing::quantize_and_freeze(f, s, {f.inputs});
  const fs::path path = dir / "gpt2_w8a4.onnx";
  onnx_export::export_onnx(*f.model, path.string());
  const onnx::ModelProto m = read_model(path);
  std::map<std::string, float> scalars;
  for (const auto& t : m.graph().initializer())
    if (t.data_type() == onnx::TensorProto::FLOAT && t.dims_size() == 0 && t.raw_data().size() == 4) {
      float v;
      std::memcpy(&v, t.raw_data().data(), 4);
      scalars[t.name()] = v;
    }
  int by7 = 0, by127 = 0;
  for (const auto& n : m.graph().node()) {
    if (n.op_type() != "Div" || n.input_size() != 2 || !scalars.count(n.input(1))) continue;
    by7 += scalars[n.input(1)] == 7.0f;
    by127 += scalars[n.input(1)] == 127.0f;
  }
  EXPECT_GT(by7, 0);
  EXPECT_EQ(by127, 0);
}

// Graph::requantize_layer_outputs only where the codes provably stay the same: a Linear / Conv
// output reaching a static per-tensor QuantizeLinear through commuting ops, read nowhere else.
TEST(OnnxExport, RequantizationOnlyThroughCommutingOpsToScalarGrids) {
  struct Variant {
    const char* name;
    const char* between;  // op between the Linear and the QuantizeLinear
    bool second_reader, graph_output, vector_scale;
    int64_t want;
  };
  for (const Variant& v : {Variant{"relu", "Relu", false, false, false, 1}, Variant{"sigmoid", "Sigmoid", false, false, false, 0},
                           Variant{"read twice", "Relu", true, false, false, 0}, Variant{"graph output", "Relu", false, true, false, 0},
                           Variant{"per-axis grid", "Relu", false, false, true, 0}}) {
    onnx_export::Graph g("t");
    const std::string x = g.input("x", onnx::TensorProto::FLOAT, {int64_t{2}, int64_t{4}});
    const std::string w = g.initializer("w", at::ones({4, 3}));
    const std::string y = g.node("Add", {g.node("MatMul", {x, w}, "mm"), g.initializer("b", at::zeros({3}))}, "out");
    const std::string a = g.node(v.between, {y}, "act");
    if (v.second_reader) g.output(g.node("Identity", {y}, "other"), onnx::TensorProto::FLOAT, {int64_t{2}, int64_t{3}});
    if (v.graph_output) g.output(a, onnx::TensorProto::FLOAT, {int64_t{2}, int64_t{3}});
    const std::string s = g.initializer("s", v.vector_scale ? at::full({3}, 0.1f) : at::full({}, 0.1f));
    const std::string z = g.initializer("z", v.vector_scale ? at::zeros({3}, at::kChar) : at::zeros({}, at::kChar));
    g.output(g.node("DequantizeLinear", {g.node("QuantizeLinear", {a, s, z}, "q"), s, z}, "dq"), onnx::TensorProto::FLOAT,
             {int64_t{2}, int64_t{3}});
    const int64_t before = g.count("QuantizeLinear");
    EXPECT_EQ(g.requantize_layer_outputs(), v.want) << v.name;
    EXPECT_EQ(g.count("QuantizeLinear"), before + v.want) << v.name;
  }
}
