// MinMaxObserver: the running minimum and maximum of everything seen, as PyTorch's
// torch.ao.quantization.MinMaxObserver. The simplest per-tensor observer; merge is exact.
#pragma once

#include "observers/observer.h"

namespace qforge {

class MinMaxObserver : public Observer {
 public:
  MinMaxObserver();

  std::pair<at::Tensor, at::Tensor> range(const QSpec& spec) const override;
  std::string kind() const override { return "minmax"; }
  std::unique_ptr<Observer> clone() const override;

  // Running min / max (0-dim float32; +inf / -inf before any finite value).
  const at::Tensor& min_val() const { return min_val_; }
  const at::Tensor& max_val() const { return max_val_; }

 protected:
  int64_t observe(const at::Tensor& x) override;
  void merge_from(const Observer& other) override;
  std::map<std::string, at::Tensor> kind_state() const override;
  void load_kind_state(const std::map<std::string, at::Tensor>& state) override;
  void reset_kind() override;

  at::Tensor min_val_;
  at::Tensor max_val_;
};

namespace detail {
// Validates a per-tensor "min"/"max" pair from a state map: 0-dim float32, min <= max or the
// (+inf, -inf) "nothing seen" pair. Shared by the per-tensor kinds.
void require_scalar_min_max(const std::map<std::string, at::Tensor>& state, const std::string& who);
}  // namespace detail

}  // namespace qforge
