// A PTQ solver from an installed qforge (component ptq): int4 weights rounded by GPTQ on
// calibration batches: the numeric suite's per-layer SQNR of round-to-nearest first
// (ptq::layer_errors, docs/reports.md), then GPTQ's per-layer output error before and after
// (ptq::solve), then freeze.
#include <qforge/framework/ptq/numeric_suite.h>
#include <qforge/qforge.h>

#include <cstdio>
#include <vector>

namespace {

struct Net : torch::nn::Module {
  Net()
      : fc1(register_module("fc1", qforge::nn::Linear(64, 128))),
        fc2(register_module("fc2", qforge::nn::Linear(128, 128))),
        fc3(register_module("fc3", qforge::nn::Linear(128, 10))) {}
  at::Tensor forward(const at::Tensor& x) { return fc3(at::relu(fc2(at::relu(fc1(x))))); }
  qforge::nn::Linear fc1, fc2, fc3;
};

}  // namespace

int main() {
  at::manual_seed(0);
  auto model = std::make_shared<Net>();
  model->eval();
  // Correlated inputs, where GPTQ's error feedback pays off against round-to-nearest.
  const at::Tensor mix = at::randn({64, 64});
  std::vector<at::Tensor> batches;
  for (int b = 0; b < 4; ++b) batches.push_back(at::matmul(at::randn({128, 64}), mix));
  const qforge::ptq::RunBatch run = [&](int64_t b) { return model->forward(batches[b]); };

  qforge::Scheme scheme(qforge::qint4);  // int4 weights in groups of 32 along the input
  scheme.group_size = 32;
  qforge::quantize(*model, scheme);
  // The numeric suite on the round-to-nearest model: each layer's own and accumulated output error.
  for (const auto& e : qforge::ptq::worst_first(qforge::ptq::layer_errors(*model, 4, run)))
    std::printf("%-4s round-to-nearest: weight SQNR %.1f dB, accumulated output SQNR %.1f dB\n", e.path.c_str(),
                e.weight_sqnr_db, e.accumulated_sqnr_db);
  qforge::ptq::SolveOptions options;
  options.rounding = qforge::ptq::Rounding::kGptq;
  const qforge::ptq::SolveReport solved = qforge::ptq::solve(*model, 4, run, options);
  bool better = true;
  for (const auto& l : solved.layers) {
    std::printf("%-4s %-5s relative output MSE %.5f -> %.5f\n", l.path.c_str(), l.method.c_str(), l.error_before,
                l.error_after);
    better = better && l.error_after <= l.error_before;
  }
  qforge::freeze(*model);
  std::printf("%s\n", better && model->fc1->frozen() ? "GPTQ lowered every layer's output error, then froze"
                                                      : "FAILED");
  return better ? 0 : 1;
}
