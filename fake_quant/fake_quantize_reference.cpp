// Scalar reference fake-quant kernels: they define the results every fast kernel must reproduce.
#include "fake_quant/fake_quantize_kernels.h"

namespace qforge::fq {

void affine_run_reference(const float* x, float* y, bool* mask, int64_t n, const AffineGrid& g) {
  for (int64_t i = 0; i < n; ++i) y[i] = fake_quantize_value(x[i], g, mask ? mask + i : nullptr);
}

void affine_rows_reference(const float* x, float* y, bool* mask, int64_t rows, int64_t C,
                           const float* scale, const float* inv_scale, const float* zero_point,
                           float qmin, float qmax) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      const AffineGrid g{scale[c], inv_scale[c], zero_point[c], qmin, qmax};
      const int64_t i = r * C + c;
      y[i] = fake_quantize_value(x[i], g, mask ? mask + i : nullptr);
    }
  }
}

void mask_grad_reference(const float* dy, const bool* mask, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = mask[i] ? dy[i] : 0.0f;
}

// Mirrors PyTorch's fake_quantize_learnable_*_grad_kernel_cpu element by element, including
// rounding (z + x/s) in one step, which differs from the forward's rint(x/s) + z.
LsqSums lsq_run_reference(const float* x, const float* dy, float* dx, int64_t n, const LsqGrid& g) {
  const float dscale_small = g.quant_min - g.zero_point;
  const float dscale_big = g.quant_max - g.zero_point;
  LsqSums s;
  for (int64_t i = 0; i < n; ++i) {
    const float q = std::nearbyint(g.zero_point + x[i] * g.inv_scale);
    if (q < g.quant_min || q > g.quant_max) {
      dx[i] = 0.0f;
      s.dzero_point += dy[i] * -1.0f * g.scale * g.grad_factor;
      s.dscale += (dy[i] * (q < g.quant_min ? dscale_small : dscale_big)) * g.grad_factor;
    } else {
      dx[i] = dy[i];
      const float xfq = (q - g.zero_point) * g.scale;
      s.dscale += dy[i] * (xfq - x[i]) * g.inv_scale * g.grad_factor;
    }
  }
  return s;
}

void float8_run_reference(const float* x, float* y, bool* mask, int64_t n, float scale,
                          const Float8Format& f) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = fake_quantize_float8_value(x[i], scale, f, mask ? mask + i : nullptr);
}

const FakeQuantKernels& reference_kernels() {
  static const FakeQuantKernels k{"reference",         affine_run_reference, affine_run_reference,
                                  affine_rows_reference, mask_grad_reference,  mask_grad_reference,
                                  lsq_run_reference};
  return k;
}

}  // namespace qforge::fq
