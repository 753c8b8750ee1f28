// The importance matrix: collection against sums computed here from the layers' inputs; the
// calibration dump keeping it; llama.cpp's GGUF and legacy .dat files (byte layout written out
// here, round trips, truncated and foreign files refused); the GGUF names agreeing with the GGUF
// export; the weighted grid search against a brute force; GPTQ ordered by it.
#include "framework/ptq/imatrix.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "fake_quant/fake_quantize.h"
#include "framework/core/error.h"
#include "framework/api/quantize.h"
#include "framework/api/quantizer.h"
#include "framework/format/imatrix_file.h"
#include "framework/io/calibration_dump.h"
#include "framework/models/gguf_export.h"
#include "framework/models/gguf_imatrix.h"
#include "framework/ptq/gptq.h"
#include "tests/gguf/gguf_models.h"
#include "tests/io/io_test_util.h"
#include "tests/ptq/fixtures.h"

namespace qforge::ptq {
namespace {

using io::testing::TempDir;

std::vector<at::Tensor> token_batches(int64_t n, uint64_t seed) {
  at::manual_seed(seed);
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(at::randint(256, {2, 16}, at::kLong));
  return out;
}

TEST(Imatrix, CollectorSumsTheSquaresOfEveryLinearInput) {
  models::LlamaForCausalLM m = models::tiny_gguf_llama();
  const std::vector<at::Tensor> ids = token_batches(3, 1);
  Imatrix im;
  {
    at::NoGradGuard g;
    ImatrixCollector c(*m);
    for (const at::Tensor& b : ids) m->forward(b);
    im = c.take();
  }
  // q_proj of block 0 reads input_layernorm(embed(ids)); down_proj reads silu(gate(h)) * up(h).
  at::NoGradGuard g;
  auto* blk = m->model->layers->ptr(0)->as<models::LlamaDecoderLayerImpl>();
  at::Tensor q_sq = at::zeros({64}, at::kDouble), q_sum = at::zeros({64}, at::kDouble);
  for (const at::Tensor& b : ids) {
    const at::Tensor x = blk->input_layernorm->forward(m->model->embed_tokens->forward(b)).reshape({-1, 64}).to(at::kDouble);
    q_sq += x.pow(2).sum(0);
    q_sum += x.sum(0);
  }
  const ImatrixEntry& q = im.at("model.layers.0.self_attn.q_proj");
  EXPECT_EQ(q.count, 3 * 2 * 16);
  EXPECT_TRUE(at::allclose(q.sum_sq, q_sq, 1e-6, 1e-9));
  EXPECT_TRUE(at::allclose(q.sum, q_sum, 1e-6, 1e-9));
  // Every Linear of the model, the untied head included (2 blocks × 7 + lm_head).
  EXPECT_EQ(im.size(), 15u);
  EXPECT_EQ(im.at("lm_head").sum_sq.numel(), 64);
  EXPECT_EQ(im.at("model.layers.1.mlp.down_proj").sum_sq.numel(), 128);
}

TEST(Imatrix, NonFiniteInputsAreAnErrorNamingTheLayer) {
  models::LlamaForCausalLM m = models::tiny_gguf_llama();
  {
    at::NoGradGuard g;
    m->model->embed_tokens->weight[5][0] = NAN;
  }
  ImatrixCollector c(*m);
  at::NoGradGuard g;
  m->forward(at::full({1, 4}, 5, at::kLong));
  try {
    c.take();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.self_attn"), std::string::npos) << e.what();
  }
}

Imatrix sample_imatrix() {
  at::manual_seed(3);
  Imatrix im;
  im["model.layers.0.self_attn.q_proj"] = {at::rand({64}, at::kDouble) * 100, at::randn({64}, at::kDouble), 96};
  im["model.layers.1.mlp.down_proj"] = {at::rand({128}, at::kDouble) * 10, at::randn({128}, at::kDouble), 1000};
  im["lm_head"] = {at::rand({64}, at::kDouble), at::Tensor(), 7};
  return im;
}

TEST(Imatrix, CalibrationDumpKeepsItAndDumpsWithoutItHaveNone) {
  TempDir dir;
  const Imatrix im = sample_imatrix();
  io::save_calibration_dump(dir.file("c.h5"), {}, nullptr, nullptr, &im);
  const std::optional<Imatrix> back = io::load_imatrix(dir.file("c.h5"));
  ASSERT_TRUE(back.has_value());
  ASSERT_EQ(back->size(), im.size());
  for (const auto& [path, e] : im) {
    const ImatrixEntry& b = back->at(path);
    EXPECT_TRUE(at::equal(b.sum_sq, e.sum_sq)) << path;
    EXPECT_EQ(b.sum.defined(), e.sum.defined()) << path;
    if (e.sum.defined()) {
      EXPECT_TRUE(at::equal(b.sum, e.sum)) << path;
    }
    EXPECT_EQ(b.count, e.count) << path;
  }
  io::save_calibration_dump(dir.file("none.h5"), {});
  EXPECT_FALSE(io::load_imatrix(dir.file("none.h5")).has_value());
  EXPECT_TRUE(io::load_calibration_dump(dir.file("c.h5")).empty());  // the group is not a module
}

TEST(Imatrix, GgufFileRoundTripsUnderTheGgufExportsTensorNames) {
  TempDir dir;
  const Imatrix im = sample_imatrix();
  std::vector<std::string> skipped;
  const io::ImatrixFile f = models::gguf_imatrix_file(im, "fortunes", 128, &skipped);
  EXPECT_TRUE(skipped.empty());
  io::write_imatrix(dir.file("imatrix.gguf"), f);
  // The container as llama.cpp reads it.
  const io::GgufFile g = io::read_gguf(dir.file("imatrix.gguf"));
  EXPECT_EQ(g.at("general.type").as_string("general.type"), "imatrix");
  EXPECT_EQ(g.at("imatrix.chunk_size").as_uint("imatrix.chunk_size"), 128u);
  EXPECT_EQ(g.at("imatrix.chunk_count").as_uint("imatrix.chunk_count"), 1000u / 128);
  const io::GgufTensor* t = g.tensor("blk.1.ffn_down.weight.in_sum2");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->ne, (std::vector<uint64_t>{128, 1}));
  ASSERT_NE(g.tensor("blk.1.ffn_down.weight.counts"), nullptr);
  EXPECT_EQ(g.tensor("output.weight.in_sum"), nullptr);  // no Σx was collected for it
  const io::ImatrixFile back = io::read_imatrix(dir.file("imatrix.gguf"));
  ASSERT_EQ(back.tensors.size(), 3u);
  EXPECT_EQ(back.datasets, std::vector<std::string>{"fortunes"});
  for (const io::ImatrixTensor& b : back.tensors) {
    const std::string path = b.name == "output.weight"           ? "lm_head"
                             : b.name == "blk.0.attn_q.weight"    ? "model.layers.0.self_attn.q_proj"
                                                                  : "model.layers.1.mlp.down_proj";
    const ImatrixEntry& e = im.at(path);
    EXPECT_EQ(b.count, e.count) << b.name;
    const at::Tensor got = at::tensor(b.sum_sq, at::kDouble);
    EXPECT_TRUE(at::allclose(got, e.sum_sq.to(at::kFloat).to(at::kDouble), 0, 0)) << b.name;  // float32 on disk
  }
}

TEST(Imatrix, GgufNamesAreTheNamesTheGgufExportWrites) {
  for (int arch = 0; arch < 2; ++arch) {
    std::set<std::string> written;
    std::vector<std::string> linears;
    auto collect = [&](torch::nn::Module& m, const io::GgufFile& g) {
      for (const io::GgufTensor& t : g.tensors) written.insert(t.name);
      for (const auto& [path, layer] : quantizable_layers(m))
        if (std::string(layer->layer_type()) == "Linear") linears.push_back(path);
    };
    if (arch == 0) {
      models::LlamaForCausalLM m = models::tiny_gguf_llama();
      quantize(*m, models::w4_g32_scheme());
      freeze(*m);
      collect(*m, models::gguf_of(m));
    } else {
      models::Gpt2LMHeadModel m = models::tiny_gguf_gpt2();
      m->untie_lm_head();
      quantize(*m, models::w4_g32_scheme());
      freeze(*m);
      collect(*m, models::gguf_of(m));
    }
    ASSERT_FALSE(linears.empty());
    for (const std::string& p : linears) {
      const std::string name = models::gguf_weight_name(p);
      EXPECT_TRUE(written.count(name)) << p << " -> '" << name << "'";
    }
  }
  EXPECT_EQ(models::gguf_weight_name("model.layers.x.mlp.up_proj"), "");
  EXPECT_EQ(models::gguf_weight_name("encoder.layer.0.attention.self.query"), "");
}

void put_i32(std::vector<uint8_t>& b, int32_t v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b.insert(b.end(), p, p + 4);
}
void put_f32(std::vector<uint8_t>& b, float v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b.insert(b.end(), p, p + 4);
}

TEST(Imatrix, LegacyDatHasLlamaCppsByteLayoutAndKeepsTheMean) {
  io::ImatrixFile f;
  f.chunk_size = 4;
  f.chunk_count = 2;
  f.datasets = {"fortunes"};
  f.tensors.push_back({"blk.0.ffn_up.weight", {2.0, 6.0}, {}, 6});   // ncall = ceil(6 / 4) = 2
  f.tensors.push_back({"blk.0.attn_q.weight", {1.0, 3.0}, {}, 4});   // sorted first, ncall 1
  std::vector<uint8_t> expect;
  put_i32(expect, 2);
  struct Entry {
    std::string name;
    int32_t ncall;
    std::vector<float> values;  // Σx² / rows · ncall
  };
  const std::vector<Entry> entries = {{"blk.0.attn_q.weight", 1, {0.25f, 0.75f}},
                                      {"blk.0.ffn_up.weight", 2, {2.0f / 6 * 2, 6.0f / 6 * 2}}};
  for (const Entry& e : entries) {
    put_i32(expect, static_cast<int32_t>(e.name.size()));
    expect.insert(expect.end(), e.name.begin(), e.name.end());
    put_i32(expect, e.ncall);
    put_i32(expect, 2);
    for (float v : e.values) put_f32(expect, v);
  }
  put_i32(expect, 2);
  put_i32(expect, 8);
  const std::string ds = "fortunes";
  expect.insert(expect.end(), ds.begin(), ds.end());
  EXPECT_EQ(io::serialize_imatrix_dat(f), expect);
  // Read back as llama.cpp does: Σx² = value · chunk_size over ncall · chunk_size rows.
  const io::ImatrixFile back = io::parse_imatrix_dat(expect, "test");
  ASSERT_EQ(back.tensors.size(), 2u);
  EXPECT_EQ(back.tensors[1].count, 2 * back.chunk_size);  // the legacy layout keeps ncall, not rows
  EXPECT_NEAR(back.tensors[1].sum_sq[1] / back.tensors[1].count, 6.0 / 6, 1e-7);
  EXPECT_NEAR(back.tensors[0].sum_sq[0] / back.tensors[0].count, 1.0 / 4, 1e-7);
  EXPECT_EQ(back.chunk_count, 2);
  EXPECT_EQ(back.datasets, std::vector<std::string>{"fortunes"});
}

TEST(Imatrix, TruncatedForeignAndBadFilesAreErrors) {
  io::ImatrixFile f;
  f.tensors.push_back({"blk.0.attn_q.weight", {1.0, 3.0}, {}, 4});
  const std::vector<uint8_t> good = io::serialize_imatrix_dat(f);
  for (size_t n = 0; n < good.size(); ++n) {
    // Only the optional trailer (chunk count, dataset) may be cut at its field boundaries.
    const bool complete_entries = n == good.size() - 8 || n == good.size() - 4;
    const std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    if (complete_entries) EXPECT_NO_THROW(io::parse_imatrix_dat(cut, "cut")) << n;
    else EXPECT_THROW(io::parse_imatrix_dat(cut, "cut"), Error) << n;
  }
  TempDir dir;
  io::GgufFile model;
  model.metadata.emplace_back("general.architecture", io::GgufValue::str("llama"));
  io::write_gguf(dir.file("model.gguf"), model);
  try {
    io::read_imatrix(dir.file("model.gguf"));
    FAIL() << "a model file was read as an imatrix";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not an imatrix"), std::string::npos) << e.what();
  }
  io::ImatrixFile bad = f;
  bad.tensors[0].count = 0;
  EXPECT_THROW(io::serialize_imatrix_dat(bad), Error);
  bad = f;
  bad.tensors.push_back(f.tensors[0]);
  EXPECT_THROW(io::imatrix_gguf(bad), Error);  // a name twice
}

TEST(Imatrix, WeightedGridSearchPicksEachBlocksBestRatio) {
  const int64_t N = 5, K = 64, g = 16;
  at::manual_seed(4);
  at::Tensor w = at::randn({N, K});
  w.index_put_({2, 40}, 8.0);
  at::Tensor imp = at::rand({K}) * at::rand({K}) * 10;
  imp[40] = 0.01;  // the outlier's input is quiet: clipping it pays
  QSpec spec;
  spec.qtype = qint3;
  spec.granularity = Granularity::kPerGroup;
  spec.group_size = g;
  const at::Tensor ratio = imatrix_search_clip(w, spec, imp);
  auto rtn = [&](const at::Tensor& x) { return fake_quantize(x, weight_minmax_qparams(x, spec, "test")); };
  for (int64_t n = 0; n < N; ++n) {
    // llama.cpp's weights: imp_k · sqrt(σ_n² + w_nk²), σ_n² the row's mean square.
    const double sigma2 = w[n].pow(2).mean().item<double>();
    const at::Tensor a = imp * (w[n].pow(2) + sigma2).sqrt();
    for (int64_t b = 0; b < K / g; ++b) {
      double best = 1e300, best_r = 0;
      for (int i = 0; i < 10; ++i) {
        const double r = 1.0 - i / 20.0;
        const at::Tensor blk = w[n].slice(0, b * g, (b + 1) * g);
        const double lim = blk.abs().max().item<double>() * r;
        const at::Tensor wc = w.clone();
        wc[n].slice(0, b * g, (b + 1) * g).clamp_(-lim, lim);
        const at::Tensor d = (rtn(wc) - w)[n].slice(0, b * g, (b + 1) * g);
        const double e = (d.pow(2) * a.slice(0, b * g, (b + 1) * g)).sum().item<double>();
        if (e < best * (1 - 1e-6)) best = e, best_r = r;
      }
      EXPECT_NEAR(ratio[n][b].item<double>(), best_r, 1e-6) << n << " " << b;
    }
  }
  EXPECT_LT(ratio[2][2].item<double>(), 1.0);  // the outlier's block is clipped
}

// imatrix_round on a small Llama: every searched layer's weighted error does not grow, its weight
// is clamped per (row, group) to the ratio the search picks, its report agrees with a weighted
// error computed here; per-tensor grids, fixed grids and layers the imatrix misses are skipped.
TEST(Imatrix, RoundClampsEachSearchedLayerAndSkipsTheOthersWithTheirReason) {
  models::LlamaForCausalLM m = models::tiny_gguf_llama();
  Scheme s = models::w4_g32_scheme();
  LayerRule per_tensor;
  per_tensor.pattern = "model.layers.0.mlp.up_proj";
  per_tensor.weight_granularity = Granularity::kPerTensor;
  s.rules.push_back(per_tensor);
  quantize(*m, s);
  Imatrix im;
  {
    at::NoGradGuard g;
    ImatrixCollector c(*m);
    for (const at::Tensor& b : token_batches(2, 3)) m->forward(b);
    im = c.take();
  }
  im.erase("lm_head");
  auto* blk1 = m->model->layers->ptr(1)->as<models::LlamaDecoderLayerImpl>();
  const QSpec& o_spec = blk1->self_attn->o_proj->weight_quantizer()->config().spec;
  blk1->self_attn->o_proj->weight_quantizer()->set_qparams(
      weight_minmax_qparams(blk1->self_attn->o_proj->weight.detach(), o_spec, "o_proj"));
  std::map<std::string, at::Tensor> before;
  for (const auto& [path, l] : quantizable_layers(*m))
    if (auto* lin = l->module().as<nn::LinearImpl>()) before[path] = lin->weight.detach().clone();

  const ImatrixRoundReport rep = imatrix_round(*m, im);
  std::map<std::string, std::string> skipped;
  for (const std::string& k : rep.skipped) skipped[k.substr(0, k.find(':'))] = k.substr(k.find(':') + 2);
  EXPECT_EQ(skipped["model.layers.0.mlp.up_proj"], "per-tensor grid");
  EXPECT_EQ(skipped["model.layers.1.self_attn.o_proj"], "weight grid already fixed");
  EXPECT_EQ(skipped["lm_head"], "not in the imatrix (not reached by calibration)");
  EXPECT_EQ(skipped.size(), 3u);
  ASSERT_EQ(rep.layers.size(), 12u);  // 2 blocks × 7 Linear layers, less the two skipped
  std::map<std::string, QuantizableLayer*> layers;
  for (const auto& [path, l] : quantizable_layers(*m)) layers[path] = l;
  int clipped = 0;
  for (const ImatrixRoundLayer& r : rep.layers) {
    SCOPED_TRACE(r.path);
    EXPECT_LE(r.error_after, r.error_before * (1 + 1e-9));
    const at::Tensor w0 = before.at(r.path), imp = im.at(r.path).sum_sq.to(at::kFloat) / im.at(r.path).count;
    const at::Tensor w1 = layers.at(r.path)->module().as<nn::LinearImpl>()->weight.detach();
    const QSpec& spec = layers.at(r.path)->scheme().weights->spec;
    const at::Tensor ratio = imatrix_search_clip(w0, spec, imp);
    EXPECT_NEAR(r.mean_clip, ratio.mean().item<double>(), 1e-6);
    // Each (row, group) of 32 clamped to ±ratio · max|w| of the original block, nothing else moved.
    const int64_t N = w0.size(0), G = w0.size(1) / 32;
    const at::Tensor lim = (w0.reshape({N, G, 32}).abs().amax(-1) * ratio).unsqueeze(-1);
    const at::Tensor want = at::max(at::min(w0.reshape({N, G, 32}), lim), -lim).reshape_as(w0);
    EXPECT_TRUE(at::allclose(w1, want, 0, 1e-6));
    clipped += (ratio < 1).any().item<bool>();
    // The reported error: Σ a · (RTN(w1) − w0)² / Σ a · w0², RTN on w1's own min/max grid,
    // a = imp_k · sqrt(σ_n² + w0_nk²) with σ_n² the row's mean square.
    const at::Tensor q = fake_quantize(w1, weight_minmax_qparams(w1, spec, "test"));
    const at::Tensor a = (imp.unsqueeze(0) * (w0.pow(2) + w0.pow(2).mean(1, true)).sqrt()).to(at::kDouble);
    const double e = ((q - w0).to(at::kDouble).pow(2) * a).sum().item<double>() /
                     (w0.to(at::kDouble).pow(2) * a).sum().item<double>();
    EXPECT_NEAR(r.error_after, e, 1e-6 * e + 1e-12);
  }
  EXPECT_GT(clipped, 0);  // the search clipped somewhere, so the clamp check above is not vacuous
  // Skipped layers keep their weights.
  for (const char* p : {"model.layers.0.mlp.up_proj", "model.layers.1.self_attn.o_proj", "lm_head"})
    EXPECT_TRUE(at::equal(layers.at(p)->module().as<nn::LinearImpl>()->weight.detach(), before.at(p))) << p;
}

TEST(Imatrix, GptqOrderedByTheImatrixEqualsActOrderWhenItIsDiagH) {
  at::manual_seed(5);
  const at::Tensor x = at::randn({256, 32}) * at::linspace(0.1, 3, 32);
  const at::Tensor h = 2 * at::matmul(x.t(), x) / 256.0, w = at::randn({8, 32});
  QSpec spec;
  spec.qtype = qint4;
  spec.granularity = Granularity::kPerChannel;
  GptqOptions act;
  act.act_order = true;
  GptqOptions by_imatrix = act;
  by_imatrix.column_importance = x.pow(2).mean(0);  // ∝ diag H: the same order
  EXPECT_TRUE(at::equal(gptq(w, h, spec, act).weight, gptq(w, h, spec, by_imatrix).weight));
  by_imatrix.column_importance = -x.pow(2).mean(0);  // reversed: another result
  EXPECT_FALSE(at::equal(gptq(w, h, spec, act).weight, gptq(w, h, spec, by_imatrix).weight));
  by_imatrix.column_importance = at::ones({31});
  EXPECT_THROW(gptq(w, h, spec, by_imatrix), Error);
}


// GPTQ searching each grid with the imatrix (clip_importance): the rows carry one large weight on
// an input channel that is nearly silent, so clipping it frees the grid for the channels that
// matter. The searched solve must win on H's output error, report both errors as computed here,
// never return the worse one, agree with the float64 oracle, and refuse what it cannot search.
TEST(Imatrix, GptqSearchesEachGridWithTheImatrixAndKeepsTheBetterSolve) {
  at::manual_seed(9);
  const int64_t N = 16, K = 64;
  // One silent channel in each group of 16, at a different place in each (a search reading the
  // wrong group's importance would not find them).
  const at::Tensor silent = at::tensor({3, 21, 40, 60}, at::kLong);
  const at::Tensor gain = at::ones({K}).index_fill_(0, silent, 0.02);
  const at::Tensor x = at::randn({512, K}) * gain;
  const at::Tensor h = 2 * at::matmul(x.t(), x) / 512.0;
  at::Tensor w = at::randn({N, K}) * 0.1;
  w.index_put_({at::indexing::Slice(), silent}, 1.5);  // a large weight on each silent one
  const at::Tensor imp = x.pow(2).mean(0);
  const auto rel_h = [&](const at::Tensor& wq) {
    const at::Tensor d = (w - wq).to(at::kDouble), h64 = h.to(at::kDouble), w64 = w.to(at::kDouble);
    return (at::matmul(d, h64) * d).sum().item<double>() / (at::matmul(w64, h64) * w64).sum().item<double>();
  };
  for (const bool act_order : {false, true}) {
    SCOPED_TRACE(act_order ? "act_order" : "in order");
    const QSpec spec = testing::int_group_spec(qint3, 16, /*symmetric=*/true);
    GptqOptions plain;
    plain.block_size = 8;  // groups straddle blocks
    plain.act_order = act_order;
    GptqOptions searched = plain;
    searched.clip_importance = imp;
    const GptqResult p = gptq(w, h, spec, plain), r = gptq(w, h, spec, searched);
    EXPECT_FALSE(p.grids_searched);
    EXPECT_EQ(p.error, 0.0);  // not computed without the search
    const double e_plain = rel_h(p.weight);
    EXPECT_NEAR(r.error, rel_h(r.weight), 1e-5 * r.error);
    ASSERT_TRUE(r.grids_searched);
    EXPECT_NEAR(r.error_other, e_plain, 1e-5 * e_plain);  // the min/max candidate is the plain solve itself
    EXPECT_LT(r.error, 0.8 * e_plain) << "searched " << r.error << ", min/max " << e_plain;
    // The searched grids are narrower than the min/max ones where the large weights sit: codes saturate.
    EXPECT_LT(r.qparams.scale.mean().item<double>(), 0.9 * p.qparams.scale.mean().item<double>());
    EXPECT_TRUE(at::allclose(fake_quantize(r.weight, r.qparams), r.weight, 0, 1e-6));
    const GptqResult ref = gptq_reference(w, h, spec, searched);
    EXPECT_TRUE(ref.grids_searched);
    EXPECT_NEAR(ref.error, r.error, 1e-3 * r.error);
    // With importance on the large weights' channels instead, the search keeps them: min/max grids
    // or searched ones, the result is never worse than the plain solve.
    GptqOptions flipped = searched;
    flipped.clip_importance = imp.max() - imp + 1e-3;
    const GptqResult f = gptq(w, h, spec, flipped);
    EXPECT_LE(f.error, e_plain * (1 + 1e-5));
    EXPECT_NEAR(f.grids_searched ? f.error_other : f.error, e_plain, 1e-5 * e_plain);
  }
  QSpec per_tensor;
  per_tensor.qtype = qint4;
  per_tensor.granularity = Granularity::kPerTensor;
  GptqOptions o;
  o.clip_importance = imp;
  EXPECT_THROW(gptq(w, h, per_tensor, o), Error);
  const QSpec g16 = testing::int_group_spec(qint4, 16);
  o.clip_importance = -imp;
  EXPECT_THROW(gptq(w, h, g16, o), Error);
  o.clip_importance = at::ones({K - 1});
  EXPECT_THROW(gptq(w, h, g16, o), Error);
}

// imatrix_round leaves the layers GPTQ rounds (it searches their grids itself), AutoRound rounds
// (it trains its own clipping) and AWQ clipped, naming why.
TEST(Imatrix, RoundLeavesGptqsAutoRoundsAndAwqsLayersSayingWhy) {
  models::LlamaForCausalLM m = models::tiny_gguf_llama();
  quantize(*m, models::w4_g32_scheme());
  Imatrix im;
  {
    at::NoGradGuard g;
    ImatrixCollector c(*m);
    for (const at::Tensor& b : token_batches(2, 3)) m->forward(b);
    im = c.take();
  }
  auto* down = m->model->layers->ptr(0)->as<models::LlamaDecoderLayerImpl>()->mlp->down_proj.get();
  const at::Tensor before = down->weight.detach().clone();
  // The plan: GPTQ for down_proj of block 0, AutoRound for up_proj of block 1; AWQ clipped o_proj of block 0.
  std::vector<LayerSolve> plan(2);
  plan[0].path = "model.layers.0.mlp.down_proj", plan[0].method = "gptq";
  plan[1].path = "model.layers.1.mlp.up_proj", plan[1].method = "autoround";
  const auto leave = imatrix_round_leaves(plan, {"model.layers.0.self_attn.o_proj"});
  ASSERT_EQ(leave.size(), 3u);
  const ImatrixRoundReport rep = imatrix_round(*m, im, leave);
  EXPECT_TRUE(at::equal(down->weight.detach(), before));
  for (const std::string want : {"model.layers.0.mlp.down_proj: GPTQ searches its grids with the imatrix as it rounds",
                                 "model.layers.1.mlp.up_proj: AutoRound trains its own clipping against the float block",
                                 "model.layers.0.self_attn.o_proj: AWQ searched its clipping on the full input "
                                 "covariance already"})
    EXPECT_NE(std::find(rep.skipped.begin(), rep.skipped.end(), want), rep.skipped.end()) << want;
  for (const ImatrixRoundLayer& l : rep.layers) EXPECT_NE(l.path, "model.layers.0.mlp.down_proj");
  // Without the list the search clamps it (so the check above is not vacuous).
  const ImatrixRoundReport all = imatrix_round(*m, im);
  EXPECT_FALSE(at::equal(down->weight.detach(), before));
  EXPECT_EQ(all.layers.size(), rep.layers.size() + 3);
}

}  // namespace
}  // namespace qforge::ptq
