// Not a test: docs/rotations.md's W4 / W4A8 / W4A4 / KV-cache figures with and without the Hadamard
// rotation, on a random Llama with planted outlier channels (tests/ptq/planted_llama.h), keys with
// outlier channels too (k_proj's rows of one channel per key/value head scaled by the same factor,
// as real models' keys have them).
//   rotate_effect_tool [hidden] [intermediate] [layers] [outlier_scale] [spinquant_steps] [spinquant_lr]
// Text: sequences sampled from the float model itself, so its perplexity is the reference and a
// quantized model's excess over it (the gap) is what quantization costs. W4: int4 per-channel
// symmetric weights (RTN); A8 / A4: dynamic per-token int8 / int4 activations (amax / 127, amax / 7);
// KV8 / KV4: the cache's keys and values as per-token int8 / int4 codes (docs/kv_cache.md). The
// embedding and the attention products (Q·K^T, P·V) stay float. Rotated: ptq::rotate with its
// defaults (residual stream, online down_proj Hadamard, queries / keys online, values per head).
// With spinquant_steps > 0 a third column: the rotated model's residual-stream and value rotations
// then learned (ptq::learn_rotations_distilled: the KL to the float model on 16 other sampled
// sequences in batches of 4, the weights fake-quantized as the setting says, lr spinquant_lr).
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
#include "framework/ptq/spinquant.h"
#include "tests/ptq/planted_llama.h"

namespace {

using qforge::models::LlamaConfig;
using qforge::models::LlamaForCausalLM;
using qforge::ptq::tools::Eval;
using qforge::ptq::tools::evaluate;
using qforge::ptq::tools::kOutliers;
using qforge::ptq::tools::planted_llama;
using qforge::ptq::tools::sample_text;

struct Setting {
  const char* name;
  bool weights;
  int activation_bits;  // 0: float activations
  int kv_bits;          // 0: float cache
  bool kv_asymmetric = false;
  int64_t kv_group = 0;  // 0: one scale per head and position
  float kv_clip = 1.0f;  // KvCacheScheme::clip_ratio (QuaRot clips its cache at 0.95)
  float activation_clip = 1.0f;  // Scheme::activation_clip_ratio (QuaRot clips 4-bit rows at 0.9)
};

qforge::Scheme scheme(const Setting& s) {
  qforge::Scheme q(qforge::qint4);
  q.weight_granularity = qforge::Granularity::kPerChannel;
  q.group_size = 0;
  if (s.activation_bits > 0) {
    q.activations = qforge::ActivationMode::kDynamicPerToken;
    q.activation_qtype = s.activation_bits == 4 ? qforge::qint4 : qforge::qint8;
    q.activation_clip_ratio = s.activation_clip;
  }
  // The embedding and the attention products stay float (QuaRot quantizes the Linears' inputs and
  // the cache; P·V's per-column dynamic scales would also run over later positions).
  for (const char* pattern : {"model.embed_tokens", "*.qk_matmul", "*.av_matmul"}) {
    qforge::LayerRule keep;
    keep.pattern = pattern;
    keep.keep_float = true;
    q.rules.push_back(keep);
  }
  return q;
}

LlamaForCausalLM planted(const LlamaConfig& c, double scale) {
  LlamaForCausalLM m = planted_llama(c, scale);
  at::NoGradGuard g;
  const int64_t D = c.head_size();
  for (const auto& l : *m->model->layers) {
    auto* attn = l->as<qforge::models::LlamaDecoderLayerImpl>()->self_attn.get();
    for (int64_t h = 0; h < c.kv_heads(); ++h) attn->k_proj->weight[h * D + 5].mul_(scale);
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  LlamaConfig c;
  c.vocab_size = 512, c.hidden_size = argc > 1 ? std::atoll(argv[1]) : 512;
  c.intermediate_size = argc > 2 ? std::atoll(argv[2]) : 1024;
  c.num_hidden_layers = argc > 3 ? std::atoll(argv[3]) : 4;
  c.num_attention_heads = 8, c.num_key_value_heads = 4, c.max_position_embeddings = 256;
  const double scale = argc > 4 ? std::atof(argv[4]) : 20.0;
  const int64_t spin_steps = argc > 5 ? std::atoll(argv[5]) : 0;
  const double spin_lr = argc > 6 ? std::atof(argv[6]) : 20.0;
  at::set_num_threads(1);

  LlamaForCausalLM ref = planted(c, scale);
  const at::Tensor ids = sample_text(ref, 8, 96);
  const at::Tensor learn_ids = sample_text(ref, 16, 96, 7);  // SpinQuant's calibration text
  at::Tensor float_logp;
  {
    at::NoGradGuard g;
    float_logp = at::log_softmax(ref->forward(ids).narrow(1, 0, ids.size(1) - 1), -1);
  }
  const Eval f = evaluate(ref, ids, float_logp);

  // Rotation statistics once, on a float copy.
  LlamaForCausalLM measured = planted(c, scale);
  const auto run = [&](int64_t) { return measured->forward(ids.narrow(0, 0, 2)); };
  const qforge::ptq::RotateReport r = qforge::ptq::rotate_measured(*measured, 1, run);
  const Eval fr = evaluate(measured, ids, float_logp);
  double kb = 0, ka = 0, mb = 0, ma = 0;
  for (size_t i = 0; i < r.before.size(); ++i) {
    kb = std::max(kb, r.before[i].kurtosis), ka = std::max(ka, r.after[i].kurtosis);
    mb = std::max(mb, r.before[i].max_over_rms), ma = std::max(ma, r.after[i].max_over_rms);
  }
  std::printf("random Llama: hidden %lld, intermediate %lld, %lld layers, head_dim %lld, vocab 512, %lld outlier "
              "channels x%.0f, key channel 5 of each head x%.0f; text: 8 x 96 tokens sampled from the float model\n",
              static_cast<long long>(c.hidden_size), static_cast<long long>(c.intermediate_size),
              static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.head_size()),
              static_cast<long long>(kOutliers), scale, scale);
  std::printf("largest Linear-input kurtosis %.1f -> %.1f, largest max/RMS %.1f -> %.1f\n", kb, ka, mb, ma);
  std::printf("float perplexity %.3f (rotated %.3f, KL %.2e)\n\n", f.perplexity, fr.perplexity, fr.kl);
  std::printf("%-14s %12s %10s %10s %14s %10s %10s", "setting", "perplexity", "gap", "KL", "rotated: ppl",
              "gap", "KL");
  if (spin_steps > 0) std::printf(" %14s %10s %10s %8s", "learned: ppl", "gap", "KL", "U1 moved");
  std::printf("\n");
  const Setting settings[] = {{"W4", true, 0, 0},      {"W4A8", true, 8, 0},    {"W4A4", true, 4, 0},
                              {"W4A4KV4", true, 4, 4}, {"W4A8KV4", true, 8, 4}, {"KV8", false, 0, 8},
                              {"KV4", false, 0, 4},    {"KV4 asym", false, 0, 4, true},
                              {"KV4 asym g32", false, 0, 4, true, 32},
                              {"W4A4KV4 asym", true, 4, 4, true},
                              {"KV4 asym c.95", false, 0, 4, true, 0, 0.95f},
                              {"KV4 asym c.90", false, 0, 4, true, 0, 0.90f},
                              {"KV4 g32 c.95", false, 0, 4, true, 32, 0.95f},
                              {"W4A4KV4 a c.95", true, 4, 4, true, 0, 0.95f},
                              {"W4A4 a.9", true, 4, 0, false, 0, 1.0f, 0.9f},
                              {"W4A4 a.8", true, 4, 0, false, 0, 1.0f, 0.8f},
                              {"W4A4KV4 a.9 c.95", true, 4, 4, true, 0, 0.95f, 0.9f}};
  for (const Setting& s : settings) {
    Eval e[3];
    double moved = 0;
    for (int rotated = 0; rotated < (spin_steps > 0 ? 3 : 2); ++rotated) {
      LlamaForCausalLM m = planted(c, scale);
      if (rotated) qforge::ptq::rotate(*m);
      if (s.kv_bits > 0) {
        qforge::KvCacheScheme kv;
        kv.qtype = s.kv_bits == 4 ? qforge::qint4 : qforge::qint8;
        kv.symmetric = !s.kv_asymmetric;
        kv.group_size = s.kv_group;
        kv.clip_ratio = s.kv_clip;
        m->set_kv_cache_scheme(kv);
      }
      if (s.weights) qforge::quantize(m, scheme(s));
      if (rotated == 2) {
        qforge::ptq::SpinQuantOptions o;
        o.steps = spin_steps;
        o.lr = spin_lr;
        o.quantized_weights = s.weights;  // RTN weights here: learned against them, as SpinQuant does before RTN
        o.progress = false;
        const auto output = [&](int64_t b) { return m->forward(learn_ids.narrow(0, b * 4, 4)); };
        moved = qforge::ptq::learn_rotations_distilled(*m, 4, output, o).rotation_change;
      }
      e[rotated] = evaluate(m, ids, float_logp);
    }
    std::printf("%-14s %12.3f %10.3f %10.4f %14.3f %10.3f %10.4f", s.name, e[0].perplexity,
                e[0].perplexity - f.perplexity, e[0].kl, e[1].perplexity, e[1].perplexity - f.perplexity, e[1].kl);
    if (spin_steps > 0)
      std::printf(" %14.3f %10.3f %10.4f %8.3f", e[2].perplexity, e[2].perplexity - f.perplexity, e[2].kl, moved);
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}
