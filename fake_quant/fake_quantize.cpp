// Fake-quant forward/backward on qforge's kernels, and the autograd function (STE) around them.
#include "fake_quant/fake_quantize.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include "fake_quant/codebook.h"
#include "fake_quant/cuda/fake_quantize_op.h"
#include "fake_quant/fake_quantize_kernels.h"
#include "framework/core/error.h"

namespace qforge {
namespace {

// Elements per parallel task: large enough to amortise scheduling, small enough to balance.
constexpr int64_t kGrain = int64_t{1} << 15;
// Outputs at least this large are written with non-temporal stores: far beyond any per-core
// cache, so the consumer reads them from memory anyway and read-for-ownership is pure waste.
constexpr int64_t kStreamMinBytes = int64_t{16} << 20;

bool use_stream(int64_t numel) { return numel * static_cast<int64_t>(sizeof(float)) >= kStreamMinBytes; }

// x viewed as [outer, C, inner] where channel c uses grid c.
struct RunLayout {
  int64_t outer = 1, C = 1, inner = 1;
  std::vector<float> scale, inv_scale, zero_point;
};

RunLayout layout_for(const at::Tensor& x, const QParams& qp) {
  const QSpec& spec = qp.spec;
  const std::vector<int64_t> want = qparams_shape(spec, x.sizes());
  QF_REQUIRE(qp.scale.defined() && qp.zero_point.defined(), "fake_quantize: QParams are empty");
  QF_REQUIRE(qp.scale.sizes() == at::IntArrayRef(want) && qp.zero_point.sizes() == qp.scale.sizes(),
             "fake_quantize: ", to_string(spec.granularity), " qparams for input shape ", x.sizes(),
             " must have shape ", at::IntArrayRef(want), ", got scale ", qp.scale.sizes(),
             " and zero_point ", qp.zero_point.sizes());
  RunLayout L;
  const int64_t n = x.numel();
  switch (spec.granularity) {
    case Granularity::kPerTensor: L.inner = n; break;
    case Granularity::kPerChannel: {
      const int64_t axis = spec.axis < 0 ? spec.axis + x.dim() : spec.axis;
      L.C = x.size(axis);
      for (int64_t d = 0; d < axis; ++d) L.outer *= x.size(d);
      for (int64_t d = axis + 1; d < x.dim(); ++d) L.inner *= x.size(d);
      break;
    }
    case Granularity::kPerGroup:
      L.inner = spec.group_size;
      L.C = n / spec.group_size;
      break;
  }
  // The grids are read on the host (validated here for every device).
  const at::Tensor s = qp.scale.to(at::kCPU, at::kFloat).contiguous().flatten();
  const at::Tensor z = qp.zero_point.to(at::kCPU, at::kFloat).contiguous().flatten();
  L.scale.assign(s.data_ptr<float>(), s.data_ptr<float>() + s.numel());
  L.zero_point.assign(z.data_ptr<float>(), z.data_ptr<float>() + z.numel());
  L.inv_scale.resize(L.scale.size());
  for (size_t c = 0; c < L.scale.size(); ++c) {
    QF_REQUIRE(L.scale[c] > 0.0f && std::isfinite(L.scale[c]), "fake_quantize: scale[", c, "] = ",
               L.scale[c], " is not a finite positive number");
    L.inv_scale[c] = 1.0f / L.scale[c];
  }
  return L;
}

// Runs `segment(begin, end, channel)` over every contiguous single-channel run, in parallel.
template <class Segment>
void for_each_run(const RunLayout& L, Segment&& segment) {
  const int64_t total = L.outer * L.C * L.inner;
  at::parallel_for(0, total, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e;) {
      const int64_t row = i / L.inner;
      const int64_t end = std::min(e, (row + 1) * L.inner);
      segment(i, end, row % L.C);
      i = end;
    }
  });
}

void run_forward(const float* x, float* y, bool* mask, const RunLayout& L, const QSpec& spec) {
  if (spec.qtype.is_float()) {
    const fq::Float8Format& f = spec.qtype == qfloat8_e5m2 ? fq::kE5M2 : fq::kE4M3;
    for_each_run(L, [&](int64_t b, int64_t e, int64_t c) {
      fq::float8_run_reference(x + b, y + b, mask ? mask + b : nullptr, e - b, L.scale[c], f);
    });
    return;
  }
  if (spec.qtype.is_microscaling()) {
    for_each_run(L, [&](int64_t b, int64_t e, int64_t c) {
      fq::e2m1_run_reference(x + b, y + b, mask ? mask + b : nullptr, e - b, L.scale[c]);
    });
    return;
  }
  const auto& k = fq::active_kernels();
  const float qmin = static_cast<float>(spec.quant_min()), qmax = static_cast<float>(spec.quant_max());
  if (L.inner == 1 && L.C > 1) {  // channels last: vectorise across channels instead
    at::parallel_for(0, L.outer, std::max<int64_t>(1, kGrain / L.C), [&](int64_t b, int64_t e) {
      k.affine_rows(x + b * L.C, y + b * L.C, mask ? mask + b * L.C : nullptr, e - b, L.C,
                    L.scale.data(), L.inv_scale.data(), L.zero_point.data(), qmin, qmax);
    });
    return;
  }
  const fq::AffineRunFn run = use_stream(L.outer * L.C * L.inner) ? k.affine_run_stream : k.affine_run;
  for_each_run(L, [&](int64_t b, int64_t e, int64_t c) {
    run(x + b, y + b, mask ? mask + b : nullptr, e - b,
                 fq::AffineGrid{L.scale[c], L.inv_scale[c], L.zero_point[c], qmin, qmax});
  });
}

void check_input(const at::Tensor& x) {
  QF_REQUIRE(x.defined(), "fake_quantize: input is undefined");
  QF_REQUIRE(x.is_floating_point(), "fake_quantize: input must be a floating tensor, got ",
             x.scalar_type());
  QF_REQUIRE(x.is_cpu() || x.is_cuda(), "fake_quantize: kernels exist for CPU and CUDA tensors, got one on ",
             x.device());
}

// The CUDA override's description of the same call (fake_quant/cuda/fake_quantize_op.h).
fq::DeviceFakeQuant device_call(const RunLayout& L, const QSpec& spec) {
  fq::DeviceFakeQuant op;
  op.C = L.C;
  op.inner = L.inner;
  op.scale = L.scale;
  op.zero_point = L.zero_point;
  op.quant_min = static_cast<float>(spec.quant_min());
  op.quant_max = static_cast<float>(spec.quant_max());
  if (spec.qtype.is_float()) op.float8 = spec.qtype == qfloat8_e5m2 ? &fq::kE5M2 : &fq::kE4M3;
  return op;
}

std::tuple<at::Tensor, at::Tensor> forward_impl(const at::Tensor& x_in, const QParams& qp, bool want_mask) {
  check_input(x_in);
  if (qp.spec.qtype.is_codebook()) {
    // Every value has a nearest level: the straight-through mask is all true.
    const at::Tensor x = x_in.detach();
    at::Tensor y = fake_quantize_codebook(x, qp).to(x.dtype());
    return {y, want_mask ? at::ones(x.sizes(), x.options().dtype(at::kBool)) : at::Tensor()};
  }
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  const RunLayout L = layout_for(x, qp);
  QF_REQUIRE(!(x.is_cuda() && qp.spec.qtype.is_microscaling()), "fake_quantize: ", qp.spec.qtype.name,
             " fake-quant runs on the CPU only (no CUDA kernel for microscaling qtypes)");
  if (x.is_cuda()) return fq::cuda_fake_quantize(x, device_call(L, qp.spec), want_mask);
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor mask = want_mask ? at::empty(x.sizes(), x.options().dtype(at::kBool)) : at::Tensor();
  if (x.numel() > 0)
    run_forward(x.data_ptr<float>(), y.data_ptr<float>(), want_mask ? mask.data_ptr<bool>() : nullptr,
                L, qp.spec);
  return {y, mask};
}

struct FakeQuantizeFunction : public torch::autograd::Function<FakeQuantizeFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const QParams& qp) {
    auto [y, mask] = forward_impl(x, qp, /*want_mask=*/true);
    ctx->save_for_backward({mask});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor mask = ctx->get_saved_variables()[0];
    return {fake_quantize_backward(grads[0], mask), at::Tensor()};
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor> fake_quantize_cachemask(const at::Tensor& x, const QParams& qp) {
  return forward_impl(x, qp, /*want_mask=*/true);
}

at::Tensor fake_quantize_forward(const at::Tensor& x, const QParams& qp) {
  return std::get<0>(forward_impl(x, qp, /*want_mask=*/false));
}

at::Tensor fake_quantize_backward(const at::Tensor& dy_in, const at::Tensor& mask) {
  QF_REQUIRE(dy_in.sizes() == mask.sizes(), "fake_quantize_backward: gradient shape ", dy_in.sizes(),
             " differs from mask shape ", mask.sizes());
  const at::Tensor dy = dy_in.to(at::kFloat).contiguous();
  const at::Tensor m = mask.to(at::kBool).contiguous();
  QF_REQUIRE(m.device() == dy.device(), "fake_quantize_backward: gradient on ", dy.device(), " but mask on ",
             m.device());
  if (dy.is_cuda()) return fq::cuda_mask_grad(dy, m);
  at::Tensor dx = at::empty_like(dy, at::MemoryFormat::Contiguous);
  const auto& k = fq::active_kernels();
  const float* pdy = dy.data_ptr<float>();
  const bool* pm = m.data_ptr<bool>();
  float* pdx = dx.data_ptr<float>();
  const fq::MaskGradFn grad = use_stream(dy.numel()) ? k.mask_grad_stream : k.mask_grad;
  at::parallel_for(0, dy.numel(), kGrain, [&](int64_t b, int64_t e) {
    grad(pdy + b, pm + b, pdx + b, e - b);
  });
  return dx;
}

at::Tensor fake_quantize(const at::Tensor& x, const QParams& qp) {
  check_input(x);
  // Codebooks: ATen ops, differentiable in x (straight-through) and in a trainable codebook.
  if (qp.spec.qtype.is_codebook()) return fake_quantize_codebook(x, qp);
  if (x.scalar_type() != at::kFloat) return fake_quantize(x.to(at::kFloat), qp).to(x.scalar_type());
  if (!(at::GradMode::is_enabled() && x.requires_grad())) return fake_quantize_forward(x, qp);
  return FakeQuantizeFunction::apply(x, qp);
}

at::Tensor fake_quantize_per_tensor_affine(const at::Tensor& x, double scale, int64_t zero_point,
                                           int64_t quant_min, int64_t quant_max) {
  QF_REQUIRE(quant_min < quant_max, "fake_quantize_per_tensor_affine: quant_min ", quant_min,
             " must be below quant_max ", quant_max);
  QF_REQUIRE(zero_point >= quant_min && zero_point <= quant_max, "fake_quantize_per_tensor_affine: zero_point ",
             zero_point, " outside [", quant_min, ", ", quant_max, "]");
  QParams qp;
  qp.spec = QSpec{};
  qp.spec.qtype = QType{"custom", 0, quant_min < 0, QKind::kInteger, quant_min, quant_max, 0, 0, 0, 0.0};
  qp.scale = at::full({}, static_cast<float>(scale), at::kFloat);
  qp.zero_point = at::full({}, zero_point, at::kInt);
  return fake_quantize(x, qp);
}

at::Tensor fake_quantize_per_channel_affine(const at::Tensor& x, const at::Tensor& scale,
                                            const at::Tensor& zero_point, int64_t axis,
                                            int64_t quant_min, int64_t quant_max) {
  QF_REQUIRE(quant_min < quant_max, "fake_quantize_per_channel_affine: quant_min ", quant_min,
             " must be below quant_max ", quant_max);
  QF_REQUIRE(scale.dim() == 1, "fake_quantize_per_channel_affine: scale must be 1-D, got ", scale.sizes());
  QParams qp;
  qp.spec.qtype = QType{"custom", 0, quant_min < 0, QKind::kInteger, quant_min, quant_max, 0, 0, 0, 0.0};
  qp.spec.granularity = Granularity::kPerChannel;
  qp.spec.axis = axis;
  qp.scale = scale;
  qp.zero_point = zero_point;
  return fake_quantize(x, qp);
}

const char* fake_quantize_isa() { return fq::active_kernels().isa; }

}  // namespace qforge
