// README's quick start as a user writes it against an installed qforge: a model of qforge
// layers, int8 weights and static int8 activations, calibration, freeze, the per-layer report,
// a checkpoint, and the checkpoint loaded into a fresh float model that then computes the same.
#include <qforge/qforge.h>

#include <cstdio>
#include <string>

namespace {

struct Net : torch::nn::Module {
  Net() : fc1(register_module("fc1", qforge::nn::Linear(64, 128))), fc2(register_module("fc2", qforge::nn::Linear(128, 10))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(at::relu(fc1(x))); }
  qforge::nn::Linear fc1, fc2;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "quickstart_model.h5";
  at::manual_seed(0);
  auto model = std::make_shared<Net>();
  model->eval();
  const at::Tensor calib = at::randn({256, 64});
  const at::Tensor x = at::randn({4, 64});
  at::Tensor y_float;
  {
    at::NoGradGuard g;
    y_float = model->forward(x);
  }

  qforge::Scheme scheme(qforge::qint8);                  // int8 per-channel weights
  scheme.activations = qforge::ActivationMode::kStatic;  // int8 activations, histogram observer
  qforge::quantize(*model, scheme);
  {
    qforge::Calibration calibration(*model);
    for (int64_t b = 0; b < calib.size(0); b += 64) model->forward(calib.narrow(0, b, 64));
  }
  qforge::freeze(*model);
  std::printf("%s", qforge::describe(*model).c_str());
  qforge::io::save_model(*model, path);

  at::manual_seed(1);  // a fresh model with other float weights
  auto fresh = std::make_shared<Net>();
  fresh->eval();
  qforge::io::load_model(*fresh, path);
  at::NoGradGuard g;
  const at::Tensor y_frozen = model->forward(x), y_loaded = fresh->forward(x);
  const double to_float = (y_frozen - y_float).abs().max().item<double>();
  const bool same = at::equal(y_frozen, y_loaded);
  std::printf("max |frozen - float| = %.5f; loaded model %s the frozen one\n", to_float,
              same ? "computes exactly what" : "DIFFERS from");
  return same && fresh->fc1->frozen() ? 0 : 1;
}
