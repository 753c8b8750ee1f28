// ONNX export from an installed qforge (component onnx): one of qforge's reference models (an MLP)
// with int8 weights and static int8 activations, calibrated, frozen and written as an ONNX QDQ graph.
#include <qforge/framework/models/mlp.h>
#include <qforge/framework/onnx/export.h>
#include <qforge/qforge.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "mlp.onnx";
  at::manual_seed(0);
  qforge::models::Mlp model(qforge::models::MlpOptions{64, {32}, 10});
  model->eval();
  qforge::Scheme scheme(qforge::qint8);
  scheme.activations = qforge::ActivationMode::kStatic;
  qforge::quantize(*model, scheme);
  {
    qforge::Calibration calibration(*model);
    model->forward(at::randn({64, 64}));
  }
  qforge::freeze(*model);
  const qforge::onnx_export::ExportInfo info = qforge::onnx_export::export_onnx(*model, path);
  std::printf("%s: %s, opset %lld, %lld nodes (%lld QuantizeLinear, %lld DequantizeLinear), %lld bytes\n",
              info.path.c_str(), info.model_type.c_str(), static_cast<long long>(info.opset),
              static_cast<long long>(info.nodes), static_cast<long long>(info.quantize_linear),
              static_cast<long long>(info.dequantize_linear), static_cast<long long>(info.file_bytes));
  const bool ok = info.quantize_linear > 0 && info.file_bytes > 0;
  std::printf("%s\n", ok ? "frozen model exported as ONNX QDQ" : "FAILED");
  return ok ? 0 : 1;
}
