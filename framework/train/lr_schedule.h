// Learning-rate schedule: linear warmup to the peak, then cosine decay to min_fraction * peak.
#pragma once

#include <cstdint>

namespace qforge::train {

struct CosineSchedule {
  double peak_lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_fraction = 0.0;

  // Learning rate for 0-based `step`: (step + 1) / warmup * peak during warmup, then
  // min + (peak - min) * (1 + cos(pi * progress)) / 2 with progress going 0 -> 1 at total_steps.
  double lr(int64_t step) const;
};

}  // namespace qforge::train
