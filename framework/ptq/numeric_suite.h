// The numeric suite: how much error quantization put into each layer, measured on real batches
// (as torch.ao.ns compares a float and a quantized model layer by layer). For every quantized
// Linear / Conv1d / Conv2d, with W the float weight, Q(W) its fake-quantized weight, Qin the
// layer's input quantizer (identity without one) and b the bias:
//   y_f   = x_f · Wᵀ + b               x_f: the layer's input in the float model
//   y_own = Qin(x_f) · Q(W)ᵀ + b        the layer's own error: float inputs, quantized layer
//   y_acc = Qin(x_q) · Q(W)ᵀ + b        accumulated error: x_q is the input the quantized model feeds
//   SQNR(ref, y) = 10 log10(Σ ref² / Σ (ref − y)²) dB (+inf when y equals ref), relative MSE as
//   ptq::relative_mse; weight SQNR = SQNR(W, Q(W));
//   after a solver (GPTQ, AdaRound, bias correction) replaced W and b by its solution W', b', the
//   float side is the W, b it started from (NumericSuiteOptions::float_weights): y_own =
//   Qin(x_f) · Q(W')ᵀ + b', weight SQNR = SQNR(W, Q(W')), and the float pass runs with W, b;
//   clipped fraction = share of x_q's elements outside a static input quantizer's range
//   [(quant_min − zp)·s, (quant_max − zp)·s] (fp8: ±max_finite·s);
//   nonfinite inputs = NaN/inf elements reaching the layer in the quantized model.
// Convolutions compare their im2col rows. Other quantized layers (Embedding, LayerNorm, MatMul,
// grouped convolutions) get the weight SQNR where they have a weight and a note saying why the
// output errors are absent.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "framework/ptq/ptq.h"

namespace qforge::ptq {

struct LayerError {
  static constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  std::string path, type;
  std::string note;                     // why some quantities are absent (empty: all measured)
  double weight_sqnr_db = kNone;
  double own_sqnr_db = kNone, own_relative_mse = kNone;
  double accumulated_sqnr_db = kNone, accumulated_relative_mse = kNone;
  double clipped_fraction = kNone;      // static activations only
  int64_t nonfinite_inputs = 0;
  int64_t rows = 0;                     // rows compared per pass
};

struct NumericSuiteOptions {
  int64_t sample_rows = 2048;  // at most this many input rows kept per layer (evenly over the batches)
  // Path -> the float weight (and bias) a solver started from (SolveReport::replaced); without
  // it a solved layer would be compared with its own solution.
  std::map<std::string, FloatWeights> float_weights;
};

// Runs `batches` batches through the model twice (float, then quantized as it stands: fake-quant,
// observers untouched) in eval mode without gradients, and returns one entry per quantized layer
// in module order. Frozen layers are refused (their float weights are gone).
std::vector<LayerError> layer_errors(torch::nn::Module& model, int64_t batches, const RunBatch& run,
                                     const NumericSuiteOptions& options = {});

// 10 log10(Σ ref² / Σ (ref − y)²) in dB; +inf when y == ref, -inf when ref is all zero and y is not.
double sqnr_db(const at::Tensor& reference, const at::Tensor& y);

// The entries ordered worst first: lowest accumulated SQNR, then own, then weight SQNR; entries
// with none of them last.
std::vector<LayerError> worst_first(std::vector<LayerError> errors);

}  // namespace qforge::ptq
