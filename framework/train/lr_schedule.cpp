// Cosine schedule with warmup.
#include "framework/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace qforge::train {

double CosineSchedule::lr(int64_t step) const {
  if (step < warmup_steps) return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::clamp(static_cast<double>(step - warmup_steps) / decay_steps, 0.0, 1.0);
  const double min_lr = peak_lr * min_fraction;
  return min_lr + (peak_lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace qforge::train
