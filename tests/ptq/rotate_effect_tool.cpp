// Not a test: docs/rotations.md's W4A8 figures with and without the Hadamard rotation, on a random
// Llama with planted outlier channels (tests/ptq/planted_llama.h).
//   rotate_effect_tool [hidden] [intermediate] [layers] [outlier_scale]
// Text: sequences sampled from the float model itself, so its perplexity is the reference and a
// quantized model's excess over it is what quantization costs. W4A8: int4 per-channel symmetric
// weights (RTN), int8 dynamic per-token activations; the embedding stays float.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "framework/api/quantize.h"
#include "framework/models/llama.h"
#include "framework/ptq/rotate.h"
#include "tests/ptq/planted_llama.h"

namespace {

using qforge::models::LlamaConfig;
using qforge::models::LlamaForCausalLM;
using qforge::ptq::tools::Eval;
using qforge::ptq::tools::evaluate;
using qforge::ptq::tools::kOutliers;
using qforge::ptq::tools::planted_llama;
using qforge::ptq::tools::sample_text;

qforge::Scheme w4a8() {
  qforge::Scheme s(qforge::qint4);
  s.weight_granularity = qforge::Granularity::kPerChannel;
  s.group_size = 0;
  s.activations = qforge::ActivationMode::kDynamicPerToken;
  qforge::LayerRule keep;
  keep.pattern = "model.embed_tokens";
  keep.keep_float = true;
  s.rules.push_back(keep);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  LlamaConfig c;
  c.vocab_size = 512, c.hidden_size = argc > 1 ? std::atoll(argv[1]) : 512;
  c.intermediate_size = argc > 2 ? std::atoll(argv[2]) : 1024;
  c.num_hidden_layers = argc > 3 ? std::atoll(argv[3]) : 4;
  c.num_attention_heads = 8, c.num_key_value_heads = 4, c.max_position_embeddings = 256;
  const double scale = argc > 4 ? std::atof(argv[4]) : 20.0;
  at::set_num_threads(1);

  LlamaForCausalLM ref = planted_llama(c, scale);
  const at::Tensor ids = sample_text(ref, 8, 96);
  at::Tensor float_logp;
  {
    at::NoGradGuard g;
    float_logp = at::log_softmax(ref->forward(ids).narrow(1, 0, ids.size(1) - 1), -1);
  }
  const Eval f = evaluate(ref, ids, float_logp);

  LlamaForCausalLM plain = planted_llama(c, scale);
  qforge::quantize(plain, w4a8());
  const Eval q = evaluate(plain, ids, float_logp);

  LlamaForCausalLM turned = planted_llama(c, scale);
  const auto run = [&](int64_t) { return turned->forward(ids.narrow(0, 0, 2)); };
  const qforge::ptq::RotateReport r = qforge::ptq::rotate_measured(*turned, 1, run);
  const Eval fr = evaluate(turned, ids, float_logp);
  qforge::quantize(turned, w4a8());
  const Eval qr = evaluate(turned, ids, float_logp);

  double kb = 0, ka = 0, mb = 0, ma = 0;
  for (size_t i = 0; i < r.before.size(); ++i) {
    kb = std::max(kb, r.before[i].kurtosis), ka = std::max(ka, r.after[i].kurtosis);
    mb = std::max(mb, r.before[i].max_over_rms), ma = std::max(ma, r.after[i].max_over_rms);
  }
  std::printf("random Llama: hidden %lld, intermediate %lld, %lld layers, vocab 512, %lld outlier channels x%.0f; "
              "text: 8 x 96 tokens sampled from the float model\n",
              static_cast<long long>(c.hidden_size), static_cast<long long>(c.intermediate_size),
              static_cast<long long>(c.num_hidden_layers), static_cast<long long>(kOutliers), scale);
  std::printf("largest Linear-input kurtosis %.1f -> %.1f, largest max/RMS %.1f -> %.1f\n", kb, ka, mb, ma);
  std::printf("%-26s %12s %14s\n", "model", "perplexity", "KL vs float");
  std::printf("%-26s %12.3f %14.6f\n", "float", f.perplexity, f.kl);
  std::printf("%-26s %12.3f %14.6f\n", "float, rotated", fr.perplexity, fr.kl);
  std::printf("%-26s %12.3f %14.6f\n", "W4A8 RTN", q.perplexity, q.kl);
  std::printf("%-26s %12.3f %14.6f\n", "W4A8 RTN, rotated", qr.perplexity, qr.kl);
  return 0;
}
