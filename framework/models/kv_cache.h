// Keys and values of the positions a decoder has already seen, one pair per layer, for
// token-by-token decoding (GPT-2, Llama): each forward with a cache attends to the cached positions
// plus its own, then appends its keys and values. Tensors are [B, kv_heads, T_past, head_dim].
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace qforge::models {

struct KvCache {
  std::vector<at::Tensor> keys, values;
  int64_t length() const { return keys.empty() || !keys[0].defined() ? 0 : keys[0].size(2); }
  void clear() { keys.clear(), values.clear(); }
  // Bytes held by the cached keys and values.
  int64_t bytes() const {
    int64_t n = 0;
    for (const auto* side : {&keys, &values})
      for (const at::Tensor& t : *side)
        if (t.defined()) n += t.numel() * static_cast<int64_t>(t.element_size());
    return n;
  }
};

}  // namespace qforge::models
