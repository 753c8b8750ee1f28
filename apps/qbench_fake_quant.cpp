// qbench cases for fake quantisation (16M floats): forward, per-channel forward, forward+backward
// and LSQ forward+backward, qforge vs the ATen op; plus the memcpy limit.
#include <ATen/ATen.h>

#include <cstring>

#include "apps/qbench_registry.h"
#include "fake_quant/fake_quantize.h"
#include "fake_quant/lsq.h"

namespace qforge::bench {
namespace {

constexpr int64_t kRows = 4096;           // per-channel: [4096, 4096], axis 0

const at::Tensor& input() {
  static const at::Tensor x = at::randn({kStreamElements}) * 2.0;
  return x;
}

QParams per_tensor() {
  QSpec s;
  return make_qparams(s, at::full({}, 0.02f), at::full({}, 3, at::kInt));
}

const Register kMemcpy(0, "memcpy", [] {
  auto src = std::make_shared<std::vector<char>>(kStreamElements * 4, 1);
  auto dst = std::make_shared<std::vector<char>>(kStreamElements * 4, 0);
  return std::vector<Case>{{"64MiB", 2.0 * kStreamElements * 4, {{"limit", [src, dst] {
                                                      std::memcpy(dst->data(), src->data(), src->size());
                                                    }}}}};
});

const Register kForward(10, "fake_quant_per_tensor_fwd", [] {
  const at::Tensor x = input();
  const QParams qp = per_tensor();
  return std::vector<Case>{{"16M", 2.0 * kStreamElements * 4,
                            {{"libtorch", [x] { at::fake_quantize_per_tensor_affine(x, 0.02, 3, -128, 127); }},
                             {"qforge", [x, qp] { fake_quantize_forward(x, qp); }}}}};
});

const Register kPerChannel(11, "fake_quant_per_channel_fwd", [] {
  const at::Tensor x = input().reshape({kRows, kStreamElements / kRows});
  const at::Tensor scale = at::rand({kRows}) * 0.02 + 0.01;
  const at::Tensor zp = at::randint(-10, 10, {kRows}, at::kInt);
  QSpec s;
  s.granularity = Granularity::kPerChannel;
  const QParams qp = make_qparams(s, scale, zp);
  return std::vector<Case>{{"4096x4096/axis0", 2.0 * kStreamElements * 4,
                            {{"libtorch", [=] { at::fake_quantize_per_channel_affine(x, scale, zp, 0, -128, 127); }},
                             {"qforge", [=] { fake_quantize_forward(x, qp); }}}}};
});

// Autograd forward + backward with x requiring grad, the QAT training step's cost.
const Register kForwardBackward(12, "fake_quant_per_tensor_fwd_bwd", [] {
  const at::Tensor x0 = input();
  const at::Tensor dy = at::randn({kStreamElements});
  const QParams qp = per_tensor();
  // x, dy read; y, dx written (the mask traffic is each implementation's own business).
  return std::vector<Case>{{"16M", 4.0 * kStreamElements * 4,
                            {{"libtorch", [=] {
                                at::Tensor x = x0.detach().set_requires_grad(true);
                                at::fake_quantize_per_tensor_affine(x, 0.02, 3, -128, 127).backward(dy);
                              }},
                             {"qforge", [=] {
                                at::Tensor x = x0.detach().set_requires_grad(true);
                                fake_quantize(x, qp).backward(dy);
                              }}}}};
});

const Register kLsq(13, "lsq_per_tensor_fwd_bwd", [] {
  const at::Tensor x0 = input();
  const at::Tensor dy = at::randn({kStreamElements});
  const double gf = lsq_grad_factor(kStreamElements, 127);
  return std::vector<Case>{{"16M", 4.0 * kStreamElements * 4,
                            {{"libtorch", [=] {
                                at::Tensor x = x0.detach().set_requires_grad(true);
                                at::Tensor s = at::full({1}, 0.02f).set_requires_grad(true);
                                at::Tensor z = at::full({1}, 3.0f).set_requires_grad(true);
                                at::_fake_quantize_learnable_per_tensor_affine(x, s, z, -128, 127, gf).backward(dy);
                              }},
                             {"qforge", [=] {
                                at::Tensor x = x0.detach().set_requires_grad(true);
                                at::Tensor s = at::full({1}, 0.02f).set_requires_grad(true);
                                at::Tensor z = at::full({1}, 3.0f).set_requires_grad(true);
                                fake_quantize_learnable_per_tensor_affine(x, s, z, -128, 127, gf).backward(dy);
                              }}}}};
});

}  // namespace
}  // namespace qforge::bench
