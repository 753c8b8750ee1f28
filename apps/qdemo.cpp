// qdemo: an end-to-end run of what qforge does today, on real data (Fashion-MNIST from Debian's
// dataset-fashion-mnist): train a float MLP made of qforge layers, then post-training
// quantization with every observer, QAT with LSQ at low bit widths, freeze to integer kernels,
// and print accuracies, the per-layer report and the model size.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "framework/data/fashion_mnist.h"
#include "framework/nn/linear.h"
#include "framework/api/progress.h"
#include "framework/api/quantize.h"

namespace {

using namespace qforge;

struct Mlp : torch::nn::Module {
  Mlp() : fc1(register_module("fc1", nn::Linear(784, 256))), fc2(register_module("fc2", nn::Linear(256, 128))),
          fc3(register_module("fc3", nn::Linear(128, 10))) {}
  at::Tensor forward(const at::Tensor& x) {
    return fc3(at::relu(fc2(at::relu(fc1(x.reshape({x.size(0), -1}))))));
  }
  nn::Linear fc1, fc2, fc3;
};

double accuracy(Mlp& model, const data::LabelledImages& d) {
  at::NoGradGuard g;
  model.eval();
  int64_t correct = 0;
  for (int64_t b = 0; b < d.size(); b += 1000) {
    const int64_t n = std::min<int64_t>(1000, d.size() - b);
    const at::Tensor logits = model.forward(d.images.narrow(0, b, n));
    correct += at::eq(logits.argmax(1), d.labels.narrow(0, b, n)).sum().item<int64_t>();
  }
  return 100.0 * correct / d.size();
}

void train(Mlp& model, const data::LabelledImages& d, int epochs, double lr, const std::string& label,
           QatController* qat = nullptr) {
  std::vector<at::Tensor> params;
  for (const auto& p : model.parameters()) params.push_back(p);
  torch::optim::Adam opt(params, torch::optim::AdamOptions(lr));
  const int64_t batch = 128, steps = (d.size() + batch - 1) / batch;
  for (int e = 0; e < epochs; ++e) {
    if (qat) qat->begin_epoch(); else model.train();
    const at::Tensor perm = at::randperm(d.size());
    Progress bar(label + " epoch " + std::to_string(e + 1), steps);
    double running = 0;
    for (int64_t s = 0; s < steps; ++s) {
      const at::Tensor idx = perm.narrow(0, s * batch, std::min(batch, d.size() - s * batch));
      opt.zero_grad();
      const at::Tensor loss = at::cross_entropy_loss(model.forward(d.images.index_select(0, idx)),
                                                     d.labels.index_select(0, idx));
      loss.backward();
      opt.step();
      if (qat) qat->step();
      running = 0.98 * running + 0.02 * loss.item<double>();
      bar.update(1, "loss " + std::to_string(running).substr(0, 5));
    }
  }
}

void calibrate(Mlp& model, const data::LabelledImages& d, int64_t n) {
  model.eval();
  Calibration calib(model);
  for (int64_t b = 0; b < n; b += 256) model.forward(d.images.narrow(0, b, std::min<int64_t>(256, n - b)));
  calib.finish();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qdemo: float training, PTQ with every observer, LSQ QAT and freeze on Fashion-MNIST"};
  int epochs = 3, qat_epochs = 1;
  int64_t calib_images = 2048;
  uint64_t seed = 0;
  app.add_option("--epochs", epochs, "float training epochs")->check(CLI::Range(1, 100));
  app.add_option("--qat-epochs", qat_epochs, "QAT epochs")->check(CLI::Range(0, 100));
  app.add_option("--calib-images", calib_images, "calibration images")->check(CLI::Range(1, 55000));
  app.add_option("--seed", seed, "random seed");
  CLI11_PARSE(app, argc, argv);
  try {
    at::manual_seed(seed);
    const data::FashionMnist d = data::load_fashion_mnist(5000, seed);
    std::printf("Fashion-MNIST: %lld train, %lld validation, %lld test images\n",
                static_cast<long long>(d.train.size()), static_cast<long long>(d.validation.size()),
                static_cast<long long>(d.test.size()));

    auto model = std::make_shared<Mlp>();
    train(*model, d.train, epochs, 1e-3, "float");
    const double acc_float = accuracy(*model, d.test);
    std::vector<at::Tensor> saved;
    for (const auto& p : model->parameters()) saved.push_back(p.detach().clone());
    auto fresh_copy = [&] {
      auto m = std::make_shared<Mlp>();
      at::NoGradGuard g;
      auto params = m->parameters();
      for (size_t i = 0; i < params.size(); ++i) params[i].copy_(saved[i]);
      return m;
    };

    struct Row {
      std::string name;
      double acc;
    };
    std::vector<Row> rows{{"float32", acc_float}};

    auto w8a8 = [](const std::string& observer, HistogramMethod method) {
      Scheme s(qint8);
      s.activations = ActivationMode::kStatic;
      s.observer = observer;
      s.observer_options.method = method;
      return s;
    };
    struct Ptq {
      std::string name;
      Scheme scheme;
    };
    std::vector<Ptq> ptq{{"W8 weight-only", Scheme(qint8)},
                         {"W8A8 dynamic per-token", [] { Scheme s(qint8); s.activations = ActivationMode::kDynamicPerToken; return s; }()},
                         {"W8A8 static minmax", w8a8("minmax", HistogramMethod::kL2)},
                         {"W8A8 static histogram l2", w8a8("histogram", HistogramMethod::kL2)},
                         {"W8A8 static entropy", w8a8("histogram", HistogramMethod::kEntropy)},
                         {"W8A8 static percentile", w8a8("histogram", HistogramMethod::kPercentile)},
                         {"W8A8 static mse", w8a8("histogram", HistogramMethod::kMse)},
                         {"W4 g16 weight-only", [] { Scheme s(qint4); s.group_size = 16; return s; }()},
                         {"W2 per-channel weight-only", [] { Scheme s(qint2); s.weight_granularity = Granularity::kPerChannel; return s; }()},
                         {"FP8 e4m3 weight-only", Scheme(qfloat8_e4m3fn)}};
    for (const Ptq& p : ptq) {
      auto m = fresh_copy();
      quantize(*m, p.scheme);
      if (p.scheme.activations == ActivationMode::kStatic) calibrate(*m, d.train, calib_images);
      rows.push_back({"PTQ " + p.name, accuracy(*m, d.test)});
      std::printf("  %-36s %6.2f%%\n", rows.back().name.c_str(), rows.back().acc);
    }

    // QAT: 2-bit weights with learnable steps, 8-bit static activations.
    auto qat_model = fresh_copy();
    Scheme q2(qint2);
    q2.weight_granularity = Granularity::kPerChannel;
    q2.weight_lsq = true;
    q2.activations = ActivationMode::kStatic;
    q2.observer = "moving_average_minmax";
    quantize(*qat_model, q2);
    calibrate(*qat_model, d.train, calib_images);
    const double before = accuracy(*qat_model, d.test);
    rows.push_back({"PTQ W2A8 (LSQ init, before QAT)", before});
    if (qat_epochs > 0) {
      QatController qat(*qat_model, QatOptions{/*freeze_observers_after=*/200, -1});
      train(*qat_model, d.train, qat_epochs, 5e-4, "QAT W2A8", &qat);
      rows.push_back({"QAT W2A8 LSQ", accuracy(*qat_model, d.test)});
    }

    // Freeze W8A8 (static histogram) to integer kernels and compare.
    auto frozen = fresh_copy();
    quantize(*frozen, w8a8("histogram", HistogramMethod::kL2));
    calibrate(*frozen, d.train, calib_images);
    const double fq = accuracy(*frozen, d.test);
    const int64_t float_bytes = model_size(*frozen).total_bytes;
    freeze(*frozen);
    const double acc_frozen = accuracy(*frozen, d.test);
    rows.push_back({"W8A8 static l2, fake-quant", fq});
    rows.push_back({"W8A8 static l2, frozen int8 kernels", acc_frozen});

    std::printf("\n%-42s %s\n", "model", "test accuracy");
    for (const Row& r : rows) std::printf("%-42s %6.2f%%\n", r.name.c_str(), r.acc);
    std::printf("\nFrozen model layers:\n%s", describe(*frozen).c_str());
    const int64_t frozen_bytes = model_size(*frozen).total_bytes;
    std::printf("size: %lld bytes float -> %lld bytes frozen (%.2fx smaller)\n", static_cast<long long>(float_bytes),
                static_cast<long long>(frozen_bytes), static_cast<double>(float_bytes) / frozen_bytes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qdemo: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
