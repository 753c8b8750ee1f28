// QAT in C++ through PyTorch's nn.MultiheadAttention in a TorchScript file (MhaNet and
// nn.TransformerEncoder from scripts/torchscript/make_fixtures.py): the gradients that reach the
// script's packed in_proj_weight and out_proj weight, batched (one qforge Linear over the packed
// weight) and unbatched (the branch that chunks qforge::weight), against PyTorch's autograd on the
// original file; then a few W8A8 fake-quant (STE) steps lower the loss, and the frozen model saves
// and reloads with equal outputs.
#include <gtest/gtest.h>

#include <torch/script.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <tuple>
#include <string>
#include <vector>

#include "framework/api/quantize.h"
#include "framework/jit/scripted_model.h"
#include "tests/jit/jit_test_util.h"

using qforge::jit::ScriptedModel;
using qforge::jit_test::fixture;
using qforge::jit_test::relative_error;

namespace {

const std::vector<std::string> kMhaNetParameters{"attn.in_proj_weight", "attn.in_proj_bias", "attn.out_proj.weight",
                                                 "attn.out_proj.bias", "head.weight", "head.bias"};

std::map<std::string, at::Tensor> parameters_of(const torch::jit::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.name] = p.value;
  return out;
}

// PyTorch's own per-channel fake-quant (ATen) on Scheme(qint8)'s weight grid: symmetric int8
// [-128, 127], zero point 0, scale max|w| / 127.5 per output row; with its STE mask (false where
// round(w / scale) falls outside the grid: the gradient stops there).
std::pair<at::Tensor, at::Tensor> pytorch_fake_quant_rows(const at::Tensor& w) {
  const at::Tensor d = w.detach();
  const at::Tensor scale = d.abs().amax(1) / 127.5;
  const at::Tensor zero_point = torch::zeros({d.size(0)}, torch::kInt);
  const auto [out, mask] = at::fake_quantize_per_channel_affine_cachemask(d, scale, zero_point, 0, -128, 127);
  return {out, mask};
}

// sum(y * r), r fixed: every output element weighs in the gradient.
at::Tensor probe_loss(const at::Tensor& y) {
  const at::Tensor r = torch::randn(y.sizes(), torch::TensorOptions().dtype(torch::kFloat)).detach();
  return (y * r).sum();
}

// The gradients of the rewritten model's script parameters and of the original file's (its weights
// set to `weights` where given) for probe_loss on x, from the same seed.
std::pair<std::map<std::string, at::Tensor>, std::map<std::string, at::Tensor>> gradients(
    ScriptedModel& m, const std::string& form, const at::Tensor& x, const std::map<std::string, at::Tensor>& weights) {
  m->train();
  torch::manual_seed(7);
  probe_loss(m->forward(x)).backward();
  torch::jit::Module original = torch::jit::load(fixture(form));
  original.train();
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, w] : weights) parameters_of(original).at(name).copy_(w);
  }
  torch::manual_seed(7);
  probe_loss(original.forward({x}).toTensor()).backward();
  std::map<std::string, at::Tensor> ours, theirs;
  for (const auto& [name, p] : parameters_of(m->script())) ours[name] = p.grad();
  for (const auto& [name, p] : parameters_of(original)) theirs[name] = p.grad();
  return {ours, theirs};
}

}  // namespace

// Float and weight-only int8 (STE: the gradient of the fake-quantized weight passes to the float
// one), batched and (scripted) unbatched: the script's parameters get PyTorch's autograd gradients
// of the same forward run on the fake-quantized weights.
TEST(TorchScriptMhaQat, GradientsReachInProjAndOutProjAsPyTorchsAutogradGivesThem) {
  torch::manual_seed(31);
  for (const char* form : {"mha_bf_scripted", "mha_bf_traced"}) {
    const bool scripted = std::string(form).find("scripted") != std::string::npos;
    std::vector<at::Tensor> xs{torch::randn({3, 5, 16})};
    if (scripted) xs.push_back(torch::randn({16, 16}));  // unbatched: the branch chunking the packed weight
    for (const at::Tensor& x : xs) {
      SCOPED_TRACE(std::string(form) + (x.dim() == 2 ? " unbatched" : " batched"));
      ScriptedModel float_model = qforge::jit::load_torchscript(fixture(form));
      const auto [float_grads, float_ref] = gradients(float_model, form, x, {});
      for (const std::string& name : kMhaNetParameters) {
        ASSERT_TRUE(float_grads.at(name).defined()) << name;
        EXPECT_GT(float_grads.at(name).abs().max().item<double>(), 0.0) << name;
        EXPECT_LE(relative_error(float_grads.at(name), float_ref.at(name)), 1e-6) << name;
      }
      ScriptedModel m = qforge::jit::load_torchscript(fixture(form));
      qforge::quantize(*m, qforge::Scheme(qforge::qint8));
      std::map<std::string, at::Tensor> quantized, masks;
      for (const char* name : {"attn.in_proj_weight", "attn.out_proj.weight", "head.weight"})
        std::tie(quantized[name], masks[name]) = pytorch_fake_quant_rows(parameters_of(m->script()).at(name));
      for (const auto& l : m->layers()) {
        if (l->spec().kind == qforge::jit::LayerKind::kMatMul) continue;  // no weight (and no activation scheme here)
        const std::string name = l->path() == "attn.in_proj_weight" ? l->path() : l->path() + ".weight";
        EXPECT_TRUE(at::equal(l->effective_weight().detach(), quantized.at(name))) << name;
        EXPECT_FALSE(masks.at(name).all().item<bool>()) << name;  // a clamped weight per row: the mask matters
      }
      auto [grads, ref] = gradients(m, form, x, quantized);
      for (const auto& [name, mask] : masks) ref[name] = ref.at(name) * mask;  // the STE
      for (const std::string& name : kMhaNetParameters) {
        const double error = relative_error(grads.at(name), ref.at(name));
        std::printf("%s %s: %s gradient, weight-only int8, relative error %.2g (float %.2g)\n", form,
                    x.dim() == 2 ? "unbatched" : "batched", name.c_str(), error,
                    relative_error(float_grads.at(name), float_ref.at(name)));
        EXPECT_LE(error, 1e-6) << name;
        // head.bias's gradient is sum(r) whatever the weights; every other one depends on them.
        if (name != "head.bias") {
          EXPECT_FALSE(at::equal(grads.at(name), float_grads.at(name))) << name;
        }
      }
    }
  }
}

namespace {

struct QatRun {
  std::vector<double> losses;     // the training loss of each step
  double eval_loss_before = 0.0;  // eval mode, fake-quant, before the first step
  double eval_loss_after = 0.0;   // eval mode, fake-quant, after the last step
};

// W8A8 static (calibrated on x), QatController, `steps` SGD steps over trainable_parameters() on
// (x, target) with `loss_fn`. Checks the first step's gradients reach the script's in_proj and
// out_proj weights and that training changed them.
bool attention_weight(const std::string& name) {
  return name.find("in_proj_weight") != std::string::npos || name.find("out_proj.weight") != std::string::npos;
}

using LossFn = std::function<at::Tensor(const at::Tensor&)>;

QatRun qat_steps(ScriptedModel& m, const at::Tensor& x, const LossFn& loss_fn, int steps, double lr) {
  qforge::quantize(*m, qforge::jit_test::w8a8());
  m->eval();
  {
    torch::NoGradGuard no_grad;
    qforge::Calibration calibration(*m);
    m->forward(x);
  }
  QatRun run;
  {
    torch::NoGradGuard no_grad;
    run.eval_loss_before = loss_fn(m->forward(x)).item<double>();
  }
  std::map<std::string, at::Tensor> watched;
  for (const auto& [name, p] : parameters_of(m->script()))
    if (attention_weight(name)) watched[name] = p.detach().clone();
  EXPECT_GE(watched.size(), 2u);
  qforge::QatController qat(*m, {/*freeze_observers_after=*/0});
  qat.begin_epoch();
  torch::optim::SGD opt(m->trainable_parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    const at::Tensor loss = loss_fn(m->forward(x));
    loss.backward();
    for (const auto& [name, p] : parameters_of(m->script())) {
      if (i == 0 && attention_weight(name)) {
        EXPECT_TRUE(p.grad().defined() && p.grad().abs().max().item<double>() > 0) << name;
      }
    }
    opt.step();
    qat.step();
    run.losses.push_back(loss.item<double>());
  }
  const auto now = parameters_of(m->script());
  for (const auto& [name, before] : watched) EXPECT_FALSE(at::equal(now.at(name), before)) << name;
  m->eval();
  torch::NoGradGuard no_grad;
  run.eval_loss_after = loss_fn(m->forward(x)).item<double>();
  return run;
}

// Freezes m (every layer on an integer kernel), saves, loads back both ways: outputs equal bit for
// bit; the frozen output stays within 1e-5 of the largest fake-quant output. Returns the frozen output.
at::Tensor freeze_save_reload(ScriptedModel& m, const at::Tensor& x) {
  m->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor fake_quant = m->forward(x);
  qforge::freeze(*m);
  for (const auto& l : m->layers()) EXPECT_TRUE(l->layer().frozen()) << l->path();
  const at::Tensor frozen = m->forward(x);
  std::printf("frozen vs fake-quant: relative error %.2g\n", relative_error(frozen, fake_quant));
  EXPECT_LE(relative_error(frozen, fake_quant), 1e-5);
  const auto reloaded = qforge::jit_test::save_and_reload(m, x);
  EXPECT_TRUE(at::equal(reloaded.plain, frozen));
  EXPECT_TRUE(at::equal(reloaded.again, frozen));
  return frozen;
}

}  // namespace

// MhaNet: classify 32 random sequences into 5 random classes (memorisation), W8A8 QAT.
TEST(TorchScriptMhaQat, MhaNetW8A8StepsLowerTheLossFrozenSavedReloadedEqual) {
  torch::manual_seed(32);
  const at::Tensor x = torch::randn({32, 6, 16}), labels = torch::randint(0, 5, {32});
  ScriptedModel m = qforge::jit::load_torchscript(qforge::jit_test::fixture("mha_bf_scripted"));
  const auto loss = [&](const at::Tensor& y) { return torch::nn::functional::cross_entropy(y, labels); };
  const QatRun run = qat_steps(m, x, loss, 40, 0.05);
  std::printf("mha_bf_scripted W8A8 QAT: loss %.4f -> %.4f (eval, fake-quant: %.4f -> %.4f)\n", run.losses.front(),
              run.losses.back(), run.eval_loss_before, run.eval_loss_after);
  EXPECT_LT(run.losses.back(), 0.8 * run.losses.front());
  EXPECT_LT(run.eval_loss_after, 0.8 * run.eval_loss_before);
  const at::Tensor frozen = freeze_save_reload(m, x);
  EXPECT_LT(loss(frozen).item<double>(), 0.8 * run.eval_loss_before);
  // torchscript_python_test loads this file in Python and checks the same output.
  if (const char* out_dir = std::getenv("QFORGE_TORCHSCRIPT_OUT")) {
    namespace fs = std::filesystem;
    fs::create_directories(out_dir);
    m->save((fs::path(out_dir) / "mha_qat_frozen.pt").string());
    const std::vector<char> io = torch::pickle_save(c10::ivalue::Tuple::create({x, frozen}));
    std::ofstream(fs::path(out_dir) / "mha_qat_io.pt", std::ios::binary).write(io.data(), io.size());
  }
}

// nn.TransformerEncoder (two layers, final LayerNorm): regress 16 random sequences onto random
// targets, W8A8 QAT.
TEST(TorchScriptMhaQat, EncoderStackW8A8StepsLowerTheLossFrozenSavedReloadedEqual) {
  torch::manual_seed(33);
  const at::Tensor x = torch::randn({16, 6, 16}), target = torch::randn({16, 6, 16});
  ScriptedModel m = qforge::jit::load_torchscript(qforge::jit_test::fixture("encoder_stack_nested_scripted"));
  const auto loss = [&](const at::Tensor& y) { return torch::nn::functional::mse_loss(y, target); };
  const QatRun run = qat_steps(m, x, loss, 40, 0.05);
  std::printf("encoder_stack_nested_scripted W8A8 QAT: loss %.4f -> %.4f (eval, fake-quant: %.4f -> %.4f)\n",
              run.losses.front(), run.losses.back(), run.eval_loss_before, run.eval_loss_after);
  EXPECT_LT(run.losses.back(), 0.9 * run.losses.front());
  EXPECT_LT(run.eval_loss_after, 0.9 * run.eval_loss_before);
  freeze_save_reload(m, x);
}
