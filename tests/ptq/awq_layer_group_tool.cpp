// Output error and time of RTN, GPTQ, AWQ and AWQ + GPTQ, each with and without the importance
// matrix, on one Llama-3-8B-shaped layer group: q/k/v reading hidden states of width 4096
// (outputs 4096, 1024, 1024), random weights N(0, 0.02²), inputs N(0, 1) with a few outlier
// channels (LLM.int8()'s systematic outlier features: a handful of fixed hidden dimensions, 20-60×
// the rest). Error: Σ_i ‖X Ŵ_iᵀ − X W_iᵀ‖² / Σ_i ‖X W_iᵀ‖² on held-out rows. Not a test: the
// figures are docs/results.md's ("AWQ, the importance matrix and AutoRound").
// Usage: awq_layer_group_tool [bits=4] [rows=512] [group=128]
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "framework/ptq/awq.h"
#include "framework/ptq/gptq.h"
#include "framework/ptq/imatrix.h"

namespace qp = qforge::ptq;

namespace {

constexpr int64_t kHidden = 4096;
const std::vector<int64_t> kOutputs = {4096, 1024, 1024};  // q, k, v (GQA 32 / 8 heads of 128)
const std::vector<std::pair<int64_t, double>> kOutliers = {{17, 60}, {301, 40}, {1024, 25}, {2222, 50}, {3900, 20}};

at::Tensor inputs(int64_t rows, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor x = at::randn({rows, kHidden});
  for (const auto& [c, gain] : kOutliers) x.select(1, c).mul_(gain);
  return x;
}

struct Setup {
  at::Tensor x, x_test, mean_abs, h, imp;
  std::vector<at::Tensor> w;
  qforge::QSpec spec;
};

// GPTQ of w on the inputs' H, ordered by `imp` when defined.
at::Tensor gptq_weight(const at::Tensor& w, const at::Tensor& h, const qforge::QSpec& spec, const at::Tensor& imp) {
  qp::GptqOptions o;
  if (imp.defined()) {
    o.act_order = true;
    o.column_importance = imp;
  }
  return qp::gptq(w, h, spec, o).weight;
}

// One method's quantized weights: AWQ scales (or none), then RTN or GPTQ, the imatrix weighing
// the grid search (RTN) or the column order (GPTQ).
std::vector<at::Tensor> quantize_group(const Setup& s, bool awq, bool gptq, bool imatrix) {
  at::Tensor scale = at::ones({kHidden});
  std::vector<at::Tensor> ws = s.w;
  if (awq) {
    qp::AwqOptions o;
    o.scales = qp::AwqScales::kActivation;  // the paper's scales, as docs/results.md's figures were measured
    scale = qp::awq_search_scale(s.x, s.mean_abs, s.w, {s.spec, s.spec, s.spec}, o).scale;
    const at::Tensor xs = s.x / scale.unsqueeze(0);
    for (size_t i = 0; i < ws.size(); ++i) {
      ws[i] = s.w[i] * scale.unsqueeze(0);
      if (i == 2) ws[i] = qp::awq_apply_clip(ws[i], qp::awq_search_clip(xs, ws[i], s.spec, o), s.spec);  // v only, as AutoAWQ
    }
  }
  const at::Tensor h = awq ? s.h / (scale.unsqueeze(0) * scale.unsqueeze(1)) : s.h;
  const at::Tensor imp = imatrix ? s.imp / scale.pow(2) : at::Tensor();
  std::vector<at::Tensor> out;
  for (const at::Tensor& w : ws) {
    at::Tensor wq;
    if (gptq) {
      wq = gptq_weight(w, h, s.spec, imp);
    } else {
      const at::Tensor wc = imatrix ? qp::awq_apply_clip(w, qp::imatrix_search_clip(w, s.spec, imp), s.spec) : w;
      wq = qp::awq_round(wc, s.spec);
    }
    out.push_back(wq / scale.unsqueeze(0));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int bits = argc > 1 ? std::atoi(argv[1]) : 4;
  const int64_t rows = argc > 2 ? std::atoll(argv[2]) : 512;
  const int64_t group = argc > 3 ? std::atoll(argv[3]) : 128;
  at::NoGradGuard no_grad;
  Setup s;
  s.spec.qtype = bits == 3 ? qforge::qint3 : bits == 2 ? qforge::qint2 : qforge::qint4;
  s.spec.granularity = qforge::Granularity::kPerGroup;
  s.spec.group_size = group;
  s.spec.symmetric = true;
  s.x = inputs(rows, 1);
  s.x_test = inputs(rows, 2);
  s.mean_abs = s.x.abs().mean(0);
  s.h = 2 * at::matmul(s.x.t(), s.x) / static_cast<double>(rows);
  s.imp = s.x.pow(2).mean(0);
  at::manual_seed(3);
  for (int64_t n : kOutputs) s.w.push_back(at::randn({n, kHidden}) * 0.02);
  std::printf("Llama-3-8B-shaped q/k/v group, %s, %lld calibration rows, %lld held-out rows, %zu outlier channels\n",
              s.spec.to_string().c_str(), static_cast<long long>(rows), static_cast<long long>(rows), kOutliers.size());
  std::printf("| method | output error | with imatrix | seconds | with imatrix |\n|---|---|---|---|---|\n");
  const char* names[] = {"RTN", "GPTQ", "AWQ", "AWQ+GPTQ"};
  for (int m = 0; m < 4; ++m) {
    double err[2], secs[2];
    for (int im = 0; im < 2; ++im) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<at::Tensor> wq = quantize_group(s, m >= 2, m % 2 == 1, im == 1);
      secs[im] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      err[im] = qp::awq_group_error(s.x_test, s.w, wq);
    }
    std::printf("| %s | %.6f | %.6f | %.1f | %.1f |\n", names[m], err[0], err[1], secs[0], secs[1]);
    std::fflush(stdout);
  }
  return 0;
}
