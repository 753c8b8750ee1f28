// The reference models as qbench and qbench_memory build them: BERT-base and GPT-2 small shapes
// without dropout, GPT-2 prepared for decoding frozen (model_gpt2_decode_*), and layers of
// Llama-3-8B's shape (model_llama8b_decode_*, qbench_memory's llama8b rows).
#pragma once

#include "framework/models/bert.h"
#include "framework/models/gpt2.h"
#include "framework/models/llama.h"
#include "framework/api/quantize.h"
#include "framework/nn/linear.h"

#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

namespace qforge::bench {

// The memcpy limit: `bytes` copied from src to dst, split over ATen's threads like the kernels,
// so it scales with the thread count as far as the memory system lets a copy scale.
inline void parallel_memcpy(char* dst, const char* src, int64_t bytes) {
  at::parallel_for(0, bytes, int64_t{1} << 22, [&](int64_t b, int64_t e) {
    std::memcpy(dst + b, src + b, static_cast<size_t>(e - b));
  });
}

// The last-level cache the OS reports (sysconf), or QFORGE_LLC_BYTES; 32 MiB when neither says.
inline int64_t llc_bytes() {
  if (const char* e = std::getenv("QFORGE_LLC_BYTES")) return std::atoll(e);
  const long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return v > 0 ? v : int64_t{32} << 20;
}

inline int64_t physical_memory_bytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
}

// The memory limit of work that reads `bytes` from DRAM per pass, `passes` times (a decoded token
// reading every weight once): each pass a parallel_memcpy of bytes / 2 (half read, half written),
// on a source/destination pair the passes just before it did not touch. The pairs rotate over a
// pool of at least 4x the last-level cache (at most an eighth of physical memory), so every pass
// meets DRAM as a model's weights do between tokens. One pair reused is not that: glibc copies
// large blocks with non-temporal stores, so the source stays in cache when it is near the cache's
// size (GPT-2 small's Q4 token, 74 MB: 32 passes took 49.5 ms on one pair, 62.6 ms rotating, one
// 32 MiB L3 per CCD; docs/performance.md "The memory limit, cold").
inline std::function<void()> cold_memcpy(int64_t bytes, int64_t passes) {
  const int64_t half = std::max<int64_t>(1, bytes / 2);
  const int64_t fit = std::max<int64_t>(1, physical_memory_bytes() / 8 / (2 * half));
  const int64_t pairs = std::clamp<int64_t>((4 * llc_bytes() + 2 * half - 1) / (2 * half), 1, fit);
  auto src = std::make_shared<std::vector<char>>(static_cast<size_t>(half * pairs), 1);
  auto dst = std::make_shared<std::vector<char>>(static_cast<size_t>(half * pairs), 0);
  auto next = std::make_shared<int64_t>(0);
  return [src, dst, next, half, pairs, passes] {
    for (int64_t p = 0; p < passes; ++p) {
      const int64_t i = (*next)++ % pairs;
      parallel_memcpy(dst->data() + i * half, src->data() + i * half, half);
    }
  };
}

// BERT-base: hidden 768, 12 heads, FFN 3072, `layers` layers, no dropout.
inline models::BertConfig bert_base(int64_t layers = 12) {
  models::BertConfig c;
  c.num_hidden_layers = layers;
  c.hidden_dropout_prob = 0;
  c.attention_probs_dropout_prob = 0;
  return c;
}

// GPT-2 small: 50257 tokens, 1024 positions, 768, 12 layers, 12 heads, no dropout.
inline models::Gpt2Config gpt2_small() {
  models::Gpt2Config c;
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0;
  return c;
}

// `layers` layers of Llama-3-8B's shape (hidden 4096, FFN 14336, 32 query / 8 key-value heads,
// head_dim 128, RoPE base 500000), a 256-token vocabulary so the layers, not the embedding and
// head (4 MB each in float), are the weights; untied head.
inline models::LlamaConfig llama_8b_layers(int64_t layers) {
  models::LlamaConfig c;
  c.vocab_size = 256, c.hidden_size = 4096, c.intermediate_size = 14336, c.num_hidden_layers = layers;
  c.num_attention_heads = 32, c.num_key_value_heads = 8, c.max_position_embeddings = 8192;
  c.rms_norm_eps = 1e-5, c.rope_theta = 500000.0, c.tie_word_embeddings = false;
  return c;
}

// The decode model of model_gpt2_decode_*: the LM head untied (same logits) and every Linear,
// head included, frozen weight-only under `scheme` (a QType: its default scheme, qint4 in groups
// of 128); both embeddings int8 per row (row gather; an int4 table would be dequantized whole per call).
// The blocks are frozen before the head is untied, so the untied float copy of the 50 257-row table
// exists beside frozen blocks, not beside their float weights (the same codes either way: each
// weight-only layer is quantized on its own).
inline void freeze_for_decode(models::Gpt2LMHeadModel& m, const Scheme& scheme) {
  LayerRule tables;
  tables.pattern = "transformer.w?e";
  tables.keep_float = true;
  Scheme blocks = scheme;
  blocks.rules.push_back(tables);
  quantize(*m, blocks);
  freeze(*m);
  m->untie_lm_head();
  LayerRule frozen_blocks;
  frozen_blocks.pattern = "transformer.h.*";
  frozen_blocks.keep_float = true;  // frozen already: left as they are
  LayerRule embeddings;
  embeddings.pattern = "transformer.w?e";
  embeddings.weights = qint8;
  embeddings.weight_granularity = Granularity::kPerChannel;
  Scheme rest = scheme;
  rest.rules.push_back(frozen_blocks);
  rest.rules.push_back(embeddings);
  quantize(*m, rest);
  freeze(*m);
}

// `run` with every Linear of `model` on `mode` decode activations (impl "qforge": kExact, impl
// "qforge-q8": kQ8Block32), back to exact afterwards: impls sharing one model each set their own.
inline std::function<void()> with_decode(std::shared_ptr<torch::nn::Module> model, DecodeActivations mode,
                                         std::function<void()> run) {
  // Restores exact activations even when `run` throws.
  struct ExactOnExit {
    torch::nn::Module& m;
    ~ExactOnExit() { nn::set_decode_activations(m, DecodeActivations::kExact); }
  };
  return [model, mode, run] {
    nn::set_decode_activations(*model, mode);
    const ExactOnExit restore{*model};
    run();
  };
}

}  // namespace qforge::bench
