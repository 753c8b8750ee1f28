// Not a test: docs/results.md's tables "AWQ, the importance matrix and AutoRound": perplexity,
// KL divergence and time of RTN, GPTQ, AWQ, AWQ + GPTQ and AutoRound, each with and without the
// importance matrix, at W4 and W3 groups of 128 and W2 groups of 32, on a random Llama with planted
// outlier channels (tests/ptq/planted_llama.h). Text: sequences sampled from the float model, so the
// float perplexity is the reference; calibration and evaluation sequences are sampled apart.
// Weight-only, asymmetric, the embedding float, the head quantized (AutoRound's default rounds it
// by GPTQ; the "head RTN" row keeps it round-to-nearest, a ptq.rules entry, as before 2026-11-28).
// Steps as qtrain's calibrate and solve stages run them: AWQ, the imatrix on the float model, its
// grid search (except the layers imatrix_round_leaves names: AWQ's, GPTQ's, AutoRound's), the rounding.
//   llama_methods_tool [hidden=256] [intermediate=512] [layers=2] [autoround_iterations=200]
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "framework/api/quantize.h"
#include "framework/ptq/awq.h"
#include "framework/ptq/float_view.h"
#include "framework/ptq/imatrix.h"
#include "framework/ptq/ptq.h"
#include "tests/ptq/planted_llama.h"

namespace {

namespace qp = qforge::ptq;
using qforge::models::LlamaConfig;
using qforge::models::LlamaForCausalLM;

struct Method {
  const char* name;
  bool awq;
  qp::Rounding rounding;
  bool head_rtn = false;  // a rule: the head (outside the blocks) round-to-nearest, not AutoRound's GPTQ
};
const Method kMethods[] = {{"RTN", false, qp::Rounding::kNearest},
                           {"GPTQ", false, qp::Rounding::kGptq},
                           {"AWQ", true, qp::Rounding::kNearest},
                           {"AWQ+GPTQ", true, qp::Rounding::kGptq},
                           {"AutoRound, head RTN", false, qp::Rounding::kAutoRound, true},
                           {"AutoRound (head GPTQ)", false, qp::Rounding::kAutoRound}};

qforge::Scheme weight_only(qforge::QType q, int64_t group) {
  qforge::Scheme s(q);
  s.weight_granularity = qforge::Granularity::kPerGroup;
  s.group_size = group;
  s.weight_symmetric = false;
  s.rules.push_back(qforge::LayerRule{"model.embed_tokens", true});
  return s;
}

// One method on a fresh copy of the model, the importance matrix used or not; returns seconds.
double quantize_with(LlamaForCausalLM& m, const std::vector<at::Tensor>& calib, qforge::QType q, int64_t group,
                     const Method& method, bool imatrix, int64_t autoround_iterations) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t batches = static_cast<int64_t>(calib.size());
  const qp::RunBatch run = [&](int64_t b) { return m->forward(calib[static_cast<size_t>(b)]); };
  qforge::quantize(m, weight_only(q, group));
  std::vector<std::string> clipped;
  if (method.awq) {
    qp::AwqOptions o;  // the table's AWQ: each Linear's output, the paper's activation scales
    o.objective = qp::AwqObjective::kLayer;
    o.scales = qp::AwqScales::kActivation;
    clipped = qp::awq_clipped_layers(qp::awq(*m, batches, run, o));
  }
  qp::SolveOptions o;
  o.rounding = method.rounding;
  if (method.head_rtn) o.rules.push_back({"lm_head", qp::Rounding::kNearest});
  o.autoround.iterations = autoround_iterations;
  qforge::Imatrix im;
  if (imatrix) {
    at::NoGradGuard g;
    const qp::FloatView fv(*m);
    qp::ImatrixCollector collector(*m);
    for (int64_t b = 0; b < batches; ++b) run(b);
    im = collector.take();
    qp::imatrix_round(*m, im, qp::imatrix_round_leaves(qp::plan_solve(*m, o), clipped));  // as the solve stage
    o.imatrix = &im;
    o.clipped_by_awq = clipped;
  }
  if (method.rounding != qp::Rounding::kNearest) qp::solve(*m, batches, run, o);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  LlamaConfig c;
  c.vocab_size = 512, c.hidden_size = argc > 1 ? std::atoll(argv[1]) : 256;
  c.intermediate_size = argc > 2 ? std::atoll(argv[2]) : 512;
  c.num_hidden_layers = argc > 3 ? std::atoll(argv[3]) : 2;
  c.num_attention_heads = 8, c.num_key_value_heads = 2, c.max_position_embeddings = 256;
  c.tie_word_embeddings = false;
  const int64_t iterations = argc > 4 ? std::atoll(argv[4]) : 200;
  const double scale = 20.0;

  LlamaForCausalLM ref = qp::tools::planted_llama(c, scale);
  const at::Tensor text = qp::tools::sample_text(ref, 8, 96, 1);
  const at::Tensor calib_text = qp::tools::sample_text(ref, 16, 64, 2);
  std::vector<at::Tensor> calib;
  for (int64_t b = 0; b < 4; ++b) calib.push_back(calib_text.narrow(0, 4 * b, 4));
  at::Tensor float_logp;
  {
    at::NoGradGuard g;
    float_logp = at::log_softmax(ref->forward(text).narrow(1, 0, text.size(1) - 1), -1);
  }
  const qp::tools::Eval f = qp::tools::evaluate(ref, text, float_logp);
  std::printf("random Llama: hidden %lld, intermediate %lld, %lld layers, GQA 8/2 heads, vocab 512, %lld outlier "
              "channels x%.0f; calibration 16 x 64 sampled tokens in 4 batches, evaluation 8 x 96; "
              "AutoRound %lld steps per block\nfloat perplexity %.3f\n",
              static_cast<long long>(c.hidden_size), static_cast<long long>(c.intermediate_size),
              static_cast<long long>(c.num_hidden_layers), static_cast<long long>(qp::tools::kOutliers), scale,
              static_cast<long long>(iterations), f.perplexity);
  const std::pair<qforge::QType, int64_t> configs[] = {{qforge::qint4, 128}, {qforge::qint3, 128}, {qforge::qint2, 32}};
  for (const auto& [q, group] : configs) {
    std::printf("\n%s g%lld\n| method | perplexity | KL | seconds | perplexity, imatrix | KL, imatrix | seconds, imatrix |\n"
                "|---|---|---|---|---|---|---|\n",
                q.name, static_cast<long long>(group));
    for (const Method& method : kMethods) {
      qp::tools::Eval e[2];
      double secs[2];
      for (int im = 0; im < 2; ++im) {
        LlamaForCausalLM m = qp::tools::planted_llama(c, scale);
        secs[im] = quantize_with(m, calib, q, group, method, im == 1, iterations);
        e[im] = qp::tools::evaluate(m, text, float_logp);
      }
      std::printf("| %s | %.3f | %.4f | %.1f | %.3f | %.4f | %.1f |\n", method.name, e[0].perplexity, e[0].kl, secs[0],
                  e[1].perplexity, e[1].kl, secs[1]);
      std::fflush(stdout);
    }
  }
  return 0;
}
