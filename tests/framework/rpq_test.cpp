// RPQ layers and k-means: each layer computes its torch::nn twin on the expanded weight (forward
// and gradients, the codebooks' gradient being the twin's weight gradient summed per picked
// sub-vector), divisibility errors, conversion error falling as codebooks are added, k-means
// against brute force, checkpoint round trip into a fresh model, model_size counting exactly.
#include <gtest/gtest.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "framework/io/model_io.h"
#include "framework/format/safetensors.h"
#include "framework/api/kmeans.h"
#include "framework/nn/rpq.h"
#include "framework/api/quantize.h"
#include "tests/error_of.h"

using namespace qforge;
using qforge::testing::error_of;

namespace {

// Expected codebook gradient from the twin's weight gradient: sum over the columns that pick each
// sub-vector.
at::Tensor codebook_grad_from_weight_grad(const nn::RPQLayer& l, const at::Tensor& gw) {
  const at::Tensor g = l.split_of(gw).reshape({l.num_codebooks(), l.codebook_dim(), -1});  // [H, D, C]
  at::Tensor out = at::zeros(l.codebooks().sizes());
  for (int64_t h = 0; h < l.num_codebooks(); ++h)
    out[h].index_add_(0, l.indices()[h].to(at::kLong), g[h].t());
  return out;
}

void expect_close(const at::Tensor& a, const at::Tensor& b, const std::string& what, double rtol = 1e-5, double atol = 1e-5) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  EXPECT_TRUE(at::allclose(a, b, rtol, atol)) << what << ": max |diff| = " << (a - b).abs().max().item<double>();
}

// Runs `rpq(x)` and `twin(x, w)` with w the layer's expanded weight detached into a leaf; checks
// outputs, input gradients, the codebook gradient and the bias gradient.
void check_against_twin(nn::RPQLayer& layer, torch::nn::Module& module, const std::vector<at::Tensor>& inputs,
                        const std::function<at::Tensor(const std::vector<at::Tensor>&)>& rpq,
                        const std::function<at::Tensor(const std::vector<at::Tensor>&, const at::Tensor&, const at::Tensor&)>& twin,
                        const std::string& what, double rtol = 1e-5) {
  std::vector<at::Tensor> xa, xb;
  for (const auto& x : inputs) {
    const bool fl = at::isFloatingType(x.scalar_type());
    xa.push_back(fl ? x.clone().requires_grad_(true) : x);
    xb.push_back(fl ? x.clone().requires_grad_(true) : x);
  }
  module.zero_grad();
  const at::Tensor ya = rpq(xa);
  const at::Tensor w = layer.weight().detach().requires_grad_(true);
  at::Tensor bias;
  for (const auto& p : module.named_parameters(false))
    if (p.key() == "bias") bias = p.value().detach().clone().requires_grad_(true);
  const at::Tensor yb = twin(xb, w, bias);
  expect_close(ya, yb, what + " forward", rtol);
  const at::Tensor g = at::randn(ya.sizes());
  (ya * g).sum().backward();
  (yb * g).sum().backward();
  for (size_t i = 0; i < xa.size(); ++i)
    if (xa[i].requires_grad()) expect_close(xa[i].grad(), xb[i].grad(), what + " input grad", rtol);
  expect_close(layer.codebooks().grad(), codebook_grad_from_weight_grad(layer, w.grad()), what + " codebook grad", 1e-4, 1e-4);
  if (bias.defined())
    for (const auto& p : module.named_parameters(false))
      if (p.key() == "bias") expect_close(p.value().grad(), bias.grad(), what + " bias grad", rtol);
}

}  // namespace

TEST(KMeans, MatchesBruteForceOnTinyData) {
  at::manual_seed(0);
  // Ten 2-D points, k = 2: every 2-partition enumerated, its SSE about the two means.
  const at::Tensor p = at::cat({at::randn({5, 2}) * 0.3, at::randn({5, 2}) * 0.3 + 2.0});
  double best = 1e300;
  for (int mask = 1; mask < (1 << 10) - 1; ++mask) {
    double sse = 0;
    for (int side = 0; side < 2; ++side) {
      std::vector<int64_t> ids;
      for (int i = 0; i < 10; ++i)
        if (((mask >> i) & 1) == side) ids.push_back(i);
      const at::Tensor pts = p.index_select(0, at::tensor(ids, at::kLong)).to(at::kDouble);
      sse += (pts - pts.mean(0)).pow(2).sum().item<double>();
    }
    best = std::min(best, sse);
  }
  const KMeansResult r = kmeans(p, 2);
  EXPECT_NEAR(r.sse, best, 1e-6 * best);
  // A Lloyd fixed point: nearest centroid for every point, each centroid the mean of its points.
  const at::Tensor q = at::randn({200, 3});
  const KMeansResult f = kmeans(q, 7, {100, 3});
  EXPECT_TRUE(at::equal(nearest_centroid(q, f.centroids), f.assignment));
  for (int64_t c = 0; c < 7; ++c) {
    const at::Tensor mine = q.index_select(0, at::nonzero(f.assignment == c).flatten());
    ASSERT_GT(mine.size(0), 0);
    expect_close(f.centroids[c], mine.mean(0), "centroid " + std::to_string(c));
  }
  // Deterministic for a seed; N <= k is exact.
  EXPECT_TRUE(at::equal(kmeans(q, 7, {100, 3}).centroids, f.centroids));
  EXPECT_EQ(kmeans(q.narrow(0, 0, 5), 8).sse, 0.0);
  EXPECT_NE(error_of([] { kmeans(at::full({3, 2}, NAN), 2); }).find("NaN"), std::string::npos);
  EXPECT_NE(error_of([] { kmeans(at::empty({0, 2}), 2); }).find("non-empty"), std::string::npos);
}

TEST(RPQ, LinearMatchesTwinOnExpandedWeightThroughLutAndExpandPaths) {
  at::manual_seed(0);
  nn::RPQLinear l(300, 48, 4);
  EXPECT_EQ(l->kernel(1), "rpq_lut");
  EXPECT_EQ(l->kernel(64), "rpq_expand+at::linear");
  for (int64_t rows : {1, 3, 16, 40}) {
    check_against_twin(*l, *l, {at::randn({rows, 300})}, [&](const auto& x) { return l->forward(x[0]); },
                       [](const auto& x, const at::Tensor& w, const at::Tensor& b) { return at::linear(x[0], w, b); },
                       "RPQLinear rows=" + std::to_string(rows));
  }
  // Leading dimensions are kept.
  EXPECT_EQ(l->forward(at::randn({2, 3, 300})).sizes(), at::IntArrayRef({2, 3, 48}));
  // The expanded weight has the twin's initial range: |w| <= 1/sqrt(in).
  EXPECT_LE(l->weight().abs().max().item<double>(), 1.0 / std::sqrt(300.0));
}

TEST(RPQ, EmbeddingGathersRowsAsTheTwinTableDoes) {
  at::manual_seed(0);
  nn::RPQEmbedding e(torch::nn::EmbeddingOptions(50, 24).padding_idx(0), 3);
  const at::Tensor ids = at::randint(50, {4, 7}, at::kLong);
  ids[0][0] = 0;
  check_against_twin(*e, *e, {ids}, [&](const auto& x) { return e->forward(x[0]); },
                     [](const auto& x, const at::Tensor& w, const at::Tensor&) {
                       return at::embedding(w, x[0], /*padding_idx=*/0);
                     },
                     "RPQEmbedding");
  EXPECT_NE(error_of([&] { e->forward(at::full({1}, 50, at::kLong)); }).find("out of range"), std::string::npos);
}

TEST(RPQ, ConvolutionsAndBilinearMatchTheirTwins) {
  at::manual_seed(0);
  {
    nn::RPQConv1d c(torch::nn::Conv1dOptions(4, 6, 3).padding(1).stride(2), 3);
    check_against_twin(*c, *c, {at::randn({2, 4, 11})}, [&](const auto& x) { return c->forward(x[0]); },
                       [](const auto& x, const at::Tensor& w, const at::Tensor& b) { return at::conv1d(x[0], w, b, 2, 1); },
                       "RPQConv1d");
  }
  {
    nn::RPQConv2d c(torch::nn::Conv2dOptions(4, 8, 3).padding(1).groups(2), 4);
    check_against_twin(*c, *c, {at::randn({2, 4, 6, 6})}, [&](const auto& x) { return c->forward(x[0]); },
                       [](const auto& x, const at::Tensor& w, const at::Tensor& b) { return at::conv2d(x[0], w, b, 1, 1, 1, 2); },
                       "RPQConv2d");
  }
  {
    nn::RPQConv3d c(torch::nn::Conv3dOptions(2, 4, 2).bias(false), 2);
    check_against_twin(*c, *c, {at::randn({1, 2, 4, 4, 4})}, [&](const auto& x) { return c->forward(x[0]); },
                       [](const auto& x, const at::Tensor& w, const at::Tensor& b) { return at::conv3d(x[0], w, b); },
                       "RPQConv3d");
  }
  {
    nn::RPQConvTranspose1d c(torch::nn::ConvTranspose1dOptions(4, 6, 3).stride(2).output_padding(1), 3);
    check_against_twin(*c, *c, {at::randn({2, 4, 5})}, [&](const auto& x) { return c->forward(x[0]); },
                       [](const auto& x, const at::Tensor& w, const at::Tensor& b) {
                         return at::conv_transpose1d(x[0], w, b, 2, 0, 1);
                       },
                       "RPQConvTranspose1d");
  }
  {
    nn::RPQConvTranspose2d c(torch::nn::ConvTranspose2dOptions(4, 8, 3).groups(2).padding(1), 2);
    check_against_twin(*c, *c, {at::randn({2, 4, 5, 5})}, [&](const auto& x) { return c->forward(x[0]); },
                       [](const auto& x, const at::Tensor& w, const at::Tensor& b) {
                         return at::conv_transpose2d(x[0], w, b, 1, 1, 0, 2);
                       },
                       "RPQConvTranspose2d");
  }
  {
    nn::RPQConvTranspose3d c(torch::nn::ConvTranspose3dOptions(2, 4, 2), 4);
    check_against_twin(*c, *c, {at::randn({1, 2, 3, 3, 3})}, [&](const auto& x) { return c->forward(x[0]); },
                       [](const auto& x, const at::Tensor& w, const at::Tensor& b) { return at::conv_transpose3d(x[0], w, b); },
                       "RPQConvTranspose3d");
  }
  {
    nn::RPQBilinear b(torch::nn::BilinearOptions(5, 7, 6), 3);
    check_against_twin(*b, *b, {at::randn({4, 5}), at::randn({4, 7})}, [&](const auto& x) { return b->forward(x[0], x[1]); },
                       [](const auto& x, const at::Tensor& w, const at::Tensor& bias) { return at::bilinear(x[0], x[1], w, bias); },
                       "RPQBilinear");
  }
}

TEST(RPQ, SplitDimensionsNotDivisibleByTheCodebooksAreErrors) {
  std::string e = error_of([] { nn::RPQLinear(10, 30, 4); });
  EXPECT_NE(e.find("out_features = 30 is not divisible by num_codebooks = 4"), std::string::npos) << e;
  e = error_of([] { nn::RPQEmbedding(10, 30, 4); });
  EXPECT_NE(e.find("embedding_dim = 30"), std::string::npos) << e;
  e = error_of([] { nn::RPQConvTranspose2d(torch::nn::ConvTranspose2dOptions(4, 8, 3).groups(2), 3); });
  EXPECT_NE(e.find("out_channels / groups = 4"), std::string::npos) << e;
  e = error_of([] { nn::RPQConv2d(torch::nn::Conv2dOptions(4, 6, 3), 0); });
  EXPECT_NE(e.find("at least 1"), std::string::npos) << e;
  nn::RPQLinear l(8, 4, 2);
  e = error_of([&] { l->forward(at::randn({2, 9})); });
  EXPECT_NE(e.find("expected 8"), std::string::npos) << e;
}

TEST(RPQ, ConversionErrorFallsAsCodebooksAreAdded) {
  at::manual_seed(0);
  torch::nn::Linear dense(512, 64);
  double last = 1.0;
  for (int64_t H : {1, 2, 4, 8, 16, 32}) {
    nn::RPQLinear l(512, 64, H);
    double err = -1;
    nn::rpq_load_from_float(*l, dense->weight, dense->bias, {}, &err);
    std::printf("RPQLinear 64x512, %2lld codebooks: relative error %.4f\n", static_cast<long long>(H), err);
    EXPECT_LT(err, last) << H << " codebooks";
    last = err;
    // The layer computes with the reconstruction it reports.
    const double measured = (l->weight() - dense->weight).pow(2).sum().item<double>() / dense->weight.pow(2).sum().item<double>();
    EXPECT_NEAR(measured, err, 1e-6);
    EXPECT_TRUE(at::equal(l->bias(), dense->bias));
  }
  // With at most 256 columns every sub-vector is its own codebook entry: exact.
  nn::RPQLinear small(200, 16, 4);
  torch::nn::Linear d2(200, 16);
  double err = -1;
  nn::rpq_load_from_float(*small, d2->weight, d2->bias, {}, &err);
  EXPECT_EQ(err, 0.0);
  EXPECT_TRUE(at::equal(small->weight(), d2->weight));
}

TEST(RPQ, CalibrationRefinementLowersTheOutputError) {
  at::manual_seed(0);
  torch::nn::Linear dense(512, 32);
  nn::RPQLinear l(512, 32, 4);
  nn::rpq_load_from_float(*l, dense->weight, dense->bias);
  // With X = I the least-squares codebooks are the means of each code's sub-vectors.
  {
    nn::RPQLinear m(512, 32, 4);
    m->set_rpq_state(l->codebooks(), l->indices(), dense->bias);
    const nn::RPQRefineReport r = nn::rpq_refine_codebooks(*m, dense->weight, at::eye(512), 1e-12);
    EXPECT_LE(r.output_error_after, r.output_error_before + 1e-9);
    const at::Tensor split = dense->weight.detach().reshape({4, 8, 512});  // [h, d, c]
    for (int64_t h = 0; h < 4; ++h) {
      const at::Tensor idx = m->indices()[h].to(at::kLong);
      for (int64_t k : {0, 17, 255}) {
        const at::Tensor cols = at::nonzero(idx == k).flatten();
        if (cols.numel() == 0) continue;
        expect_close(m->codebooks()[h][k], split[h].index_select(1, cols).mean(1), "mean of code " + std::to_string(k), 1e-4, 1e-5);
      }
    }
  }
  // Correlated inputs with uneven scales: the output error on them falls.
  const at::Tensor x = at::randn({2048, 512}).matmul(at::randn({512, 512}) * 0.1 + at::eye(512)) * at::linspace(0.1, 3.0, 512);
  const nn::RPQRefineReport r = nn::rpq_refine_codebooks(*l, dense->weight, x);
  std::printf("RPQLinear 32x512, 4 codebooks: output error on calibration inputs %.4f -> %.4f\n", r.output_error_before,
              r.output_error_after);
  EXPECT_LT(r.output_error_after, 0.8 * r.output_error_before);
  const at::Tensor y_ref = at::linear(x, dense->weight, dense->bias);
  const double measured = (l->forward(x) - y_ref).pow(2).sum().item<double>() / (y_ref - dense->bias).pow(2).sum().item<double>();
  EXPECT_NEAR(measured, r.output_error_after, 1e-3);
  EXPECT_NE(error_of([&] { nn::rpq_refine_codebooks(*l, dense->weight, at::randn({4, 100})); }).find("[N, 512]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { nn::rpq_refine_codebooks(*l, dense->weight, x, 0.0); }).find("positive"), std::string::npos);
  EXPECT_NE(error_of([&] { nn::rpq_refine_codebooks(*l, dense->weight, at::zeros({8, 512})); }).find("zero"),
            std::string::npos);
  // A float layer without bias does not fill an RPQ layer with one (its random bias would stay).
  torch::nn::Linear nobias(torch::nn::LinearOptions(512, 32).bias(false));
  EXPECT_NE(error_of([&] { nn::rpq_load_from_float(*l, nobias->weight, at::Tensor()); }).find("has no bias"),
            std::string::npos);
}

namespace {
struct RpqNet : torch::nn::Module {
  RpqNet() {
    emb = register_module("emb", nn::RPQEmbedding(40, 16, 4));
    fc = register_module("fc", nn::RPQLinear(16, 12, 3));
    conv = register_module("conv", nn::RPQConv2d(torch::nn::Conv2dOptions(1, 4, 3), 2));
  }
  nn::RPQEmbedding emb{nullptr};
  nn::RPQLinear fc{nullptr};
  nn::RPQConv2d conv{nullptr};
};
}  // namespace

TEST(RPQ, CheckpointRoundTripIntoAFreshModelAndModelSizeCountsExactly) {
  at::manual_seed(0);
  RpqNet a;
  const at::Tensor ids = at::randint(40, {3, 5}, at::kLong);
  const at::Tensor img = at::randn({2, 1, 6, 6});
  const std::string path = (std::filesystem::temp_directory_path() / ("qforge_rpq_" + std::to_string(::getpid()) + ".h5")).string();
  io::save_model(a, path);
  at::manual_seed(1);
  RpqNet b;
  EXPECT_FALSE(at::equal(a.fc->forward(a.emb->forward(ids)), b.fc->forward(b.emb->forward(ids))));
  io::load_model(b, path);
  EXPECT_TRUE(at::equal(a.fc->forward(a.emb->forward(ids)), b.fc->forward(b.emb->forward(ids))));
  EXPECT_TRUE(at::equal(a.conv->forward(img), b.conv->forward(img)));
  EXPECT_TRUE(at::equal(a.emb->indices(), b.emb->indices()));
  std::filesystem::remove(path);
  // safetensors: the tensors as they are, and how to expand them in the metadata.
  const std::string st = path + ".safetensors";
  io::export_safetensors(a, st);
  const io::SafetensorsFile f = io::read_safetensors(st);
  EXPECT_TRUE(at::equal(f.tensors.at("fc.codebooks"), a.fc->codebooks()));
  EXPECT_TRUE(at::equal(f.tensors.at("fc.indices"), a.fc->indices()));
  const nlohmann::json meta = nlohmann::json::parse(f.metadata.at("qforge.rpq"));
  EXPECT_EQ(meta["fc"]["num_codebooks"], 3);
  EXPECT_EQ(meta["conv"]["weight_shape"], nlohmann::json::array({4, 1, 3, 3}));
  EXPECT_EQ(meta["emb"]["layer_type"], "RPQEmbedding");
  std::filesystem::remove(st);

  const ModelSize s = model_size(a);
  // emb: 4 x 256 x 4 floats + 4 x 40 bytes; fc: 3 x 256 x 4 floats + 3 x 16 bytes + 12 bias floats;
  // conv: 2 x 256 x 2 floats + 2 x 9 bytes + 4 bias floats.
  const int64_t want = (4 * 256 * 4 * 4 + 4 * 40) + (3 * 256 * 4 * 4 + 3 * 16 + 12 * 4) + (2 * 256 * 2 * 4 + 2 * 9 + 4 * 4);
  EXPECT_EQ(s.total_bytes, want);
  EXPECT_EQ(s.quantized_bytes, want);
  for (const auto& l : s.layers) EXPECT_EQ(l.kind, "rpq") << l.name;

  // describe() lists each RPQ layer with its format, decode-size kernel and bytes.
  const std::vector<LayerReport> rows = layer_reports(a);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1].name, "fc");
  EXPECT_EQ(rows[1].type, "RPQLinear");
  EXPECT_EQ(rows[1].weights, "rpq 3 codebooks x 256 x 4 (uint8 indices)");
  EXPECT_EQ(rows[1].kernel, "rpq_lut");
  EXPECT_EQ(rows[1].fallback_reason, "");
  EXPECT_EQ(rows[2].kernel, "rpq_expand+dense");
  EXPECT_NE(rows[2].fallback_reason.find("expanded"), std::string::npos);
  EXPECT_EQ(rows[0].kernel, "rpq_gather_rows");
  EXPECT_EQ(rows[1].bytes, 3 * 256 * 4 * 4 + 3 * 16 + 12 * 4);
}
