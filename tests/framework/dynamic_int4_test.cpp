// Dynamic per-token activations below 8 bits (W4A4: qint4 rows on [-7, 7], scale amax / 7):
// the fake-quant values against a formula written out here, the frozen Linear on the int8
// kernels with codes of the rows' grid (clipped or not) equal to the unfrozen layer, MatMuls
// likewise on bmm_s8s8f32, and the qtypes refused.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "framework/api/kernel_plan.h"
#include "framework/api/quantize.h"
#include "framework/api/quantizer.h"
#include "framework/core/error.h"
#include "framework/io/model_io.h"
#include "framework/nn/linear.h"
#include "framework/nn/matmul.h"
#include "kernels/cpu/quantize_rows_s8.h"

namespace qforge {
namespace {

// The rule in plain loops: per row, s = amax / qmax (1 for an all-zero row), q = clamp(rint(x / s))
// with the fake-quant kernels' x * (1 / s), x̂ = q * s.
// clip: the row's range is amax * clip (QuantizerConfig::clip_ratio), values beyond it saturate.
// The codes q (as floats) of every row, and the row's scale s in *scales ([rows, 1]).
at::Tensor dynamic_codes(const at::Tensor& x2d, int qmax, float clip, at::Tensor* scales) {
  at::Tensor out = at::empty_like(x2d);
  *scales = at::empty({x2d.size(0), 1});
  auto in = x2d.accessor<float, 2>();
  auto o = out.accessor<float, 2>();
  auto sc = scales->accessor<float, 2>();
  for (int64_t r = 0; r < x2d.size(0); ++r) {
    float amax = 0;
    for (int64_t k = 0; k < x2d.size(1); ++k) amax = std::max(amax, std::fabs(in[r][k]));
    const float range = clip == 1.0f ? amax : amax * clip;
    const float s = range > 0 ? range / static_cast<float>(qmax) : 1.0f, inv = 1.0f / s;
    sc[r][0] = s;
    for (int64_t k = 0; k < x2d.size(1); ++k)
      o[r][k] = std::min(std::max(std::nearbyint(in[r][k] * inv), -static_cast<float>(qmax)), static_cast<float>(qmax));
  }
  return out;
}

// x̂ = q * s of every row.
at::Tensor dynamic_reference(const at::Tensor& x2d, int qmax, float clip = 1.0f) {
  at::Tensor s;
  const at::Tensor q = dynamic_codes(x2d, qmax, clip, &s);
  return q * s;
}

Scheme w4a4() {
  Scheme s(qint4);
  s.weight_granularity = Granularity::kPerGroup;
  s.group_size = 32;
  s.activations = ActivationMode::kDynamicPerToken;
  s.activation_qtype = qint4;
  return s;
}

TEST(DynamicInt4Activations, RowsLandOnTheNarrowInt4GridOfTheirOwnAmax) {
  at::manual_seed(1);
  at::Tensor x = at::randn({6, 40});
  x[2].zero_();
  x[4][7] = 25.0f;  // one outlier widens that row's step only
  for (const auto& [qtype, qmax] : {std::pair<QType, int>{qint4, 7}, {qint3, 3}, {qint2, 1}, {qint8, 127}}) {
    const QParams qp = QuantizerImpl::dynamic_qparams(x, qtype);
    EXPECT_EQ(qp.spec.quant_max(), qmax) << qtype.name;
    EXPECT_EQ(qp.spec.quant_min(), -qmax) << qtype.name;
    EXPECT_TRUE(at::equal(fake_quantize(x, qp), dynamic_reference(x, qmax))) << qtype.name;
  }
  // Seven levels either side: every value of a qint4 row is a multiple of its amax / 7.
  const at::Tensor xq = fake_quantize(x, QuantizerImpl::dynamic_qparams(x, qint4));
  const at::Tensor steps = xq / (x.abs().amax(1, true).clamp_min(1e-30) / 7.0f);
  EXPECT_LT((steps - steps.round()).abs().max().item<float>(), 1e-4);
  EXPECT_TRUE(at::equal(xq[2], x[2]));
  EXPECT_THROW(QuantizerImpl::dynamic_qparams(x, quint8), Error);
}

// Frozen, W4A4 (and W8A4, and qint3 / qint2 rows) runs the int8-activation integer kernels on
// codes of the rows' own grid: the rows' codes and scales are the fake-quant ones
// (quantize_rows_s8 with qmax 7, bit for bit against the formula), and the output equals the
// fake-quant forward within the integer kernels' tolerance (float accumulation order).
TEST(DynamicInt4Activations, FrozenLinearRunsTheIntegerKernelOnCodesOfTheRowsGrid) {
  at::manual_seed(2);
  const at::Tensor x = at::randn({3, 5, 64});
  const at::Tensor x2 = x.reshape({-1, 64}).contiguous();
  for (const auto& [qtype, qmax] : {std::pair<QType, int>{qint4, 7}, {qint3, 3}, {qint2, 1}}) {
    // The kernels' row quantizer at qmax: codes and scales of the fake-quant rows.
    at::Tensor codes = at::empty({x2.size(0), 64}, at::kChar), scales = at::empty({x2.size(0)});
    kernels::quantize_rows_s8(x2.data_ptr<float>(), x2.size(0), 64, kernels::ActScale::kPerRow,
                              codes.data_ptr<int8_t>(), 64, scales.data_ptr<float>(), nullptr, qmax);
    EXPECT_TRUE(at::equal(codes.to(at::kFloat) * scales.unsqueeze(1), dynamic_reference(x2, qmax))) << qtype.name;
    EXPECT_EQ(codes.abs().max().item<int>(), qmax) << qtype.name;
    for (bool int8_weights : {false, true}) {
      nn::Linear lin(torch::nn::LinearOptions(64, 24));
      lin->eval();
      Scheme s = int8_weights ? Scheme(qint8) : w4a4();
      s.activations = ActivationMode::kDynamicPerToken;
      s.activation_qtype = qtype;
      quantize(*lin, s);
      at::NoGradGuard g;
      const at::Tensor fake = lin->forward(x);
      // The input really is on the narrow grid: the layer's output is the weight against x̂.
      const at::Tensor w = lin->weight_quantizer()->forward(lin->weight);
      EXPECT_TRUE(at::allclose(fake, at::linear(dynamic_reference(x2, qmax).reshape(x.sizes()), w, lin->bias), 1e-5,
                               1e-5));
      EXPECT_FALSE(at::allclose(fake, at::linear(x, w, lin->bias), 1e-3, 1e-3));
      const std::string what = std::string(qtype.name) + (int8_weights ? " rows, int8 weights" : " rows, int4 weights");
      const KernelPlan p = lin->plan();
      EXPECT_EQ(p.path, int8_weights ? LinearPath::kS8Dynamic : LinearPath::kS4Dynamic) << what;
      EXPECT_EQ(p.kernel.find("dequantize"), std::string::npos) << what << ": " << p.kernel;
      freeze(*lin);
      ASSERT_TRUE(lin->frozen());
      const at::Tensor y = lin->forward(x);
      const double rel = (y - fake).abs().max().item<double>() / fake.abs().max().item<double>();
      EXPECT_LE(rel, 1e-5) << what;
      const std::string d = describe(*lin);
      EXPECT_NE(d.find(std::string("dynamic ") + qtype.name + " per_token symmetric"), std::string::npos) << d;
    }
  }
}

// QuaRot's activation clipping: each row's scale covers clip_ratio · amax; the largest values
// saturate at ±qmax steps, through the Linear's quantizer, its describe(), a checkpoint, and its
// frozen kernels (quantize_rows_s8 clips likewise), for Linear and MatMul layers.
TEST(DynamicInt4Activations, ClippedRowsSaturateAndFreezeOntoTheKernelsOfLinearsAndMatMuls) {
  at::manual_seed(3);
  at::Tensor x = at::randn({6, 40});
  x[2].zero_();
  x[4][7] = 25.0f;
  for (const float clip : {0.9f, 0.5f})
    for (const auto& [qtype, qmax] : {std::pair<QType, int>{qint4, 7}, {qint8, 127}}) {
      const at::Tensor got = fake_quantize(x, QuantizerImpl::dynamic_qparams(x, qtype, clip));
      EXPECT_TRUE(at::equal(got, dynamic_reference(x, qmax, clip))) << qtype.name << " clip " << clip;
      EXPECT_FALSE(at::equal(got, dynamic_reference(x, qmax))) << "clipping changes the grid";
      EXPECT_LT(got[4][7].item<float>(), 25.0f * clip * 1.0001f) << "the outlier saturates";
    }
  EXPECT_THROW(QuantizerImpl::dynamic_qparams(x, qint4, 0.0f), Error);
  EXPECT_THROW(QuantizerImpl::dynamic_qparams(x, qint4, 1.5f), Error);

  nn::Linear lin(torch::nn::LinearOptions(64, 24));
  lin->eval();
  Scheme s = w4a4();
  s.activation_clip_ratio = 0.9f;
  quantize(*lin, s);
  EXPECT_EQ(lin->scheme().activation.clip_ratio, 0.9f);
  const at::Tensor in = at::randn({3, 5, 64});
  at::NoGradGuard g;
  const at::Tensor xq = dynamic_reference(in.reshape({-1, 64}), 7, 0.9f).reshape(in.sizes());
  const at::Tensor w = lin->weight_quantizer()->forward(lin->weight);
  EXPECT_TRUE(at::allclose(lin->forward(in), at::linear(xq, w, lin->bias), 1e-5, 1e-5));
  EXPECT_NE(describe(*lin).find("dynamic qint4 per_token symmetric clip 0.9"), std::string::npos) << describe(*lin);
  // The kernels' row quantizer with the clip: the fake-quant rows' codes and scales, bit for bit.
  for (const auto& [qmax, clip] : {std::pair<int, float>{7, 0.9f}, {127, 0.5f}, {7, 1e-4f}}) {
    const at::Tensor x2 = in.reshape({-1, 64}).contiguous();
    at::Tensor codes = at::empty({x2.size(0), 64}, at::kChar), scales = at::empty({x2.size(0)});
    kernels::quantize_rows_s8(x2.data_ptr<float>(), x2.size(0), 64, kernels::ActScale::kPerRow,
                              codes.data_ptr<int8_t>(), 64, scales.data_ptr<float>(), nullptr, qmax, clip);
    EXPECT_TRUE(at::equal(codes.to(at::kFloat) * scales.unsqueeze(1), dynamic_reference(x2, qmax, clip)))
        << qmax << " clip " << clip;
  }
  // Through a checkpoint: the clip ratio comes back (files without it read as 1).
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("qforge_clip_" + std::to_string(::getpid()) + ".h5")).string();
  io::save_model(lin, path);
  nn::Linear loaded(torch::nn::LinearOptions(64, 24));
  loaded->eval();
  io::load_model(loaded, path);
  EXPECT_EQ(loaded->scheme().activation.clip_ratio, 0.9f);
  EXPECT_TRUE(at::equal(loaded->forward(in), lin->forward(in)));
  // Into a model quantized without the clip: a different scheme, refused (not silently unclipped).
  nn::Linear unclipped(torch::nn::LinearOptions(64, 24));
  quantize(*unclipped, w4a4());
  EXPECT_THROW(io::load_model(unclipped, path), Error);
  EXPECT_EQ(unclipped->scheme().activation.clip_ratio, 1.0f);
  std::filesystem::remove(path);
  // A static scheme takes no clip ratio (its scales come from the observer): through the Scheme
  // API it is refused, naming the ratio, and the model stays unquantized; a ratio out of (0, 1] too.
  nn::Linear fresh(torch::nn::LinearOptions(64, 24));
  Scheme clipped_static(qint8);
  clipped_static.activations = ActivationMode::kStatic;
  clipped_static.activation_clip_ratio = 0.9f;
  try {
    quantize(*fresh, clipped_static);
    FAIL() << "dropped the clip ratio of a static scheme";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("clips dynamic per-token activation rows only"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fresh->quantized());
  Scheme too_wide = w4a4();
  too_wide.activation_clip_ratio = 1.5f;
  EXPECT_THROW(quantize(*fresh, too_wide), Error);
  EXPECT_FALSE(fresh->quantized());
  LayerScheme ls;
  ls.activations = ActivationMode::kStatic;
  ls.activation.clip_ratio = 0.9f;
  EXPECT_THROW(lin->attach("lin", ls), Error);
  // Frozen: the integer kernel on the clipped rows' codes, equal to the fake-quant forward.
  const at::Tensor fake = lin->forward(in);
  EXPECT_EQ(lin->plan().path, LinearPath::kS4Dynamic) << "planned onto the integer kernels";
  freeze(*lin);
  ASSERT_TRUE(lin->frozen());
  EXPECT_EQ(lin->plan().path, LinearPath::kS4Dynamic);
  EXPECT_LE((lin->forward(in) - fake).abs().max().item<double>() / fake.abs().max().item<double>(), 1e-5);
  // A MatMul (an attention product) freezes with clipped and narrower rows too: bmm_s8s8f32 on
  // each operand's codes, quantized by its own quantizer's formula (rows of a, columns of b).
  for (const auto& [qtype, clip] : {std::pair<QType, float>{qint8, 0.9f}, {qint4, 0.9f}, {qint4, 1.0f}}) {
    SCOPED_TRACE(std::string(qtype.name) + " clip " + std::to_string(clip));
    nn::MatMul mm;
    Scheme ms(qint8);
    ms.weights.reset();
    ms.activations = ActivationMode::kDynamicPerToken;
    ms.activation_qtype = qtype;
    ms.activation_clip_ratio = clip;
    quantize(*mm, ms);
    const at::Tensor a = at::randn({2, 3, 5, 48}), b = at::randn({2, 3, 48, 7});
    a[1][2][4][9] = 30.0f;  // an outlier the clip saturates
    const at::Tensor fake = mm->forward(a, b);
    const int qmax = qtype == qint4 ? 7 : 127;
    const at::Tensor aq = dynamic_reference(a.reshape({-1, 48}), qmax, clip).reshape(a.sizes());
    const at::Tensor bq = dynamic_reference(b.transpose(-1, -2).reshape({-1, 48}), qmax, clip)
                              .reshape({2, 3, 7, 48}).transpose(-1, -2);
    EXPECT_TRUE(at::allclose(fake, at::matmul(aq, bq), 1e-5, 1e-5)) << "the fake-quant forward is the formula's";
    EXPECT_EQ(mm->plan().path, LinearPath::kS8Dynamic) << "planned onto bmm_s8s8f32";
    freeze(*mm);
    ASSERT_TRUE(mm->frozen());
    EXPECT_NE(describe(*mm).find("bmm_s8s8f32"), std::string::npos) << describe(*mm);
    const at::Tensor got = mm->forward(a, b);
    // Integer sums (exact) times both scales against float sums of the same products.
    EXPECT_LE((got - fake).abs().max().item<double>() / fake.abs().max().item<double>(), 1e-5);
    // And bit for bit what the kernel must compute: the exact int32 product of the formula's codes
    // (rows of a, columns of b), then (acc * s_b) * s_a in float.
    at::Tensor sa, sbt;
    const at::Tensor qa = dynamic_codes(a.reshape({-1, 48}), qmax, clip, &sa).reshape(a.sizes());
    const at::Tensor qbt =
        dynamic_codes(b.transpose(-1, -2).contiguous().reshape({-1, 48}), qmax, clip, &sbt).reshape({2, 3, 7, 48});
    const at::Tensor acc = at::matmul(qa.to(at::kDouble), qbt.transpose(-1, -2).to(at::kDouble)).to(at::kFloat);
    EXPECT_TRUE(at::equal(got, acc * sbt.reshape({2, 3, 1, 7}) * sa.reshape({2, 3, 5, 1})))
        << "the integer kernel's result";
  }
}

TEST(DynamicInt4Activations, UnsignedOrAsymmetricDynamicGridsAreRefused) {
  nn::Linear lin(torch::nn::LinearOptions(16, 8));
  LayerScheme ls;
  ls.activations = ActivationMode::kDynamicPerToken;
  ls.activation.spec.qtype = quint4;
  ls.activation.spec.symmetric = true;
  EXPECT_THROW(lin->attach("lin", ls), Error);
  ls.activation.spec.qtype = qint4;
  ls.activation.spec.symmetric = false;
  EXPECT_THROW(lin->attach("lin", ls), Error);
  EXPECT_FALSE(lin->quantized());
  ls.activation.spec.symmetric = true;
  ls.activation.spec.narrow_range = true;
  EXPECT_NO_THROW(lin->attach("lin", ls));
}

}  // namespace
}  // namespace qforge
